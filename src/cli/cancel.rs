//! `outboxd cancel`: withdraw one message by id or key, or pending messages by filter
//! (counted, and cancelled only with `--yes`), directly in the database, each change audited
//! like the API's.

use crate::store::admin::Operator;
use chrono::{DateTime, Utc};
use clap::Args;

use super::{Output, cli_actor, with_database};
use crate::config::DatabaseArgs;
use crate::message::{FilterRequest, PendingFilter};
use crate::store::Store;
use crate::store::cancel::{self, CancelTarget};

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The message's id.
    #[arg(long, conflicts_with_all = ["key", "kind", "tag", "created_before", "created_after", "recipient_domain"])]
    pub id: Option<i64>,
    /// The message's idempotency key, as its producer gave it.
    #[arg(long, conflicts_with_all = ["kind", "tag", "created_before", "created_after", "recipient_domain"])]
    pub key: Option<String>,
    /// Pending messages of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Pending messages with this tag.
    #[arg(long)]
    pub tag: Option<String>,
    /// Pending messages created before this time (RFC 3339).
    #[arg(long)]
    pub created_before: Option<DateTime<Utc>>,
    /// Pending messages created at or after this time (RFC 3339).
    #[arg(long)]
    pub created_after: Option<DateTime<Utc>>,
    /// Pending messages with a recipient at this domain.
    #[arg(long)]
    pub recipient_domain: Option<String>,
    /// Cancel what the filter matches; without it, only count.
    #[arg(long)]
    pub yes: bool,
}

/// What the command is asked to do, checked before anything connects.
enum Cancel {
    One(CancelTarget),
    Count(PendingFilter),
    Pending(PendingFilter),
}

/// Checks the arguments: one message, or a filter of at least one criterion.
fn checked(args: &CancelArgs) -> anyhow::Result<Cancel> {
    if let Some(id) = args.id {
        return Ok(Cancel::One(CancelTarget::Id(id)));
    }
    if let Some(key) = &args.key {
        if key.is_empty() || key.chars().count() > outboxd_producer::MAX_IDEMPOTENCY_KEY_CHARS {
            anyhow::bail!(
                "--key must be 1 to {} characters",
                outboxd_producer::MAX_IDEMPOTENCY_KEY_CHARS
            );
        }
        return Ok(Cancel::One(CancelTarget::Key(key.clone())));
    }
    let filter = PendingFilter::try_from(FilterRequest {
        kind: args.kind.clone(),
        tag: args.tag.clone(),
        created_before: args.created_before,
        created_after: args.created_after,
        recipient_domain: args.recipient_domain.clone(),
    })
    .map_err(|e| anyhow::anyhow!("{e} (or give --id or --key)"))?;
    Ok(if args.yes {
        Cancel::Pending(filter)
    } else {
        Cancel::Count(filter)
    })
}

/// Checks the arguments, then withdraws or counts in the database they name.
pub(super) async fn command(args: CancelArgs) -> anyhow::Result<()> {
    let cancel = checked(&args)?;
    with_database(&args.database, Output::ForPeople, async |pool| {
        run(pool, cancel, &cli_actor()).await
    })
    .await
}

async fn run(pool: &Store, cancel: Cancel, actor: &Operator) -> anyhow::Result<()> {
    match cancel {
        Cancel::One(target) => {
            let answer = cancel::cancel(pool, &target, actor).await?;
            outln!("{}", answer.as_str())?;
        }
        Cancel::Count(filter) => {
            let count = cancel::count_pending(pool, &filter).await?;
            outln!(
                "{} pending messages match ({} held by a replica now); run again with --yes to cancel them",
                count.matching,
                count.in_flight
            )?;
        }
        Cancel::Pending(filter) => {
            let done = cancel::cancel_pending(pool, &filter, actor).await?;
            outln!(
                "cancelled {}; {} held by a replica were marked, and end unsent unless that send succeeds",
                done.cancelled,
                done.in_flight
            )?;
        }
    }
    Ok(())
}
