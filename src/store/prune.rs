//! Retention's SQL: deletes expired rows in small batches that skip locked rows.

use super::statements::execute_alone;
use super::statements::query;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Which rows retention removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prunable {
    Dispatched,
    Discarded,
}

impl Prunable {
    pub const ALL: [Prunable; 2] = [Prunable::Dispatched, Prunable::Discarded];

    /// The `state` label of `outbox_messages_pruned_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Prunable::Dispatched => "dispatched",
            Prunable::Discarded => "discarded",
        }
    }
}

/// Deletes rows `doomed` names (a `WITH` clause's rows of `id`), with their timelines.
macro_rules! delete_with_events {
    ($doomed:literal) => {
        concat!(
            "WITH doomed AS (",
            $doomed,
            "), events AS ( \
                 DELETE FROM outbox_message_events WHERE message_id IN (SELECT id FROM doomed)) \
             DELETE FROM outbox_messages AS m USING doomed WHERE m.id = doomed.id"
        )
    };
}

/// Deletes up to `limit` rows dispatched (or discarded) before `cutoff`, oldest first, and
/// their timelines' events. Rows another transaction holds are skipped, so the pruner never
/// waits on the dispatcher.
pub async fn prune(
    pool: &PgPool,
    which: Prunable,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let sql = match which {
        Prunable::Dispatched => delete_with_events!(
            "SELECT id FROM outbox_messages WHERE dispatched_at < $1 \
             ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED"
        ),
        Prunable::Discarded => delete_with_events!(
            "SELECT id FROM outbox_messages WHERE discarded_at < $1 \
             ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED"
        ),
    };
    Ok(execute_alone(query(sql).bind(cutoff).bind(limit), pool)
        .await?
        .rows_affected())
}
