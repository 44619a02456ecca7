//! Retention's SQL: deletes expired rows in small batches that skip locked rows.

use chrono::{DateTime, Utc};

use super::statement::Sql;
use super::statements::Store;

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

/// Deletes up to `limit` rows dispatched (or discarded) before `cutoff`, oldest first, and
/// their timelines' events. Rows another transaction holds are skipped, so the pruner never
/// waits on the dispatcher.
pub async fn prune(
    store: &Store,
    which: Prunable,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let sql = match which {
        Prunable::Dispatched => Sql::PruneDispatched,
        Prunable::Discarded => Sql::PruneDiscarded,
    };
    let done = store
        .execute(store.query(sql).bind(cutoff).bind(limit))
        .await?;
    Ok(done.rows_affected())
}
