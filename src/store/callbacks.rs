//! Delivery callbacks' SQL (`sql/callbacks.sql`): switched on with the configuration,
//! claimed in order per message, their sends recorded.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::statement::Sql;
use super::statements::Store;

/// A callback due now, with what it says of its message.
#[derive(Debug, Clone, FromRow)]
pub struct DueCallback {
    pub id: i64,
    pub message_id: i64,
    /// Its type: `message.sent`, `message.dead_lettered`, ...
    pub event: String,
    /// When the event happened.
    pub at: DateTime<Utc>,
    pub detail: Option<String>,
    /// Tries so far.
    pub attempts: i32,
    /// `None` when retention deleted the message first.
    pub kind: Option<String>,
    pub idempotency_key: Option<String>,
    pub tags: Vec<String>,
}

/// Says whether outcomes keep callbacks, as this replica's configuration does: written
/// only when it changes, so that a role without `UPDATE (callbacks)` on
/// `outbox_installation` starts whenever its configuration agrees with the table's.
pub async fn switch(store: &Store, on: bool) -> Result<(), sqlx::Error> {
    let now: bool = store.scalar(store.query_scalar(Sql::CallbacksSwitched)).await?;
    if now != on {
        store.execute(store.query(Sql::SetCallbacks).bind(on)).await?;
    }
    Ok(())
}

/// The callbacks still to send, and the age of the oldest's event in seconds.
#[derive(Debug, Clone, Copy, PartialEq, FromRow)]
pub struct CallbackBacklog {
    pub pending: i64,
    pub oldest_age: f64,
}

/// Deletes up to `limit` callbacks sent or given up on whose event is older than `older`;
/// how many.
pub async fn prune(store: &Store, older: Duration, limit: i64) -> Result<u64, sqlx::Error> {
    let query = store.query(Sql::PruneCallbacks).bind(older.as_secs_f64()).bind(limit);
    Ok(store.execute(query).await?.rows_affected())
}

/// Claims up to `limit` callbacks due, each the oldest unsent of its message, for `lease`.
pub async fn claim(
    store: &Store,
    limit: i64,
    lease: Duration,
) -> Result<Vec<DueCallback>, sqlx::Error> {
    let query = store.query_as(Sql::ClaimCallbacks);
    store.all(query.bind(limit).bind(lease.as_secs_f64())).await
}

/// Records callbacks the endpoint took.
pub async fn delivered(store: &Store, ids: &[i64]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    store.execute(store.query(Sql::CallbacksDelivered).bind(ids)).await.map(drop)
}

/// Records a failed send: tried again after `delay`, or, once older than `max_age`, given
/// up on (true).
pub async fn failed(
    store: &Store,
    id: i64,
    error: &str,
    delay: Duration,
    max_age: Duration,
) -> Result<bool, sqlx::Error> {
    let query = store
        .query_scalar(Sql::CallbackFailed)
        .bind(id)
        .bind(error)
        .bind(delay.as_secs_f64())
        .bind(max_age.as_secs_f64());
    Ok(store.scalars(query).await?.into_iter().next().unwrap_or(false))
}

/// The event types, as a callback's `type` says them (and `outbox_callbacks.event` keeps
/// them): the statements that write them mark each word; the word test holds them equal.
#[cfg(test)]
pub(crate) mod events {
    pub const SENT: &str = "message.sent";
    pub const DEAD_LETTERED: &str = "message.dead_lettered";
    pub const BOUNCED: &str = "message.bounced";
    pub const COMPLAINED: &str = "message.complained";
    pub const SUPPRESSED: &str = "message.suppressed";
    pub const EXPIRED: &str = "message.expired";
    pub const CANCELLED: &str = "message.cancelled";
}
