//! Recording: the one place outcomes are written, logged and counted, so the metrics can
//! never drift from the table; outcomes written as the sends end, and held across a
//! database failure.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{Instrument as _, debug, error, info, warn};

use super::batch::{
    BatchReport, Chunk, Decided, LOCKED_RETRY, OutcomeQueue, SentBatch, Unrecorded,
};
use super::{DispatchError, Dispatcher};
use crate::lock::lock;
use crate::message::{ClaimedBatch, ClaimedMessage, Delivery, Outcome};
use crate::store::{self, RowLocks};
use crate::suppression::{BounceType, FeedbackSource};
use crate::telemetry::metrics::DatabaseOperation;
use crate::text::mask_addresses;

/// Outcomes whose rows another transaction has locked, being written by a task that waits
/// for the locks on a connection of its own.
pub(super) struct LockWaiter {
    held: Unrecorded,
    task: tokio::task::JoinHandle<Result<store::Recorded, sqlx::Error>>,
}

impl Dispatcher {
    /// Writes a batch's outcomes as the sends hand them over, a few milliseconds' worth at a
    /// time (see [`OutcomeQueue::next_chunk`]); returns what it wrote and what was left
    /// when the sends ended. After a database failure the rest of the batch's outcomes are
    /// collected and held for [`Self::record_held`].
    pub(super) async fn record_as_they_come(
        &self,
        claimed: &ClaimedBatch,
        outcomes: &OutcomeQueue,
        span: tracing::Span,
    ) -> Result<(BatchReport, Vec<Decided>), DispatchError> {
        let mut report = BatchReport::default();
        let mut failed: Option<(DispatchError, Vec<Decided>)> = None;
        loop {
            let (chunk, last) = match outcomes.next_chunk().await {
                Chunk::Write(chunk) => (chunk, false),
                Chunk::Rest(chunk) => (chunk, true),
            };
            if let Some((e, mut held)) = failed.take() {
                held.extend(chunk);
                if last {
                    self.hold(Unrecorded::new(claimed.clone(), held, span));
                    return Err(e);
                }
                failed = Some((e, held));
                continue;
            }
            if last {
                return Ok((report, chunk));
            }
            match self
                .record_outcomes(claimed, &chunk, RowLocks::WaitBriefly)
                .await
            {
                Ok((recorded, locked)) => {
                    report.add(&recorded);
                    self.hold_locked(claimed, locked, &span, true);
                }
                Err(e) => failed = Some((e, chunk)),
            }
        }
    }

    /// Writes a sent batch's last outcomes, and opens the circuit if it met an outage.
    pub(super) async fn finish_batch(&self, sent: SentBatch) -> Result<BatchReport, DispatchError> {
        let SentBatch {
            mut report,
            rest,
            outage,
        } = sent;
        if outage {
            self.breaker.open(&self.metrics);
        }
        let span = rest.span.clone();
        let recorded = self
            .record_decided(&rest.claimed, rest.decided, rest.span)
            .instrument(span)
            .await;
        self.metrics.cycle_completed();
        report.add(&recorded?);
        Ok(report)
    }

    /// Writes outcomes decided at once (releases at the end of a batch), holding them if
    /// the database does not take them.
    pub(super) async fn record_decided(
        &self,
        claimed: &ClaimedBatch,
        decided: Vec<Decided>,
        span: tracing::Span,
    ) -> Result<BatchReport, DispatchError> {
        if decided.is_empty() {
            return Ok(BatchReport::default());
        }
        match self
            .record_outcomes(claimed, &decided, RowLocks::WaitBriefly)
            .await
        {
            Ok((report, locked)) => {
                self.hold_locked(claimed, locked, &span, true);
                Ok(report)
            }
            Err(e) => {
                self.hold(Unrecorded::new(claimed.clone(), decided, span));
                Err(e)
            }
        }
    }

    pub(super) fn hold(&self, unrecorded: Unrecorded) {
        warn!(
            messages = unrecorded.decided.len(),
            "could not record the outcomes of sent messages; holding them to record before the next claim"
        );
        lock(&self.unrecorded).push(unrecorded);
    }

    /// Holds outcomes whose rows another transaction has locked, to write again before the
    /// next claim; says so the first time, and only at debug level on every try after.
    fn hold_locked(
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

    /// Writes outcomes of one claim, where its token still holds the row and no other
    /// transaction has locked it.
    async fn write_outcomes(
        &self,
        claimed: &ClaimedBatch,
        decided: &[Decided],
        locks: RowLocks,
    ) -> Result<store::Recorded, DispatchError> {
        let rows = self.outcome_rows(claimed, decided);
        self.database
            .record_outcomes(claimed.token, &rows, locks)
            .await
            .map_err(DispatchError::database(DatabaseOperation::Record))
    }

    fn outcome_rows<'a>(
        &self,
        claimed: &ClaimedBatch,
        decided: &'a [Decided],
    ) -> Vec<store::OutcomeRow<'a>> {
        decided
            .iter()
            .map(|d| store::OutcomeRow {
                id: claimed.messages[d.index].id,
                outcome: &d.outcome,
                bounced: d.bounced.as_deref(),
                suppress: self.settings.suppress_hard_bounces,
            })
            .collect()
    }

    /// Writes outcomes of one claim (only where its token still holds the row), then logs
    /// and counts each one that was written: the one place outcomes are reported, so the
    /// metrics cannot drift from the table. Returns, besides, the outcomes of rows another
    /// transaction has locked, neither written nor counted yet.
    async fn record_outcomes(
        &self,
        claimed: &ClaimedBatch,
        decided: &[Decided],
        locks: RowLocks,
    ) -> Result<(BatchReport, Vec<Decided>), DispatchError> {
        let recorded = self.write_outcomes(claimed, decided, locks).await?;
        Ok(self.report_outcomes(claimed, decided, recorded))
    }

    /// Logs and counts each outcome written, and each lost to another claimer; returns the
    /// outcomes of locked rows, neither.
    fn report_outcomes(
        &self,
        claimed: &ClaimedBatch,
        decided: &[Decided],
        store::Recorded { written, locked }: store::Recorded,
    ) -> (BatchReport, Vec<Decided>) {
        let (written, locked): (HashSet<i64>, HashSet<i64>) =
            (written.into_iter().collect(), locked.into_iter().collect());
        let (locked, decided): (Vec<&Decided>, Vec<&Decided>) = decided
            .iter()
            .partition(|d| locked.contains(&claimed.messages[d.index].id));
        let mut report = BatchReport {
            claimed: decided.len(),
            ..BatchReport::default()
        };
        for Decided {
            index,
            outcome,
            after,
            bounced,
        } in decided
        {
            let message = &claimed.messages[*index];
            let (id, kind) = (message.id, message.kind.as_str());
            if message.reclaimed {
                report.reclaimed += 1;
                self.metrics.reclaimed();
                warn!(outbox.id = id, outbox.kind = %kind, "took over a row whose previous lease ran out");
            }
            if !written.contains(&id) {
                report.lost += 1;
                self.metrics.lease_lost();
                warn!(
                    outbox.id = id,
                    outbox.kind = %kind,
                    outcome = outcome.action(),
                    "outcome not recorded: the lease was lost to another claimer"
                );
                continue;
            }
            // Due-to-accepted latency on the database's clock, plus the time the send took.
            let sent_latency = matches!(
                outcome,
                Outcome::Sent {
                    via: Delivery::Smtp
                }
            )
            .then(|| latency(claimed, message, *after));
            self.metrics.outcome(kind, outcome, sent_latency);
            if bounced.is_some() {
                self.metrics.bounce(FeedbackSource::Smtp, BounceType::Hard);
            }
            count(&mut report, outcome);
            log_outcome(message, outcome, sent_latency);
        }
        (report, locked.into_iter().cloned().collect())
    }
}

/// From when the message fell due to when the server accepted it.
fn latency(claimed: &ClaimedBatch, message: &ClaimedMessage, after: Duration) -> Duration {
    let sent_at = claimed.claimed_at + chrono::Duration::from_std(after).unwrap_or_default();
    (sent_at - message.due_at).to_std().unwrap_or_default()
}

fn count(report: &mut BatchReport, outcome: &Outcome) {
    match outcome {
        Outcome::Sent { .. } => report.sent += 1,
        Outcome::Retry { .. } => report.retried += 1,
        Outcome::DeadLetter { .. } => report.dead_lettered += 1,
        Outcome::Release { .. } => report.released += 1,
        Outcome::Expired => report.expired += 1,
        Outcome::Suppressed { .. } => report.suppressed += 1,
    }
}

/// One line per recorded outcome; never a recipient address.
fn log_outcome(message: &ClaimedMessage, outcome: &Outcome, latency: Option<Duration>) {
    let (id, kind) = (message.id, message.kind.as_str());
    let attempts = message.attempts.saturating_add(1);
    match outcome {
        // Debug, not info: at the default level a line per sent message cost about a sixth
        // of the drain's CPU (BENCHMARKS.md); failures and dead letters are still logged.
        Outcome::Sent {
            via: Delivery::Smtp,
        } => debug!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            latency_seconds = latency.unwrap_or_default().as_secs_f64(),
            "sent"
        ),
        Outcome::Sent {
            via: Delivery::LoggedOnly,
        } => warn!(
            outbox.id = id,
            outbox.kind = %kind,
            "NOT SENT: no SMTP server is configured; marked dispatched"
        ),
        Outcome::Retry { error, delay, .. } => warn!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            retry_in = %humantime::format_duration(*delay),
            error = %mask_addresses(error),
            "send failed; will retry"
        ),
        Outcome::DeadLetter {
            error,
            failure_type,
            ..
        } => error!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            class = failure_type.as_str(),
            error = %mask_addresses(error),
            "dead-lettered"
        ),
        Outcome::Release { reason, .. } => {
            debug!(outbox.id = id, outbox.kind = %kind, reason = reason.as_str(), "released unsent");
        }
        Outcome::Expired => info!(outbox.id = id, outbox.kind = %kind, "expired unsent"),
        Outcome::Suppressed { reason, .. } => info!(
            outbox.id = id,
            outbox.kind = %kind,
            reason = reason.as_str(),
            "not sent: every recipient is suppressed"
        ),
    }
}
