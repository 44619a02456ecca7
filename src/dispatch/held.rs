//! Outcomes held back: those the database did not take (it was down, or the connection
//! dropped), written before the next claim, and those whose rows another transaction has
//! locked, written by a task that waits for the locks while claims go on.

use tokio::time::Instant;
use tracing::{Instrument as _, debug, warn};

use super::batch::{BatchReport, Decided, LOCKED_RETRY, Unrecorded};
use super::{DispatchError, Dispatcher};
use crate::lock::lock;
use crate::message::ClaimedBatch;
use crate::store;

/// Outcomes whose rows another transaction has locked, being written by a task that waits
/// for the locks on a connection of its own.
pub(super) struct LockWaiter {
    held: Unrecorded,
    task: tokio::task::JoinHandle<Result<store::Recorded, sqlx::Error>>,
}

impl Dispatcher {
    pub(super) fn hold(&self, unrecorded: Unrecorded) {
        warn!(
            messages = unrecorded.decided.len(),
            "could not record the outcomes of sent messages; holding them to record before the next claim"
        );
        lock(&self.unrecorded).push(unrecorded);
    }

    /// Holds outcomes whose rows another transaction has locked, for a task that waits for
    /// the locks a second later; says so the first time, and only at debug level on every
    /// try after.
    pub(super) fn hold_locked(
        &self,
        claimed: &ClaimedBatch,
        locked: Vec<Decided>,
        span: &tracing::Span,
        first: bool,
    ) {
        if locked.is_empty() {
            return;
        }
        let ids: Vec<i64> = locked
            .iter()
            .map(|d| claimed.messages[d.index].id)
            .collect();
        if first {
            warn!(
                outbox.ids = ?ids,
                "outcome not recorded yet: another transaction has locked the row; recording it when the lock is gone"
            );
        } else {
            debug!(outbox.ids = ?ids, "the row is still locked by another transaction");
        }
        lock(&self.unrecorded).push(Unrecorded {
            locked_at: Some(Instant::now()),
            ..Unrecorded::new(claimed.clone(), locked, span.clone())
        });
    }

    /// Records the outcomes held after a database failure, oldest first, and those held for
    /// rows another transaction has locked when their next try is due (all of them when
    /// stopping); a row still locked is held again. Stops at the first failure, which keeps
    /// the rest held. Also used at shutdown.
    pub async fn record_held(&self) -> Result<BatchReport, DispatchError> {
        let mut total = self.finish_waiter().await;
        let mut later = Vec::new();
        let mut held = std::mem::take(&mut *lock(&self.unrecorded)).into_iter();
        while let Some(mut next) = held.next() {
            let due = next.locked_at.is_none_or(|at| at.elapsed() >= LOCKED_RETRY);
            if !due && !self.shutdown.stop.is_cancelled() {
                later.push(next);
                continue;
            }
            if next.locked_at.is_some() && !self.shutdown.stop.is_cancelled() {
                match self.start_waiter(next) {
                    None => continue,
                    Some(not_started) => next = not_started,
                }
            }
            let recorded = self
                .record_outcomes(&next.claimed, &next.decided, next.row_locks())
                .instrument(next.span.clone())
                .await;
            match recorded {
                Ok((report, locked)) => {
                    total.add(&report);
                    let first = next.locked_at.is_none();
                    self.hold_locked(&next.claimed, locked, &next.span, first);
                }
                Err(e) => {
                    // Before anything held meanwhile: oldest first.
                    let rest = later.into_iter().chain(std::iter::once(next)).chain(held);
                    lock(&self.unrecorded).splice(0..0, rest);
                    return Err(e);
                }
            }
        }
        lock(&self.unrecorded).splice(0..0, later);
        Ok(total)
    }

    /// Whether outcomes are held for rows another transaction has locked.
    pub(super) fn holds_locked(&self) -> bool {
        lock(&self.lock_waiter).is_some()
            || lock(&self.unrecorded)
                .iter()
                .any(|unrecorded| unrecorded.locked_at.is_some())
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn held_outcomes(&self) -> usize {
        let waiting = lock(&self.lock_waiter)
            .as_ref()
            .map_or(0, |waiter| waiter.held.decided.len());
        waiting
            + lock(&self.unrecorded)
                .iter()
                .map(|unrecorded| unrecorded.decided.len())
                .sum::<usize>()
    }

    /// Hands outcomes held for locked rows to a task that waits for the locks, unless one
    /// already waits: then they are given back, to be tried again skipping locked rows.
    fn start_waiter(&self, held: Unrecorded) -> Option<Unrecorded> {
        let mut waiter = lock(&self.lock_waiter);
        if waiter.is_some() {
            return Some(held);
        }
        let rows = self.outcome_rows(&held.claimed, &held.decided);
        let write =
            store::record_outcomes_when_unlocked(self.database.pool(), held.claimed.token, &rows);
        *waiter = Some(LockWaiter {
            task: tokio::spawn(write.instrument(held.span.clone())),
            held,
        });
        None
    }

    /// What the waiting task came to, once it has ended: its outcomes reported, or held
    /// again if it failed.
    async fn finish_waiter(&self) -> BatchReport {
        let ended = {
            let mut waiter = lock(&self.lock_waiter);
            match waiter.as_ref() {
                Some(w) if w.task.is_finished() || self.shutdown.stop.is_cancelled() => {
                    waiter.take()
                }
                _ => None,
            }
        };
        let Some(LockWaiter { held, task }) = ended else {
            return BatchReport::default();
        };
        task.abort();
        match task.await {
            Ok(Ok(recorded)) => {
                let (report, _) = self.report_outcomes(&held.claimed, &held.decided, recorded);
                report
            }
            failed => {
                if let Ok(Err(e)) = failed {
                    debug!(error = %e, "the write waiting on row locks failed; trying again");
                }
                lock(&self.unrecorded).push(held);
                BatchReport::default()
            }
        }
    }
}
