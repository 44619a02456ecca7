//! `outboxd dead-letters`: list, show, retry and discard, each change audited as the
//! command line's actor.

use crate::message::Tag;
use clap::{Args, Subcommand};

use super::{Output, cli_actor, with_database};
use crate::config::DatabaseArgs;
use crate::store::admin::{self, Action, Selection};

#[derive(Debug, Args)]
pub struct DeadLettersArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(subcommand)]
    pub command: DeadLettersCommand,
}

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Dead letters, newest first.
    List {
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Only those a producer tagged so.
        #[arg(long, value_parser = parse_tag)]
        tag: Option<Tag>,
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=crate::store::MAX_PAGE))]
        limit: i64,
        /// Older than this id (the last id of the previous page).
        #[arg(long)]
        after: Option<i64>,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One message with its payload, as JSON.
    Show { id: i64 },
    /// Back to pending with attempts reset, due now.
    Retry(SelectionArgs),
    /// Keep the rows but mark them discarded: out of the dead-letter view and gauge.
    Discard(SelectionArgs),
}

/// Which dead letters: ids, or --kind, or --group, or --all.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["ids", "all", "kind", "group"])))]
pub struct SelectionArgs {
    /// Message ids.
    pub ids: Vec<i64>,
    /// Every dead letter.
    #[arg(long)]
    pub all: bool,
    /// Every dead letter of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Every dead letter of a group, as KIND/ERROR_CLASS (see `outboxd dead-letters list`).
    #[arg(long, value_name = "KIND/ERROR_CLASS")]
    pub group: Option<String>,
}

impl SelectionArgs {
    fn selection(self) -> anyhow::Result<Selection> {
        Ok(if self.all {
            Selection::All
        } else if let Some(kind) = self.kind {
            Selection::Kind(kind)
        } else if let Some(group) = self.group {
            let Some((kind, error_class)) = group.split_once('/') else {
                anyhow::bail!("--group must be KIND/ERROR_CLASS, e.g. invoice_notice/smtp_550");
            };
            Selection::Group {
                kind: kind.to_owned(),
                error_class: error_class.to_owned(),
            }
        } else {
            Selection::Ids(self.ids)
        })
    }
}

pub(super) async fn command(args: DeadLettersArgs) -> anyhow::Result<()> {
    let output = match &args.command {
        DeadLettersCommand::List { json, .. } => Output::unless_json(*json),
        DeadLettersCommand::Show { .. } => Output::ForScripts,
        _ => Output::ForPeople,
    };
    let command = args.command;
    with_database(&args.database, output, async |pool| {
        dead_letters(pool, command).await
    })
    .await
}

async fn dead_letters(
    pool: &crate::store::Store,
    command: DeadLettersCommand,
) -> anyhow::Result<()> {
    match command {
        DeadLettersCommand::List {
            kind,
            tag,
            limit,
            after,
            json,
        } => {
            let page = admin::list_dead_letters(pool, kind.as_deref(), tag.as_ref(), after, limit).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&page)?)?;
            } else {
                out!("{}", crate::report::dead_letter_table(&page, limit))?;
            }
        }
        DeadLettersCommand::Show { id } => match admin::message(pool, id).await? {
            Some(message) => outln!("{}", serde_json::to_string_pretty(&message)?)?,
            None => anyhow::bail!("no message {id}"),
        },
        DeadLettersCommand::Retry(selection) => {
            apply(pool, Action::Retry, selection.selection()?).await?;
        }
        DeadLettersCommand::Discard(selection) => {
            apply(pool, Action::Discard, selection.selection()?).await?;
        }
    }
    Ok(())
}

async fn apply(
    pool: &crate::store::Store,
    action: Action,
    selection: Selection,
) -> anyhow::Result<()> {
    let changed = if let Selection::Ids(ids) = &selection
        && let [id] = ids.as_slice()
    {
        admin::apply_one(pool, action, *id, &cli_actor()).await?;
        outln!("{} message {id}", action.past_tense())?;
        vec![*id]
    } else {
        let applied = admin::apply(pool, action, &selection, &cli_actor()).await?;
        outln!(
            "{} {} dead letters ({selection})",
            action.past_tense(),
            applied.changed.len()
        )?;
        if !applied.not_retryable.is_empty() {
            eprintln!(
                "warning: {} dead letters were not retried (ids {:?}): their secret fields were scrubbed when they ended; their application must enqueue them anew",
                applied.not_retryable.len(),
                applied.not_retryable
            );
        }
        applied.changed
    };
    // The action is done: what it left undone is told if it can be read, and never fails it.
    match admin::left_undone(pool, action, &changed).await {
        Ok(undone) => {
            for undone in undone {
                eprintln!("warning: {}", undone.warning());
            }
        }
        Err(e) => eprintln!("warning: could not check the retried messages' recipients: {e}"),
    }
    Ok(())
}

/// A tag as a producer gives it, or why it is not one.
pub(super) fn parse_tag(text: &str) -> Result<Tag, String> {
    Tag::parse(text).map_err(|e| e.to_string())
}
