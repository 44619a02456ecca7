//! What `outboxd doctor` reads of the database: the server's version, the oldest open
//! transaction, the table's indexes and its vacuum. It changes nothing.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

use super::statements::{fetch_one_alone, query_as, query_scalar};

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
pub async fn server_version(pool: &PgPool) -> Result<(String, i32), sqlx::Error> {
    fetch_one_alone(
        query_as(
            "SELECT current_setting('server_version'), \
                    current_setting('server_version_num')::int4",
        ),
        pool,
    )
    .await
}

/// The oldest transaction or snapshot another session holds open in this database.
pub async fn oldest_transaction(pool: &PgPool) -> Result<Option<OpenTransaction>, sqlx::Error> {
    super::statements::fetch_optional_alone(
        query_as(
            "SELECT pid, extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_seconds, \
                    state, usename::text AS user, application_name AS application \
             FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND xact_start IS NOT NULL \
               AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) \
             ORDER BY xact_start LIMIT 1",
        ),
        pool,
    )
    .await
}

/// Indexes of outboxd's tables that a failed `CREATE INDEX CONCURRENTLY` left invalid.
pub async fn invalid_indexes(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let tables: Vec<String> = super::schema::OBJECTS
        .iter()
        .map(|o| super::schema::qualified(o))
        .collect();
    let mut connection = pool.acquire().await?;
    super::statements::on_its_own(&mut connection, async |c| {
        query_scalar(
            "SELECT indexrelid::regclass::text FROM pg_index \
             WHERE NOT indisvalid \
               AND indrelid IN (SELECT to_regclass(o) FROM unnest($1::text[]) AS o) \
             ORDER BY 1",
        )
        .bind(tables)
        .fetch_all(c)
        .await
    })
    .await
}

/// The outbox table's tuples and vacuum, from the statistics.
pub async fn table_health(pool: &PgPool) -> Result<TableHealth, sqlx::Error> {
    fetch_one_alone(
        query_as(
            "SELECT coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples, \
                    s.last_autovacuum, \
                    current_setting('autovacuum')::bool \
                      AND coalesce(NOT ('autovacuum_enabled=false' = ANY(c.reloptions)), true) \
                      AS autovacuum_on \
             FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
             WHERE c.oid = to_regclass('outbox_messages')",
        ),
        pool,
    )
    .await
}
