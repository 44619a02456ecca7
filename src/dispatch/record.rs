//! Recording: the one place outcomes are written, logged and counted, so the metrics can
//! never drift from the table; and outcomes held across a database failure.

use std::collections::HashSet;
use std::time::Duration;

use tracing::{Instrument as _, debug, error, info, warn};

use super::batch::{AttemptedBatch, BatchReport};
use super::{DispatchError, Dispatcher};
use crate::lock::lock;
use crate::message::{ClaimedMessage, Delivery, Outcome};
use crate::store;
use crate::telemetry::metrics::DatabaseOperation;
use crate::text::mask_addresses;

impl Dispatcher {
    /// Records an attempted batch's outcomes, and opens the circuit if the batch met an
    /// outage. Outcomes the database did not take are held for [`Self::record_held`].
    pub(super) async fn record_batch(
        &self,
        attempted: AttemptedBatch,
    ) -> Result<BatchReport, DispatchError> {
        let claimed = &attempted.claimed;
        // Due-to-accepted latency on the database's clock, plus the time the sends took.
        let sent_at = claimed.claimed_at + attempted.since_claim;
        let latency =
            |message: &ClaimedMessage| (sent_at - message.due_at).to_std().unwrap_or_default();
        let recorded = self
            .record_outcomes(
                claimed.token,
                &claimed.messages,
                &attempted.outcomes,
                latency,
            )
            .instrument(attempted.span.clone())
            .await;
        let report = match recorded {
            Ok(report) => report,
            Err(e) => {
                self.hold(attempted);
                return Err(e);
            }
        };
        if attempted.outage {
            self.breaker.open(&self.metrics);
        }
        self.metrics.cycle_completed();
        Ok(report)
    }

    pub(super) fn hold(&self, attempted: AttemptedBatch) {
        warn!(
            messages = attempted.claimed.messages.len(),
            "could not record the outcomes of a sent batch; holding them to record before the next claim"
        );
        lock(&self.unrecorded).push(attempted);
    }

    /// Records outcomes held after a database failure, oldest first; stops at the first
    /// failure, which keeps the rest held. Also used at shutdown.
    pub async fn record_held(&self) -> Result<BatchReport, DispatchError> {
        let mut total = BatchReport::default();
        loop {
            let next = {
                let mut held = lock(&self.unrecorded);
                if held.is_empty() {
                    return Ok(total);
                }
                held.remove(0)
            };
            total.add(&self.record_batch(next).await?);
        }
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn held_outcomes(&self) -> usize {
        lock(&self.unrecorded)
            .iter()
            .map(|attempted| attempted.claimed.messages.len())
            .sum()
    }

    /// Writes the outcomes of one claim (only where its token still holds the row), then
    /// logs and counts each one that was written.
    async fn record_outcomes(
        &self,
        token: uuid::Uuid,
        messages: &[ClaimedMessage],
        outcomes: &[Outcome],
        latency: impl Fn(&ClaimedMessage) -> Duration,
    ) -> Result<BatchReport, DispatchError> {
        let rows: Vec<(i64, &Outcome)> = messages.iter().map(|m| m.id).zip(outcomes).collect();
        let recorded: HashSet<i64> = store::record_outcomes(&self.pool, token, &rows)
            .await
            .map_err(DispatchError::database(DatabaseOperation::Record))?
            .into_iter()
            .collect();
        let mut report = BatchReport {
            claimed: messages.len(),
            ..BatchReport::default()
        };
        for (message, outcome) in messages.iter().zip(outcomes) {
            let (id, kind) = (message.id, message.kind.as_str());
            if message.reclaimed {
                report.reclaimed += 1;
                self.metrics.reclaimed();
                warn!(outbox.id = id, outbox.kind = %kind, "took over a row whose previous lease ran out");
            }
            if !recorded.contains(&id) {
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
            let sent_latency = matches!(
                outcome,
                Outcome::Sent {
                    via: Delivery::Smtp
                }
            )
            .then(|| latency(message));
            self.metrics.outcome(kind, outcome, sent_latency);
            count(&mut report, outcome);
            log_outcome(message, outcome, sent_latency);
        }
        Ok(report)
    }
}

fn count(report: &mut BatchReport, outcome: &Outcome) {
    match outcome {
        Outcome::Sent { .. } => report.sent += 1,
        Outcome::Retry { .. } => report.retried += 1,
        Outcome::DeadLetter { .. } => report.dead_lettered += 1,
        Outcome::Release { .. } => report.released += 1,
    }
}

/// One line per recorded outcome; never a recipient address.
fn log_outcome(message: &ClaimedMessage, outcome: &Outcome, latency: Option<Duration>) {
    let (id, kind, attempts) = (message.id, message.kind.as_str(), message.attempts + 1);
    match outcome {
        Outcome::Sent {
            via: Delivery::Smtp,
        } => info!(
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
            error, permanence, ..
        } => error!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            class = permanence.as_str(),
            error = %mask_addresses(error),
            "dead-lettered"
        ),
        Outcome::Release { reason, .. } => {
            debug!(outbox.id = id, outbox.kind = %kind, reason = reason.as_str(), "released unsent");
        }
    }
}
