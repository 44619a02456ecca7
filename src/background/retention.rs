//! Retention: deletes dispatched and discarded rows older than `OUTBOXD_RETENTION`, and the
//! callbacks sent or given up on as old; removes the payloads of kinds that keep them for
//! less (`payload_retention` in a `kind.toml`), keeping their rows. In small batches that
//! never hold long locks and never wait on the dispatcher. Dead letters that are not
//! discarded are never deleted, and keep their payloads (an operator may retry them).

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::kind_policies::{self, Ended};
use crate::store::prune::{Prunable, prune};
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// Rows deleted per statement: small enough that each delete is a few milliseconds.
const BATCH: i64 = 1000;
/// How often the pruner looks for expired rows: retention is counted in days, so a few
/// queries every ten minutes are plenty and keep an idle outbox quiet.
const INTERVAL: Duration = Duration::from_secs(600);
/// How often payload retention looks: a payload is removed within this of its time.
const PAYLOAD_INTERVAL: Duration = Duration::from_secs(60);
/// How far back of its cutoff a payload pass's next one starts again: an outcome's time is
/// its statement's start, and its transaction commits a few milliseconds later.
const SWEEP_MARGIN: Duration = Duration::from_secs(60);
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

/// Removes the payloads past their kind's payload retention, batch by batch; how many.
/// Each kind's pass starts where its last one ended (`payload_swept_until`), so rows whose
/// payloads are gone are walked once; a pass that met a row another transaction held keeps
/// its place, and the next walks the same rows again.
pub async fn remove_payloads_once(
    store: &Store,
    stop: &CancellationToken,
) -> Result<u64, sqlx::Error> {
    let now = chrono::Utc::now();
    let mut removed = 0;
    for policy in kind_policies::published(store).await? {
        let Some(seconds) = policy.payload_retention else {
            continue;
        };
        let cutoff = Duration::try_from_secs_f64(seconds)
            .ok()
            .and_then(|kept| chrono::Duration::from_std(kept).ok())
            .and_then(|kept| now.checked_sub_signed(kept));
        let Some(cutoff) = cutoff else {
            warn!(kind = %policy.kind, seconds, "a payload retention outboxd cannot use; its kind is skipped");
            continue;
        };
        if policy.payload_swept_until.is_some_and(|swept| swept >= cutoff) {
            continue;
        }
        let mut whole = true;
        for ended in [Ended::Sent, Ended::Discarded] {
            let mut after = None;
            loop {
                let from = policy.payload_swept_until;
                let walked =
                    kind_policies::remove_payloads(store, ended, &policy.kind, from, cutoff, after, BATCH)
                        .await?;
                removed += u64::try_from(walked.removed).unwrap_or(0);
                whole &= walked.removed == walked.due;
                match (walked.last_at, walked.last_id) {
                    (Some(at), Some(id)) if walked.scanned == BATCH => after = Some((at, id)),
                    _ => break,
                }
                if stop.is_cancelled() {
                    return Ok(removed);
                }
                tokio::time::sleep(PAUSE).await;
            }
        }
        if whole {
            // A little before the cutoff: an outcome's time is its statement's start, so a
            // transaction that commits after this pass may still end a message before it.
            let margin = chrono::Duration::from_std(SWEEP_MARGIN).unwrap_or_default();
            kind_policies::swept(store, &policy.kind, cutoff - margin).await?;
        }
    }
    Ok(removed)
}

/// Prunes rows now and then every ten minutes, and payloads every minute, until `stop`.
pub async fn run(pool: Store, retention: Retention, metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut rows_due = tokio::time::Instant::now();
    loop {
        if let Retention::For(retention) = retention
            && tokio::time::Instant::now() >= rows_due
        {
            rows_due = tokio::time::Instant::now() + INTERVAL;
            prune_rows(&pool, retention, &metrics, &stop).await;
        }
        match remove_payloads_once(&pool, &stop).await {
            Ok(0) => {}
            Ok(removed) => info!(removed, "removed payloads past their kind's payload_retention"),
            Err(e) => {
                metrics.database_error(DatabaseOperation::Prune);
                warn!(error = %e, "could not remove payloads past their retention");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PAYLOAD_INTERVAL) => {}
        }
    }
}

async fn prune_rows(pool: &Store, retention: Duration, metrics: &Metrics, stop: &CancellationToken) {
    match prune_once(pool, retention, metrics, stop).await {
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
}
