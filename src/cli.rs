//! The command line: subcommands, and the one place where errors become exit codes.

use crate::store::admin::Operator;
use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::config::{DatabaseArgs, RunArgs};
use crate::message::{InvalidMessage, NewMessage};
use crate::telemetry::{self, LogFormat};
use crate::{app, store};

/// `print!` that returns the write's error instead of panicking: `outboxd ... | head`
/// closes standard output early, and `println!` then panicked with a backtrace.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` as [`out!`] is `print!`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod cancel;
mod erase;
mod dead_letters;
mod doctor;
mod messages;
mod pauses;
mod preview;
mod suppressions;

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
    /// Apply the schema to DATABASE_URL's database (created first with --create-database).
    Migrate(MigrateArgs),
    /// Deliver outbox messages until SIGTERM or Ctrl-C.
    Run(Box<RunArgs>),
    /// Insert one message into the outbox, as a producer would; prints its id.
    Enqueue(EnqueueArgs),
    /// Migrate, enqueue one sample email of each built-in kind, and run (logging them when no SMTP is set).
    Demo(Box<RunArgs>),
    /// Inspect, retry and discard dead letters, directly in the database.
    DeadLetters(dead_letters::DeadLettersArgs),
    /// Pending, due, in-flight and dead-lettered messages, and sends in the last hour, per kind.
    Stats(StatsArgs),
    /// List, add and remove addresses on the suppression list, directly in the database.
    Suppressions(suppressions::SuppressionsArgs),
    /// The messages sent to an address, or one message, each with its timeline.
    Messages(Box<messages::MessagesArgs>),
    /// Hold one kind's messages on every replica, across restarts, until it is resumed.
    Pause(pauses::PauseArgs),
    /// Send a paused kind's messages again.
    Resume(pauses::ResumeArgs),
    /// The paused kinds: since when, by whom, and why.
    Pauses(pauses::PausesArgs),
    /// Withdraw a message by id or key, or pending messages by filter (counted first).
    Cancel(Box<cancel::CancelArgs>),
    /// Erase an address: cancel its pending messages, remove its messages' payloads, and
    /// replace it by a one-way mark everywhere outboxd keeps it.
    Erase(Box<erase::EraseArgs>),
    /// Render one email exactly as it would be sent, without a database or SMTP server.
    Preview(preview::PreviewArgs),
    /// Check a deployment: one line per check (ok, warn or fail); exits 1 when any fails.
    Doctor(Box<doctor::DoctorArgs>),
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Create DATABASE_URL's database first when it does not exist (otherwise a database
    /// that does not exist is refused: a mistyped name must not make a new, empty one).
    #[arg(long)]
    pub create_database: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
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
    /// Higher is sent first among due messages (0 to 10000; a point is a minute of waiting).
    #[arg(long, default_value_t = 0)]
    pub priority: i16,
    /// Never send after this time (RFC 3339); the message ends as expired.
    #[arg(long)]
    pub expires_at: Option<DateTime<Utc>>,
    /// A key for this email: enqueueing it again prints the first message's id and inserts
    /// nothing.
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

/// Parses the command line, runs the command, and turns any error into one line on
/// stderr and exit status 1 (clap's own usage errors exit with 2).
pub fn main() -> ExitCode {
    telemetry::log_panics();
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
    // The reader of the output went away (`| head`): it has what it wanted.
    let reader_gone = error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
    if reader_gone {
        return ExitCode::SUCCESS;
    }
    // What the database or an operator wrote may be in it (a role's name, a reason).
    eprintln!("error: {}", crate::text::printable(&format!("{error:#}")));
    ExitCode::FAILURE
}

/// Runs one subcommand.
pub async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(args) => migrate(args).await,
        Command::Run(args) => app::App::build(args.validate()?).await?.run().await,
        Command::Demo(args) => demo(*args).await,
        Command::DeadLetters(args) => dead_letters::command(args).await,
        Command::Preview(args) => preview::run(args),
        Command::Doctor(args) => doctor::run(*args).await,
        Command::Suppressions(args) => {
            let output = Output::unless_json(args.json());
            with_database(&args.database, output, async |pool| {
                suppressions::run(pool, args.command, &cli_actor()).await
            })
            .await
        }
        Command::Pause(args) => {
            let new = pauses::checked_pause(&args)?;
            with_database(&args.database, Output::ForPeople, async |pool| {
                pauses::pause(pool, &new, &cli_actor()).await
            })
            .await
        }
        Command::Resume(args) => {
            let kind = pauses::checked_resume(&args)?;
            with_database(&args.database, Output::ForPeople, async |pool| {
                pauses::resume(pool, &kind, &cli_actor()).await
            })
            .await
        }
        Command::Messages(args) => {
            let lookup = messages::checked(&args)?;
            let output = Output::unless_json(args.json);
            with_database(&args.database, output, async |pool| {
                messages::run(pool, lookup, &args, &cli_actor()).await
            })
            .await
        }
        Command::Pauses(args) => {
            with_database(
                &args.database,
                Output::unless_json(args.json),
                async |pool| pauses::list(pool, args.json).await,
            )
            .await
        }
        Command::Cancel(args) => cancel::command(*args).await,
        Command::Erase(args) => erase::command(*args).await,
        Command::Stats(args) => stats(args).await,
        Command::Enqueue(args) => enqueue(args).await,
    }
}

/// `outboxd demo`: on the database given, or on a throwaway PostgreSQL of its own.
async fn demo(mut args: RunArgs) -> anyhow::Result<()> {
    // Dropped when the demo ends: its throwaway PostgreSQL, if it needed one.
    let own = match args.database.database_url {
        Some(_) => None,
        None => app::demo_database().await?,
    };
    if let Some(cluster) = &own {
        args.database.database_url = Some(cluster.url());
    }
    args.database = args.database.or_demo_database();
    app::demo(args.validate()?).await
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let database = args.database.validate()?;
    let create = match args.create_database {
        true => store::Create::IfMissing,
        false => store::Create::Never,
    };
    let pool = store::migrate_database(database.options(), database.schema(), create).await?;
    pool.close().await;
    tracing::info!(database = %database.location(), "schema is up to date");
    Ok(())
}

async fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let output = Output::unless_json(args.json);
    let stats = with_database(&args.database, output, async |pool| {
        Ok(store::stats::stats(pool).await?)
    })
    .await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&stats)?)?;
    } else {
        out!("{}", crate::report::stats_table(&stats))?;
    }
    Ok(())
}

/// The message `outboxd enqueue` was asked for, or what is wrong with it.
fn new_message(
    args: &EnqueueArgs,
    payload: serde_json::Value,
) -> Result<NewMessage, InvalidMessage> {
    let mut message = NewMessage::new(&args.kind, payload)?.with_priority(args.priority)?;
    if let Some(at) = args.not_before {
        message = message.with_not_before(at)?;
    }
    if let Some(at) = args.expires_at {
        message = message.with_expires_at(at)?;
    }
    if let Some(key) = &args.idempotency_key {
        message = message.with_idempotency_key(key.as_str())?;
    }
    Ok(message)
}

async fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let database = args.database.validate()?;
    let payload: serde_json::Value =
        serde_json::from_str(&args.payload).context("--payload is not valid JSON")?;
    let message = new_message(&args, payload)?;
    let pool = app::connect_checked(&database).await?;
    let id = pool.enqueue_alone(message).await;
    pool.close().await;
    outln!("{}", id?)?;
    Ok(())
}

/// Who reads a command's output: a person, whom its first line tells which database it
/// read (`database 127.0.0.1:5432/app`), or a script (JSON, `enqueue`'s id), whose output
/// stays what it parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    ForPeople,
    ForScripts,
}

impl Output {
    fn unless_json(json: bool) -> Self {
        if json {
            Output::ForScripts
        } else {
            Output::ForPeople
        }
    }
}

/// Connects to the database `args` name (checking its schema), says which it is when a
/// person reads the output, runs `work`, and closes the pool whatever came of it: the
/// commands that work directly in the database.
async fn with_database<T>(
    args: &DatabaseArgs,
    output: Output,
    work: impl AsyncFnOnce(&crate::store::Store) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let database = args.validate()?;
    let pool = app::connect_checked(&database).await?;
    if output == Output::ForPeople {
        outln!("database {}", database.location())?;
    }
    let result = work(&pool).await;
    pool.close().await;
    result
}

/// Who runs the CLI, for the audit table.
pub(super) fn cli_actor() -> Operator {
    let name = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .map_or_else(|| "cli".to_owned(), |user| format!("cli:{user}"));
    Operator::named(name)
}
