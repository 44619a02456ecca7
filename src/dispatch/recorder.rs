//! The recorder: the one place outcomes are written, logged and counted, so the metrics can
//! never drift from the table. Outcomes are written as the sends end; what the database
//! does not take, or cannot take yet because another transaction locks the rows, is held
//! (see `held`) and written later by the same functions.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{Instrument as _, debug, warn};

use super::DispatchError;
use super::batch::HeldOutcomes;
use super::batch::{BatchReport, Decided};
use super::held::{Held, LockWaiter};
use super::outcome_log::{latency, log_outcome};
use super::queue::{Chunk, OutcomeQueue};
use crate::lock::lock;
use crate::message::{ClaimedBatch, Delivery, Outcome};
use crate::store::{self, KeptConnection};
use crate::suppression::Address;
use crate::suppression::{BounceType, FeedbackSource};
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

pub(super) struct Recorder {
    database: Arc<KeptConnection>,
    metrics: Arc<Metrics>,
    /// Add a recipient the server said does not exist to the suppression list.
    suppress_hard_bounces: bool,
    /// The replica's worker id: which replica sent a message, or met a failure with it.
    worker_id: String,
    held: Held,
    /// When the retries this replica wrote fall due: the loop wakes at each rather than
    /// at the next poll. Shared: in a drain, a batch's outcomes, the batch before's last
    /// ones and the held ones are written by futures joined on the loop's task.
    retries_due: std::sync::Mutex<Vec<Instant>>,
}

impl Recorder {
    pub fn new(
        database: Arc<KeptConnection>,
        metrics: Arc<Metrics>,
        suppress: bool,
        worker_id: String,
    ) -> Self {
        Self {
            database,
            metrics,
            suppress_hard_bounces: suppress,
            worker_id,
            held: Held::default(),
            retries_due: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// When the retries written since the last call fall due.
    pub fn take_retries_due(&self) -> Vec<Instant> {
        std::mem::take(&mut *lock(&self.retries_due))
    }

    /// Counts a written outcome; a retry's due time is remembered for the loop.
    fn count(&self, report: &mut BatchReport, outcome: &Outcome) {
        report.count(outcome);
        if let Outcome::Retry { delay, .. } = outcome {
            lock(&self.retries_due).push(Instant::now() + *delay);
        }
    }

    /// Writes a batch's outcomes as the sends hand them over, a few milliseconds' worth at a
    /// time (see [`OutcomeQueue::next_chunk`]); returns what it wrote and what was left
    /// when the sends ended. After a database failure the rest of the batch's outcomes are
    /// collected and held.
    pub async fn record_as_they_come(
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
                    self.hold(HeldOutcomes::new(claimed.clone(), held, span));
                    return Err(e);
                }
                failed = Some((e, held));
                continue;
            }
            if last {
                return Ok((report, chunk));
            }
            let held = HeldOutcomes::new(claimed.clone(), chunk, span.clone());
            match self.write(held).await {
                Ok(written) => report.add(&written),
                Err((e, held)) => failed = Some((e, held.decided)),
            }
        }
    }

    /// Writes outcomes of one claim, holding them if the database does not take them.
    pub async fn record(&self, held: HeldOutcomes) -> Result<BatchReport, DispatchError> {
        let span = held.span.clone();
        match self.write(held).instrument(span).await {
            Ok(report) => Ok(report),
            Err((e, held)) => {
                self.hold(held);
                Err(e)
            }
        }
    }

    /// Writes the held outcomes that are due (all of them when stopping), oldest first; a
    /// row still locked is held again, and the first failure keeps the rest held.
    pub async fn record_held(&self, stopping: bool) -> Result<BatchReport, DispatchError> {
        let mut total = self.finish_waiter(stopping).await;
        let mut due = self.held.take_due(stopping).into_iter();
        while let Some(next) = due.next() {
            let next = match next.is_locked() && !stopping {
                true => match self
                    .held
                    .wait_for_locks(next, |held| self.wait_for_locks(held))
                {
                    None => continue,
                    Some(already_waiting) => already_waiting,
                },
                false => next,
            };
            let span = next.span.clone();
            match self.write(next).instrument(span).await {
                Ok(report) => total.add(&report),
                Err((e, next)) => {
                    self.held.put_back(std::iter::once(next).chain(due));
                    return Err(e);
                }
            }
        }
        Ok(total)
    }

    /// Whether outcomes are held for rows another transaction has locked.
    pub fn holds_locked(&self) -> bool {
        self.held.holds_locked()
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn held_outcomes(&self) -> usize {
        self.held.messages()
    }

    /// Holds outcomes the database did not take, to write before the next claim.
    pub fn hold(&self, held: HeldOutcomes) {
        if held.decided.is_empty() {
            return;
        }
        warn!(
            messages = held.decided.len(),
            "could not record the outcomes of sent messages; holding them to record before the next claim"
        );
        self.held.push(held);
    }

    /// Writes outcomes (only where the claim's token still holds the row), then logs and
    /// counts each one written; those of rows another transaction locks are held. On a
    /// failure, gives the outcomes back, unwritten.
    async fn write(
        &self,
        held: HeldOutcomes,
    ) -> Result<BatchReport, (DispatchError, HeldOutcomes)> {
        let rows = self.outcome_rows(&held);
        let written = self
            .database
            .record_outcomes(held.claimed.token, &self.worker_id, &rows, held.row_locks())
            .await;
        match written {
            Ok(recorded) => Ok(self.report(held, recorded)),
            Err(e) => Err((
                DispatchError::Database {
                    operation: DatabaseOperation::Record,
                    source: e,
                },
                held,
            )),
        }
    }

    fn outcome_rows<'a>(&self, held: &'a HeldOutcomes) -> Vec<store::OutcomeRow<'a>> {
        held.decided
            .iter()
            .map(|d| store::OutcomeRow {
                id: held.claimed.messages[d.index].id,
                outcome: &d.outcome,
                took: d.took,
                bounced: d.bounced.as_ref().map(Address::as_str),
                suppress: self.suppress_hard_bounces,
            })
            .collect()
    }

    /// A task that writes outcomes as soon as another transaction's locks on their rows
    /// are gone, on a connection of its own.
    fn wait_for_locks(
        &self,
        held: &HeldOutcomes,
    ) -> tokio::task::JoinHandle<Result<store::Recorded, sqlx::Error>> {
        let rows = self.outcome_rows(held);
        let write = store::record_outcomes_when_unlocked(
            self.database.store(),
            held.claimed.token,
            &self.worker_id,
            &rows,
        );
        tokio::spawn(write.instrument(held.span.clone()))
    }

    /// What the task waiting on row locks came to, once it has ended: its outcomes
    /// reported, or held again if it failed.
    async fn finish_waiter(&self, stopping: bool) -> BatchReport {
        let Some(LockWaiter { held, task }) = self.held.ended_waiter(stopping) else {
            return BatchReport::default();
        };
        task.abort();
        match task.await {
            Ok(Ok(recorded)) => self.report(held, recorded),
            failed => {
                if let Ok(Err(e)) = failed {
                    debug!(error = %e, "the write waiting on row locks failed; trying again");
                }
                self.held.push(held);
                BatchReport::default()
            }
        }
    }

    /// Logs and counts each outcome written, and each lost to another claimer; holds the
    /// outcomes of locked rows, neither logged nor counted yet.
    fn report(&self, held: HeldOutcomes, recorded: store::Recorded) -> BatchReport {
        let written: HashSet<i64> = recorded.written.into_iter().collect();
        let locked: HashSet<i64> = recorded.locked.into_iter().collect();
        // Said once: not again on every try after.
        let first = !held.is_locked();
        let HeldOutcomes {
            claimed,
            decided,
            span,
            ..
        } = held;
        let (locked, decided): (Vec<Decided>, Vec<Decided>) = decided
            .into_iter()
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
            ..
        } in &decided
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
                    via: Delivery::Smtp,
                    ..
                }
            )
            .then(|| latency(&claimed, message, *after));
            self.metrics.outcome(kind, outcome, sent_latency);
            if bounced.is_some() {
                self.metrics.bounce(FeedbackSource::Smtp, BounceType::Hard);
            }
            self.count(&mut report, outcome);
            log_outcome(message, outcome, sent_latency);
        }
        self.hold_locked(HeldOutcomes::locked(claimed, locked, span), first);
        report
    }

    /// Holds outcomes whose rows another transaction has locked; says so the first time,
    /// and only at debug level on every try after.
    fn hold_locked(&self, held: HeldOutcomes, first: bool) {
        if held.decided.is_empty() {
            return;
        }
        let ids: Vec<i64> = held
            .decided
            .iter()
            .map(|d| held.claimed.messages[d.index].id)
            .collect();
        if first {
            warn!(
                outbox.ids = ?ids,
                "outcome not recorded yet: another transaction has locked the row; recording it when the lock is gone"
            );
        } else {
            debug!(outbox.ids = ?ids, "the row is still locked by another transaction");
        }
        self.held.push(held);
    }
}
