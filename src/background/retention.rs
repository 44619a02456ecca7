//! Retention: deletes dispatched and discarded rows older than `OUTBOXD_RETENTION`, and the
//! callbacks sent or given up on as old, in small batches that never hold long locks and
//! never wait on the dispatcher. Dead letters that are not discarded are never deleted.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::prune::{Prunable, prune};
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// Rows deleted per statement: small enough that each delete is a few milliseconds.
const BATCH: i64 = 1000;
/// How often the pruner looks for expired rows: retention is counted in days, so a few
/// queries every ten minutes are plenty and keep an idle outbox quiet.
const INTERVAL: Duration = Duration::from_secs(600);
/// A pause between batches, leaving the database to the dispatcher.
const PAUSE: Duration = Duration::from_millis(20);

/// How long dispatched and discarded rows are kept; `Keep` never deletes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Keep,
    For(Duration),
}

/// Rows deleted by one pass.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub dispatched: u64,
    pub discarded: u64,
    pub callbacks: u64,
}

/// Deletes everything expired now, batch by batch.
pub async fn prune_once(
    pool: &Store,
    retention: Duration,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Result<Pruned, sqlx::Error> {
    let cutoff =
        chrono::Utc::now() - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    let mut pruned = Pruned::default();
    for which in Prunable::ALL {
        loop {
            let deleted = prune(pool, which, cutoff, BATCH).await?;
            metrics.pruned(which, deleted);
            match which {
                Prunable::Dispatched => pruned.dispatched += deleted,
                Prunable::Discarded => pruned.discarded += deleted,
            }
            if deleted < BATCH as u64 || stop.is_cancelled() {
                break;
            }
            tokio::time::sleep(PAUSE).await;
        }
    }
    loop {
        let deleted = crate::store::callbacks::prune(pool, retention, BATCH).await?;
        pruned.callbacks += deleted;
        if deleted < BATCH as u64 || stop.is_cancelled() {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(pruned)
}

/// Prunes now and then every ten minutes until `stop`.
pub async fn run(pool: Store, retention: Duration, metrics: Arc<Metrics>, stop: CancellationToken) {
    loop {
        match prune_once(&pool, retention, &metrics, &stop).await {
            Ok(pruned) if pruned != Pruned::default() => {
                info!(
                    dispatched = pruned.dispatched,
                    discarded = pruned.discarded,
                    callbacks = pruned.callbacks,
                    "pruned expired rows"
                );
            }
            Ok(_) => {}
            Err(e) => {
                metrics.database_error(DatabaseOperation::Prune);
                warn!(error = %e, "could not prune expired rows");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(INTERVAL) => {}
        }
    }
}
