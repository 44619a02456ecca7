//! Connecting: one connection tried first, so that a server that is down or a role that
//! does not exist is said at once in its own words; pools, with or without prepared
//! statements; and creating the database for `migrate --create-database`.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::listen::transaction_pooler_in_the_way;
use super::migrations::migrate;
use super::statements::{Preparing, Store, raw};
use outboxd_producer::Schema;

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
) -> anyhow::Result<Store> {
    use anyhow::Context as _;
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
    let store = Store::new(pool, schema, Preparing::Kept)?;
    migrate(&store)
        .await
        .context("could not apply the migrations")?;
    Ok(store)
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
    // An identifier, which no statement can take as a parameter.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
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
    if let Err(e) = raw("SET jit = off").execute(connection).await {
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
