//! `outboxd pause`, `outboxd resume` and `outboxd pauses`: paused kinds, directly in the
//! database, each change audited like the API's.

use crate::store::admin::Operator;
use clap::Args;

use crate::config::DatabaseArgs;
use crate::message::{Kind, NewPause};
use crate::store::pauses;
use crate::text::printable;

#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The kind to hold: its messages stay pending, unclaimed by every replica, until resumed.
    #[arg(long)]
    pub kind: String,
    /// Why, for whoever resumes it (kept with the pause and in the audit log).
    #[arg(long)]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The kind to send again.
    #[arg(long)]
    pub kind: String,
}

#[derive(Debug, Args)]
pub struct PausesArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Checks a pause before anything connects: a bad kind or reason is refused in one line.
pub fn checked_pause(args: &PauseArgs) -> anyhow::Result<NewPause> {
    NewPause::new(&args.kind, &args.reason).map_err(anyhow::Error::msg)
}

pub async fn pause(pool: &crate::store::Store, new: &NewPause, actor: &Operator) -> anyhow::Result<()> {
    let pause = pauses::pause(pool, &new.kind, &new.reason, actor).await?;
    outln!(
        "paused {} (since {}): {}",
        pause.kind,
        pause.paused_at.to_rfc3339(),
        printable(&pause.reason)
    )?;
    Ok(())
}

pub fn checked_resume(args: &ResumeArgs) -> anyhow::Result<Kind> {
    Kind::parse(&args.kind).map_err(anyhow::Error::from)
}

pub async fn resume(pool: &crate::store::Store, kind: &Kind, actor: &Operator) -> anyhow::Result<()> {
    if !pauses::resume(pool, kind, actor).await? {
        anyhow::bail!("{kind} is not paused");
    }
    outln!("resumed {kind}")?;
    Ok(())
}

pub async fn list(pool: &crate::store::Store, json: bool) -> anyhow::Result<()> {
    let pauses = pauses::list(pool).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&pauses)?)?;
    } else if pauses.is_empty() {
        outln!("no kind is paused")?;
    } else {
        for pause in pauses {
            outln!(
                "{}\tsince {}\tby {}\t{}",
                printable(&pause.kind),
                pause.paused_at.to_rfc3339(),
                printable(&pause.paused_by),
                printable(&pause.reason)
            )?;
        }
    }
    Ok(())
}
