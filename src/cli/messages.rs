//! `outboxd messages --recipient ADDRESS`, `--tag TAG` and `--id N`: what was sent to an
//! address or under a tag, and each message's timeline, as the API's `GET /api/v1/messages`
//! gives them.

use crate::store::admin::Operator;
use clap::Args;

use crate::message::Tag;
use crate::store::messages::{self, Search};
use crate::suppression::lookup_forms;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["recipient", "tag", "id"])))]
pub struct MessagesArgs {
    #[command(flatten)]
    pub database: crate::config::DatabaseArgs,
    /// The address whose messages to list, newest first (any case matches).
    #[arg(long)]
    pub recipient: Option<String>,
    /// The messages a producer tagged so, newest first.
    #[arg(long, value_parser = super::dead_letters::parse_tag)]
    pub tag: Option<Tag>,
    /// One message, by its id.
    #[arg(long)]
    pub id: Option<i64>,
    /// How many messages (1 to 500).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=crate::store::MAX_PAGE))]
    pub limit: i64,
    /// Older than this id (the last id of the previous page).
    #[arg(long)]
    pub after: Option<i64>,
    /// JSON for scripts instead of the timelines as text.
    #[arg(long)]
    pub json: bool,
}

/// What to look up, checked before anything connects: a bad address is refused in one line.
pub enum Lookup {
    Search(Search),
    Id(i64),
}

pub fn checked(args: &MessagesArgs) -> anyhow::Result<Lookup> {
    if let Some(tag) = &args.tag {
        return Ok(Lookup::Search(Search::Tag(tag.clone())));
    }
    match (&args.recipient, args.id) {
        (Some(address), _) => Ok(Lookup::Search(Search::Recipient(
            lookup_forms(address).map_err(anyhow::Error::msg)?,
        ))),
        (None, Some(id)) if id > 0 => Ok(Lookup::Id(id)),
        (None, Some(id)) => anyhow::bail!("{id} is not a message id"),
        (None, None) => anyhow::bail!("give --recipient, --tag or --id"),
    }
}

pub async fn run(
    pool: &crate::store::Store,
    lookup: Lookup,
    args: &MessagesArgs,
    actor: &Operator,
) -> anyhow::Result<()> {
    let (found, pending_searched_all) = match lookup {
        Lookup::Search(search) => {
            let page = messages::find(pool, &search, args.after, args.limit, actor).await?;
            (page.messages, page.pending_searched_all)
        }
        Lookup::Id(id) => match messages::message(pool, id).await? {
            Some(message) => (vec![message], true),
            None => anyhow::bail!("no message {id}"),
        },
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&found)?)?;
    } else if found.is_empty() {
        outln!("no message found")?;
    } else {
        let pauses = crate::store::pauses::list(pool).await?;
        let circuits = crate::store::circuits::open(pool).await?;
        for message in &found {
            out!("{}", crate::report::timeline(message))?;
            let now = chrono::Utc::now();
            if let Some(waiting) = crate::report::waiting(message, &pauses, &circuits, now) {
                outln!("{}", crate::text::printable(&waiting))?;
            }
        }
    }
    if !pending_searched_all {
        eprintln!(
            "note: only the first {0} pending messages due and the newest {0} were searched; one in the middle of the backlog is not listed",
            messages::PENDING_SCAN_ROWS
        );
    }
    Ok(())
}
