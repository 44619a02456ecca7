//! Every SQL statement outboxd issues. Nothing else in the crate speaks SQL.
//!
//! Predicates and stored words that more than one statement uses are defined once, in
//! [`sql`], and composed into the statements' text at compile time.

use statements::fetch_one_alone;
use statements::{query, query_as};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{FromRow, PgExecutor};

use crate::message::NewMessage;

#[macro_use]
mod sql;
#[macro_use]
mod rights;
mod schema;
mod statements;

pub mod admin;
pub mod circuits;
mod claim;
pub mod inspect;
pub mod installation;
mod kept;
mod listen;
pub mod messages;
mod migrations;
mod outcomes;
pub mod pauses;
pub mod prune;
mod sample;
pub mod send_rate;
pub mod stats;
pub mod suppressions;
pub mod timeline;

pub use claim::{CLAIM, ClaimRequest, Claimed, claim};
pub use kept::KeptConnection;
pub use listen::{
    CHECK_CHANNEL, linger, listen, notification_round_trip, send_check,
    transaction_pooler_in_the_way,
};
pub use outcomes::{
    OutcomeRow, Recorded, RowLocks, record_outcomes, record_outcomes_when_unlocked,
};
pub use prune::Prunable;
pub use rights::{AUTO_PAUSE_RIGHTS, RUN_RIGHTS, Right, Rights};
pub use sample::{KindSample, PausedKind, Sample, sample};
pub use schema::{InvalidSchema, Schema, use_schema};
pub use statements::keep_no_statement_prepared;

pub use migrations::{MIGRATIONS_TABLE, MIGRATOR, migrate};

/// The outbox table.
pub const TABLE: &str = "outbox_messages";

/// The most rows one page of a listing returns (dead letters, the suppression list), for
/// the API's and the command line's `limit`.
pub const MAX_PAGE: i64 = 500;

/// The channel the insert trigger notifies at commit.
pub const NOTIFY_CHANNEL: &str = "outbox_messages";

/// Errors of the producer API: the producer crate's.
pub use outboxd_producer::EnqueueError;

/// Whether the database holds the schema this build expects.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the outbox schema is missing (from OUTBOXD_SCHEMA, or the search path without it): run `outboxd migrate` first"
    )]
    Missing,
    #[error(
        "the outbox schema is at version {applied}, this outboxd needs {expected}: run `outboxd migrate`"
    )]
    Outdated { applied: i64, expected: i64 },
    #[error(
        "the outbox schema is at version {applied}, newer than this outboxd knows ({expected}): run a newer outboxd"
    )]
    Newer { applied: i64, expected: i64 },
    #[error(
        "a migration failed part-way (version {0}): fix it by hand, then run `outboxd migrate`"
    )]
    Dirty(i64),
    #[error("the migrations are recorded but the table outbox_messages is missing")]
    TableMissing,
    /// The schema is right, but outboxd could not record an outcome.
    #[error("outboxd cannot write: {0}")]
    NotWritable(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Inserts a message in the caller's transaction (or on any executor), so that it is
/// committed, or rolled back, with the business change that caused it: the producer crate's
/// `enqueue`, in this process's schema and with its statements prepared or not, as the
/// route to the database allows. Applications use that crate (`outboxd-producer`) itself.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
/// let mut tx = pool.begin().await?;
/// // ... the business change, in `tx` ...
/// outboxd::enqueue(&mut *tx, outboxd::NewMessage::new(
///     "account_verification",
///     serde_json::json!({"to": "ada@example.com", "name": "Ada", "verify_url": "https://app.example/v/1"}),
/// )).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue<'e, E>(executor: E, message: NewMessage) -> Result<i64, EnqueueError>
where
    E: PgExecutor<'e>,
{
    // The statement's text once, in the process's schema; the route may change after.
    static OUTBOX: std::sync::OnceLock<outboxd_producer::Outbox> = std::sync::OnceLock::new();
    let outbox = OUTBOX.get_or_init(|| match schema::current() {
        Some(schema) => outboxd_producer::Outbox::default().in_schema(schema),
        None => outboxd_producer::Outbox::default(),
    });
    outbox
        .clone()
        .prepared(statements::prepared())
        .enqueue(executor, message)
        .await
}

/// [`enqueue`] on a connection from `pool`, on its own (see [`statements::on_its_own`]):
/// through a transaction pooler, outside a transaction, an unprepared statement's parse and
/// its execution could reach two server sessions.
pub async fn enqueue_alone(pool: &PgPool, message: NewMessage) -> Result<i64, EnqueueError> {
    let mut connection = pool.acquire().await?;
    statements::on_its_own(&mut connection, async |c| enqueue(c, message).await).await
}

/// Whether `outboxd migrate` may create the database it was pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// `--create-database`, and `outboxd demo`.
    IfMissing,
    /// A database that does not exist is refused: a mistyped name must not make a new one.
    Never,
}

/// Applies the migrations to the database of `options`, in `schema` when one is given;
/// creates the database first when it does not exist and `create` allows.
pub async fn migrate_database(
    options: &PgConnectOptions,
    schema: Option<&Schema>,
    create: Create,
) -> anyhow::Result<PgPool> {
    use anyhow::Context as _;
    use_schema(schema);
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let pool = match connect(options, 2).await {
        Ok(pool) => pool,
        Err(sqlx::Error::Database(e))
            if e.code().as_deref() == Some("3D000") && create == Create::Never =>
        {
            anyhow::bail!(
                "database {name:?} does not exist on {}:{}: create it (CREATE DATABASE), or run outboxd migrate --create-database",
                options.get_host(),
                options.get_port()
            );
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
            create_database(options, &name).await?;
            connect(options, 2).await?
        }
        Err(e) => return Err(connect_error(e, options)),
    };
    if let Some(schema) = schema
        && transaction_pooler_in_the_way(options)
            .await
            .map_err(|e| connect_error(e, options))?
    {
        anyhow::bail!(
            "a transaction pooler is in the way of DATABASE_URL: run `outboxd migrate` with OUTBOXD_SCHEMA={} over a direct connection (its search_path would stay on a server session the pooler hands to other clients)",
            schema.name()
        );
    }
    migrate(&pool)
        .await
        .context("could not apply the migrations")?;
    Ok(pool)
}

/// How long the first connection may take before the server is taken for unreachable.
const FIRST_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Tries one connection, so that a server that refuses or a role that does not exist is
/// told at once in its own words, not after the pool's ten seconds as "pool timed out".
async fn try_one_connection(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    use sqlx::Connection as _;
    let connected = tokio::time::timeout(
        FIRST_CONNECTION_TIMEOUT,
        sqlx::PgConnection::connect_with(options),
    )
    .await
    .map_err(|_| no_answer())??;
    let mut connected = connected;
    // A query, not just the login: a pooler in front answers the login from its own
    // cache even when the server behind it is down.
    tokio::time::timeout(
        FIRST_CONNECTION_TIMEOUT,
        sqlx::raw_sql("SELECT 1").execute(&mut connected),
    )
    .await
    .map_err(|_| no_answer())??;
    connected.close().await
}

fn no_answer() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer within {}",
            crate::text::duration(FIRST_CONNECTION_TIMEOUT)
        ),
    ))
}

/// Whether the server at `options` takes a connection and a query, within seconds: the
/// first thing a replica asks, so that a server that is down is said at once.
pub async fn reachable(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    try_one_connection(options).await
}

/// `CREATE DATABASE name`, through the server's `postgres` database.
async fn create_database(options: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let admin = connect(&options.clone().database("postgres"), 1)
        .await
        .context("could not connect to the `postgres` database to create the outbox database")?;
    query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE \"{}\"",
        name.replace('"', "\"\"")
    )))
    .execute(&admin)
    .await
    .with_context(|| format!("could not create database {name}"))?;
    admin.close().await;
    tracing::info!(database = name, "created the database");
    Ok(())
}

/// Whether a PostgreSQL server answers at `options`' address (a database that does not
/// exist, or a role refused, is still a server that answers).
pub async fn answers(options: &PgConnectOptions) -> bool {
    !matches!(try_one_connection(options).await, Err(sqlx::Error::Io(_)))
}

/// Opens a pool, failing fast when the server cannot be reached.
pub async fn connect(options: &PgConnectOptions, size: u32) -> Result<PgPool, sqlx::Error> {
    try_one_connection(options).await?;
    pool_options(size)
        .after_connect(|connection, _| Box::pin(without_jit(connection)))
        .connect_with(options.clone())
        .await
}

/// Opens a pool whose connections go through a transaction pooler (PgBouncer in
/// transaction mode, most managed poolers), where a server session lasts one transaction:
/// no statement is kept prepared (sqlx then prepares each one unnamed, in the transaction
/// that runs it), and no setting is made for a session the next transaction may not get.
pub async fn connect_pooled(options: &PgConnectOptions, size: u32) -> Result<PgPool, sqlx::Error> {
    let options = options.clone().statement_cache_capacity(0);
    try_one_connection(&options).await?;
    pool_options(size).connect_with(options).await
}

fn pool_options(size: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(10))
        // No ping before every query: it doubles the round trips of an idle dispatcher and
        // of every claim. A connection that died is found by the query itself, which fails
        // once and is retried after the dispatcher's back-off.
        .test_before_acquire(false)
}

/// Every statement outboxd runs is short; PostgreSQL's JIT, which it starts on cost
/// estimates alone, once spent 430 ms compiling each 8 ms claim (docs/src/benchmark-history.md, *Second round*). A `SET`
/// after connecting rather than a startup option: connection poolers such as PgBouncer
/// refuse unknown startup options. A server without the setting keeps its default.
async fn without_jit(connection: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    if let Err(e) = query("SET jit = off").execute(connection).await {
        tracing::debug!(error = %e, "could not turn JIT compilation off for this session");
    }
    Ok(())
}

/// A connection failure, told as one line that names where it tried (never the password)
/// and what the server or the network said, in their own words: `connection refused`,
/// `role "app" does not exist` (PostgreSQL's message alone, not the source line sqlx adds).
pub fn connect_error(error: sqlx::Error, options: &PgConnectOptions) -> anyhow::Error {
    let said = match &error {
        sqlx::Error::Database(e) => e.message().to_owned(),
        sqlx::Error::Io(e) => e.to_string(),
        other => other.to_string(),
    };
    anyhow::anyhow!(
        "could not connect to PostgreSQL at {}: {said}",
        location(options)
    )
}

/// Where `options` connect, as the CLI and the logs name a database: `host:port/database`
/// (or the socket's directory), never the password.
pub fn location(options: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    )
}

/// Fails unless every migration this build embeds, and no other, has been applied. Start-up
/// and the CLI check this; readiness also checks that outboxd can write
/// ([`check_ready`]).
pub async fn check_schema(pool: &PgPool) -> Result<(), SchemaError> {
    schema_state(pool, Rights::default())
        .await?
        .schema(Newer::Refused)
}

/// [`check_schema`], and that outboxd can write the table: not a read-only database or
/// standby, and a role with each of `rights`. One query: readiness runs it often. A schema
/// newer than this build is ready here: migrations are additive, so a replica keeps
/// working while a rolling upgrade has migrated ahead of it (it refuses only to start).
pub async fn check_ready(pool: &PgPool, rights: Rights) -> Result<(), SchemaError> {
    let state = schema_state(pool, rights).await?;
    state.schema(Newer::Accepted)?;
    match state.not_writable {
        Some(reason) => Err(SchemaError::NotWritable(reason)),
        None => Ok(()),
    }
}

/// What the database says of the schema and of outboxd's right to write.
#[derive(FromRow)]
struct SchemaState {
    applied: Vec<i64>,
    failed: Vec<i64>,
    table_exists: bool,
    not_writable: Option<String>,
}

async fn schema_state(pool: &PgPool, rights: Rights) -> Result<SchemaState, SchemaError> {
    let (objects, privileges, functions) = rights::as_columns(rights);
    let state = fetch_one_alone(
        query_as(concat!(
            "SELECT ARRAY(SELECT version FROM outbox_schema_migrations WHERE success ORDER BY version) AS applied, \
                    ARRAY(SELECT version FROM outbox_schema_migrations WHERE NOT success ORDER BY version) AS failed, \
                    to_regclass('outbox_messages') IS NOT NULL AS table_exists, \
                    CASE WHEN pg_is_in_recovery() THEN 'the server is a read-only standby' \
                         WHEN current_setting('transaction_read_only') = 'on' \
                           THEN 'the database is read-only (default_transaction_read_only)' \
                         ELSE ",
            missing_right!(),
            " END AS not_writable"
        ))
        .bind(objects)
        .bind(privileges)
        .bind(functions),
        pool,
    )
    .await;
    match state {
        Ok(state) => Ok(state),
        // undefined_table: never migrated.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
            Err(SchemaError::Missing)
        }
        Err(e) => Err(e.into()),
    }
}

/// What to make of a schema newer than this build.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Newer {
    Refused,
    Accepted,
}

impl SchemaState {
    fn schema(&self, newer: Newer) -> Result<(), SchemaError> {
        if let Some(version) = self.failed.first() {
            return Err(SchemaError::Dirty(*version));
        }
        let (Some(&applied), Some(expected)) = (
            self.applied.last(),
            MIGRATOR.iter().map(|m| m.version).max(),
        ) else {
            return Err(SchemaError::Missing);
        };
        if applied > expected && newer == Newer::Refused {
            return Err(SchemaError::Newer { applied, expected });
        }
        if !MIGRATOR.iter().all(|m| self.applied.contains(&m.version)) {
            return Err(SchemaError::Outdated { applied, expected });
        }
        if !self.table_exists {
            return Err(SchemaError::TableMissing);
        }
        Ok(())
    }
}
