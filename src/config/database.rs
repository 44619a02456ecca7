//! Where the database is: the `--database-url` option and the checked location, whose
//! password no `Debug` or log line shows.

use std::str::FromStr;

use anyhow::bail;
use clap::Args;
use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::PgConnectOptions;

use crate::text::redact_url;

/// The database a fresh machine with a local PostgreSQL can use as it is.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/outboxd";

/// Where the database is.
#[derive(Args, Clone)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL. The password, if any, is never logged.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true, global = true)]
    pub database_url: String,
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("database_url", &redact_url(&self.database_url))
            .finish()
    }
}

/// A database location, with the password kept out of every `Debug` and log line.
#[derive(Clone)]
pub struct DatabaseConfig {
    url: SecretString,
    options: PgConnectOptions,
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
}

impl DatabaseArgs {
    pub fn validate(&self) -> anyhow::Result<DatabaseConfig> {
        let scheme = self
            .database_url
            .split_once("://")
            .map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("postgres" | "postgresql")) {
            bail!(
                "invalid --database-url / DATABASE_URL {}: outboxd needs PostgreSQL, a postgres:// or postgresql:// URL",
                redact_url(&self.database_url)
            );
        }
        let options = PgConnectOptions::from_str(&self.database_url).map_err(|e| {
            anyhow::anyhow!(
                "invalid --database-url / DATABASE_URL {}: {e}",
                redact_url(&self.database_url)
            )
        })?;
        Ok(DatabaseConfig {
            url: SecretString::from(self.database_url.clone()),
            options: options.application_name("outboxd"),
        })
    }
}
