//! The command line: subcommands, and the one place where errors become exit codes.

use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::config::{DatabaseArgs, LogFormat, RunArgs};
use crate::message::NewMessage;
use crate::{app, store, telemetry};

/// outboxd delivers the emails your application commits to its outbox table.
#[derive(Debug, Parser)]
#[command(name = "outboxd", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "OUTBOXD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if it does not exist, and apply the schema.
    Migrate(DatabaseArgs),
    /// Deliver outbox messages until SIGTERM or Ctrl-C.
    Run(Box<RunArgs>),
    /// Insert one message into the outbox, as a producer would; prints its id.
    Enqueue(EnqueueArgs),
    /// Migrate, enqueue one sample email of each built-in kind, and run (logging them when no SMTP is set).
    Demo(Box<RunArgs>),
}

/// Options of `outboxd enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The kind of email, e.g. account_verification.
    #[arg(long)]
    pub kind: String,
    /// The template variables, a JSON object, e.g. '{"to": "a@example.com", ...}'.
    #[arg(long)]
    pub payload: String,
    /// Do not send before this time (RFC 3339, e.g. 2026-12-01T09:00:00Z).
    #[arg(long)]
    pub not_before: Option<DateTime<Utc>>,
}

/// Parses the command line, runs the command, and turns any error into one line on
/// stderr and exit status 1 (clap's own usage errors exit with 2).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    let telemetry = {
        let _entered = runtime.enter();
        telemetry::init(cli.log_format)
    };
    let result = runtime.block_on(execute(cli.command));
    drop(telemetry);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("error: {error:#}");
    ExitCode::FAILURE
}

/// Runs one subcommand.
pub async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(args) => {
            let database = args.validate()?;
            let pool = store::create_and_migrate(database.options()).await?;
            pool.close().await;
            tracing::info!(database = ?database, "schema is up to date");
            Ok(())
        }
        Command::Run(args) => app::App::build(args.validate()?).await?.run().await,
        Command::Demo(args) => app::demo(args.validate()?).await,
        Command::Enqueue(args) => {
            let database = args.database.validate()?;
            let payload: serde_json::Value =
                serde_json::from_str(&args.payload).context("--payload is not valid JSON")?;
            let message = NewMessage {
                kind: args.kind,
                payload,
                not_before: args.not_before,
            };
            message.validate()?;
            let pool = app::connect_checked(&database).await?;
            let id = store::enqueue(&pool, message).await?;
            pool.close().await;
            println!("{id}");
            Ok(())
        }
    }
}
