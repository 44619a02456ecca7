//! `outboxd suppressions list|add|remove`: the suppression list, directly in the database,
//! each change audited like the API's.

use crate::store::admin::Operator;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::config::DatabaseArgs;
use crate::store::suppressions;
use crate::suppression::{AddRequest, Address, Scope, SuppressionReason};
use crate::text::printable;

#[derive(Debug, Args)]
pub struct SuppressionsArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(subcommand)]
    pub command: SuppressionsCommand,
}

impl SuppressionsArgs {
    /// Whether the output is JSON, for a script.
    pub fn json(&self) -> bool {
        matches!(self.command, SuppressionsCommand::List { json: true, .. })
    }
}

#[derive(Debug, Subcommand)]
pub enum SuppressionsCommand {
    /// Suppressed addresses, in address order.
    List {
        /// Only addresses containing this text.
        #[arg(long)]
        search: Option<String>,
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=crate::store::MAX_PAGE))]
        limit: i64,
        /// After this address (the last one of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Stop mailing an address.
    Add {
        address: String,
        /// hard_bounce, complaint, manual or unsubscribe.
        #[arg(long, default_value = "manual")]
        reason: SuppressionReason,
        /// The kinds it stops: all, or one lane's (bulk or transactional).
        #[arg(long, default_value = "all")]
        scope: Scope,
        /// A note kept with the entry.
        #[arg(long)]
        detail: Option<String>,
        /// Suppressed until then (RFC 3339); for good without it.
        #[arg(long)]
        until: Option<DateTime<Utc>>,
    },
    /// Mail an address again: every entry of it, or the one of `--scope`.
    Remove {
        address: String,
        /// Only the entry of this scope (all, bulk or transactional).
        #[arg(long)]
        scope: Option<Scope>,
    },
}

pub async fn run(
    pool: &crate::store::Store,
    command: SuppressionsCommand,
    actor: &Operator,
) -> anyhow::Result<()> {
    match command {
        SuppressionsCommand::List {
            search,
            limit,
            after,
            json,
        } => {
            let page = suppressions::list(pool, search.as_deref(), after.as_deref(), limit).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&page)?)?;
            } else {
                out!("{}", crate::report::suppression_table(&page))?;
            }
        }
        SuppressionsCommand::Add {
            address,
            reason,
            scope,
            detail,
            until,
        } => {
            let request = AddRequest {
                address,
                reason: Some(reason),
                scope: Some(scope),
                detail,
                until,
            };
            let entry = request.entry(Utc::now()).map_err(anyhow::Error::msg)?;
            suppressions::add(pool, &entry, actor).await?;
            let scope = match entry.scope {
                Scope::All => String::new(),
                Scope::Lane(lane) => format!(", {} only", lane.as_str()),
            };
            outln!(
                "suppressed {} ({}{scope})",
                printable(entry.address.as_str()),
                entry.reason,
            )?;
        }
        SuppressionsCommand::Remove { address, scope } => {
            let address = Address::parse(&address).map_err(anyhow::Error::msg)?;
            if !suppressions::remove(pool, &address, scope, actor).await? {
                anyhow::bail!("{} is not suppressed", printable(address.as_str()));
            }
            outln!("removed {}", printable(address.as_str()))?;
        }
    }
    Ok(())
}
