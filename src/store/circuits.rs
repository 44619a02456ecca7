//! The replicas' open SMTP circuits (migration 25), kept where the command line can read
//! them: a replica with an open circuit claims nothing, and its pending mail waits.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgPool};

use super::statements::{execute_alone, fetch_all_alone, query, query_as};

/// A replica whose relay does not answer.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct OpenCircuit {
    pub worker_id: String,
    pub open_since: DateTime<Utc>,
    /// When the replica last said so: a replica that died with its circuit open stops
    /// saying it, and is not listed past a few minutes.
    pub seen_at: DateTime<Utc>,
}

/// `worker_id`'s circuit is open (since its first call while open).
pub async fn opened(pool: &PgPool, worker_id: &str) -> Result<(), sqlx::Error> {
    execute_alone(
        query(
            "INSERT INTO outbox_replica_circuits AS c (worker_id, open_since) VALUES ($1, now()) \
             ON CONFLICT (worker_id) DO UPDATE SET seen_at = now(), \
                 open_since = CASE WHEN c.seen_at < now() - interval '5 minutes' \
                                   THEN now() ELSE c.open_since END",
        )
        .bind(worker_id),
        pool,
    )
    .await
    .map(drop)
}

/// `worker_id`'s circuit closed.
pub async fn closed(pool: &PgPool, worker_id: &str) -> Result<(), sqlx::Error> {
    execute_alone(
        query("DELETE FROM outbox_replica_circuits WHERE worker_id = $1").bind(worker_id),
        pool,
    )
    .await
    .map(drop)
}

/// The circuits open now: said within the last five minutes (a replica probes at least
/// once a minute while its circuit is open).
pub async fn open(pool: &PgPool) -> Result<Vec<OpenCircuit>, sqlx::Error> {
    fetch_all_alone(
        query_as(
            "SELECT worker_id, open_since, seen_at FROM outbox_replica_circuits \
             WHERE seen_at > now() - interval '5 minutes' ORDER BY worker_id",
        ),
        pool,
    )
    .await
}
