//! Recording: the one place outcomes are written, logged and counted, so the metrics can
//! never drift from the table; outcomes written as the sends end. What the database does
//! not take is held (see `held`).

use std::collections::HashSet;
use std::time::Duration;

use tracing::{Instrument as _, debug, error, info, warn};

use super::batch::{BatchReport, Chunk, Decided, OutcomeQueue, SentBatch, Unrecorded};
use super::{DispatchError, Dispatcher};
use crate::message::{ClaimedBatch, ClaimedMessage, Delivery, Outcome};
use crate::store::{self, RowLocks};
use crate::suppression::{BounceType, FeedbackSource};
use crate::telemetry::metrics::DatabaseOperation;
use crate::text::mask_addresses;

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

    pub(super) fn outcome_rows<'a>(
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
    pub(super) async fn record_outcomes(
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
    pub(super) fn report_outcomes(
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
