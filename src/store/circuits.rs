//! The replicas' open SMTP circuits (migration 25), kept where the command line can read
//! them: a replica with an open circuit claims nothing, and its pending mail waits.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::statement::Sql;
use super::statements::Store;

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
pub async fn opened(store: &Store, worker_id: &str) -> Result<(), sqlx::Error> {
    store
        .execute(store.query(Sql::CircuitOpened).bind(worker_id))
        .await
        .map(drop)
}

/// `worker_id`'s circuit closed.
pub async fn closed(store: &Store, worker_id: &str) -> Result<(), sqlx::Error> {
    store
        .execute(store.query(Sql::CircuitClosed).bind(worker_id))
        .await
        .map(drop)
}

/// The circuits open now: said within the last five minutes (a replica probes at least
/// once a minute while its circuit is open).
pub async fn open(store: &Store) -> Result<Vec<OpenCircuit>, sqlx::Error> {
    store.all(store.query_as(Sql::OpenCircuits)).await
}
