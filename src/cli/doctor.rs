//! `outboxd doctor`: one line per check of a deployment, each `ok`, `warn` or `fail`, and
//! a failure exit when any check fails. It reads `run`'s options and changes nothing.

use std::time::Duration;

use clap::Args;

use crate::config::RunArgs;
use crate::doctor::{self, Verdict};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// A transaction open in the database this long is named: it keeps vacuum from
    /// removing what was sent.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub long_transaction: Duration,
}

pub async fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let config = args.run.validate()?;
    let found = doctor::examine(&config, args.long_transaction).await;
    for finding in &found {
        outln!("{finding}")?;
    }
    let failed: Vec<&str> = found
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .map(|f| f.check)
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} of {} checks failed: {}",
        failed.len(),
        found.len(),
        failed.join(", ")
    )
}
