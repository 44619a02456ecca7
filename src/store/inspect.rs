//! What `outboxd doctor` reads of the database: the server's version, the oldest open
//! transaction, the table's indexes and its vacuum. It changes nothing.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::statement::Sql;
use super::statements::Store;

/// A transaction or snapshot open in the database.
#[derive(Debug, Clone, FromRow)]
pub struct OpenTransaction {
    pub pid: i32,
    pub age_seconds: f64,
    pub state: Option<String>,
    pub user: Option<String>,
    pub application: Option<String>,
}

/// The outbox table as PostgreSQL's statistics last saw it.
#[derive(Debug, Clone, FromRow)]
pub struct TableHealth {
    pub live_tuples: i64,
    pub dead_tuples: i64,
    pub last_autovacuum: Option<DateTime<Utc>>,
    pub autovacuum_on: bool,
}

/// The server's version, as `server_version` says it, and as a number.
pub async fn server_version(store: &Store) -> Result<(String, i32), sqlx::Error> {
    store.one(store.query_as(Sql::ServerVersion)).await
}

/// The oldest transaction or snapshot another session holds open in this database.
pub async fn oldest_transaction(store: &Store) -> Result<Option<OpenTransaction>, sqlx::Error> {
    store.optional(store.query_as(Sql::OldestTransaction)).await
}

/// Indexes of outboxd's tables that a failed `CREATE INDEX CONCURRENTLY` left invalid.
pub async fn invalid_indexes(store: &Store) -> Result<Vec<String>, sqlx::Error> {
    store.scalars(store.query_scalar(Sql::InvalidIndexes)).await
}

/// The outbox table's tuples and vacuum, from the statistics.
pub async fn table_health(store: &Store) -> Result<TableHealth, sqlx::Error> {
    store.one(store.query_as(Sql::TableHealth)).await
}
