//! Where the database is: the `--database-url` option and the checked location, whose
//! password no `Debug` or log line shows.

use std::str::FromStr;

use anyhow::bail;
use clap::Args;
use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::PgConnectOptions;

use crate::store::Schema;
use crate::text::redact_url;

/// The smallest connection budget outboxd works with.
pub const MIN_CONNECTIONS: u32 = 4;

/// The database `outboxd demo` uses when `DATABASE_URL` is not set: one a fresh machine with
/// a local PostgreSQL can use as it is. No other subcommand falls back to it: a mistyped
/// or forgotten `DATABASE_URL` must not read or write a database nobody meant.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/outboxd";

/// Where the database is.
#[derive(Args, Clone)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL of the database that holds the outbox table (the
    /// application's). Required, but by `outboxd demo`. The password, if any, is never
    /// logged.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,
    /// A direct connection to the same database, for LISTEN: where DATABASE_URL goes
    /// through a transaction pooler (PgBouncer in transaction mode, most managed poolers),
    /// notifications cannot come back through it. When set, outboxd also keeps no statement
    /// prepared on DATABASE_URL's connections. The password, if any, is never logged.
    #[arg(
        long,
        env = "OUTBOXD_LISTEN_DATABASE_URL",
        hide_env_values = true,
        global = true
    )]
    pub listen_database_url: Option<String>,
    /// The most database connections one replica opens, across all its pools (the LISTEN
    /// connection and OUTBOXD_LISTEN_DATABASE_URL's included): for a pooler or server with
    /// few connections to spare. At least 4. Unset: 11, with readiness, the sampler, the
    /// admin surface and recipient lookups on pools of their own; under 11 the first three
    /// share one.
    #[arg(long, env = "OUTBOXD_DATABASE_MAX_CONNECTIONS", global = true)]
    pub database_max_connections: Option<u32>,
    /// A schema of outboxd's own for its tables and functions, beside the application's:
    /// `migrate` creates it, and every statement names it (through a transaction pooler
    /// too). Unset: the role's search_path, `public` by default. Producers then insert into
    /// SCHEMA.outbox_messages.
    #[arg(long, env = "OUTBOXD_SCHEMA", global = true)]
    pub schema: Option<String>,
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact_url),
            )
            .field(
                "listen_database_url",
                &self.listen_database_url.as_deref().map(redact_url),
            )
            .field("schema", &self.schema)
            .finish()
    }
}

/// A database location, with the password kept out of every `Debug` and log line.
#[derive(Clone)]
pub struct DatabaseConfig {
    url: SecretString,
    options: PgConnectOptions,
    /// `OUTBOXD_LISTEN_DATABASE_URL`'s: a session of its own for LISTEN.
    listen: Option<PgConnectOptions>,
    /// `OUTBOXD_DATABASE_MAX_CONNECTIONS`.
    max_connections: Option<u32>,
    /// `OUTBOXD_SCHEMA`.
    schema: Option<Schema>,
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(self.url.expose_secret()))
    }
}

impl DatabaseConfig {
    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// Where to LISTEN, when that is not [`Self::options`]: a direct connection past a
    /// transaction pooler.
    pub fn listen_options(&self) -> Option<&PgConnectOptions> {
        self.listen.as_ref()
    }

    /// The connection budget, when one is set.
    pub fn max_connections(&self) -> Option<u32> {
        self.max_connections
    }

    /// outboxd's own schema, when one is set.
    pub fn schema(&self) -> Option<&Schema> {
        self.schema.as_ref()
    }

    /// Where outboxd's tables are, as the CLI and the logs name them: `host:port/database`,
    /// and the schema when one is set; never the password.
    pub fn location(&self) -> String {
        let at = crate::store::location(&self.options);
        match &self.schema {
            Some(schema) => format!("{at} (schema {})", schema.name()),
            None => at,
        }
    }
}

impl DatabaseArgs {
    /// `outboxd demo`'s database when none is given.
    pub fn or_demo_database(mut self) -> Self {
        self.database_url
            .get_or_insert_with(|| DEFAULT_DATABASE_URL.to_owned());
        self
    }

    pub fn validate(&self) -> anyhow::Result<DatabaseConfig> {
        let listen = self
            .listen_database_url
            .as_deref()
            .map(|url| postgres_options("--listen-database-url / OUTBOXD_LISTEN_DATABASE_URL", url))
            .transpose()?;
        if let Some(max) = self.database_max_connections
            && max < MIN_CONNECTIONS
        {
            bail!(
                "OUTBOXD_DATABASE_MAX_CONNECTIONS is {max}: outboxd needs at least {MIN_CONNECTIONS} (the LISTEN connection, one for the dispatcher's statements, one for a write waiting on row locks, one that readiness, the sampler and the admin surface share)"
            );
        }
        let schema = self
            .schema
            .as_deref()
            .map(|name| {
                name.parse::<Schema>()
                    .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_SCHEMA: {e}"))
            })
            .transpose()?;
        let Some(url) = self.database_url.as_deref() else {
            bail!(
                "DATABASE_URL is not set: give --database-url or DATABASE_URL, the database that holds (or will hold) the outbox table, e.g. postgres://app@db.internal:5432/app"
            );
        };
        let options = postgres_options("--database-url / DATABASE_URL", url)?;
        Ok(DatabaseConfig {
            url: SecretString::from(url.to_owned()),
            options,
            listen,
            max_connections: self.database_max_connections,
            schema,
        })
    }
}

/// A PostgreSQL URL's connection options, or one line saying what is wrong with it (never
/// its password).
fn postgres_options(option: &str, url: &str) -> anyhow::Result<PgConnectOptions> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        bail!(
            "invalid {option} {}: outboxd needs PostgreSQL, a postgres:// or postgresql:// URL",
            redact_url(url)
        );
    }
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| anyhow::anyhow!("invalid {option} {}: {e}", redact_url(url)))?;
    // No `extra_float_digits` at startup: PgBouncer refuses startup parameters it does not
    // know, and sqlx reads floats in binary, where the setting changes nothing.
    Ok(options.application_name("outboxd").extra_float_digits(None))
}
