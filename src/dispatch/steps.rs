//! One batch through the stages: claimed (after the held outcomes are written and while the
//! circuit is closed), sent while the recorder writes its outcomes as they come, and
//! finished with its last outcomes written.

use chrono::{DateTime, Utc};
use futures_util::future::join;
use tracing::{Instrument as _, debug};

use std::sync::Arc;

use super::batch::HeldOutcomes;
use super::batch::{BatchReport, Claiming, LeasedBatch, NextBatch, SentBatch};
use super::claimer::Claimer;
use super::recorder::Recorder;
use super::sender::Sender;
use super::{DispatchError, Shutdown, Step};
use crate::telemetry::metrics::Metrics;

/// The stages after the claim: in a drain, a batch's sends, the writing of the batch
/// before's last outcomes and the next claim (which writes held outcomes first and asks
/// the circuit) run joined, and share these by reference.
pub(super) struct Delivery {
    pub sender: Sender,
    pub recorder: Recorder,
    pub shutdown: Shutdown,
    pub metrics: Arc<Metrics>,
}

/// Claims the next batch of the lanes whose SMTP circuit is closed, unless shutting down or
/// every circuit is open. Outcomes held
/// after a database failure are recorded first, and those held for locked rows tried again
/// when due.
pub(super) async fn claim_next(
    claimer: &mut Claimer,
    delivery: &Delivery,
    due_by: Option<DateTime<Utc>>,
) -> Result<NextBatch, DispatchError> {
    if delivery.shutdown.stop.is_cancelled() {
        return Ok(NextBatch::Halt(Step::Stopped));
    }
    delivery.recorder.record_held(false).await?;
    let lanes = match delivery.sender.closed_lanes().await {
        Ok(lanes) => lanes,
        Err(retry_in) => return Ok(NextBatch::Halt(Step::CircuitOpen { retry_in })),
    };
    let mut claim = match claimer.claim(due_by, &lanes).await? {
        Claiming::Rows(claim) => *claim,
        Claiming::NothingDue => return Ok(NextBatch::Empty),
        Claiming::Paced(at) => return Ok(NextBatch::Paced(at)),
    };
    // Nothing is sent without the batch's suppressed addresses: on a failure the rows
    // go back at once (or are held, if the database does not take that either), and
    // the error makes the loop back off as after any database failure, rather than
    // claim them again in a tight loop.
    match claimer.suppressed(&mut claim).await {
        Ok(suppressed) => Ok(NextBatch::Leased(Box::new(LeasedBatch {
            claim,
            suppressed,
        }))),
        Err(e) => {
            let releases = claim.releases();
            let held = HeldOutcomes::new(claim.claimed, releases, tracing::Span::none());
            if let Err(held) = delivery.recorder.record(held).await {
                debug!(error = %held, "the releases are held to record before the next claim");
            }
            Err(e)
        }
    }
}

impl Delivery {
    /// Sends a leased batch; its outcomes are written as the sends end, a few milliseconds'
    /// worth at a time, so one slow message never holds its batch-mates' outcomes. Returns
    /// when the sends are over, with the last outcomes still to write (the drain writes
    /// them while the next batch is sent).
    pub(super) async fn send_batch(
        &self,
        leased: Box<LeasedBatch>,
    ) -> Result<SentBatch, DispatchError> {
        let (claimed, batch, span) = self.sender.in_flight(*leased);
        // The sends are polled before the recorder in every pass (`join`, unlike
        // `tokio::join!`, keeps that order), so the recorder sees the queue closed in the
        // pass the sends end: closing it need not wake this task, which tokio would hand to
        // its other thread (BENCHMARKS.md, *Steady traffic*).
        let (rest, recorded) = join(
            async {
                self.sender.send_concurrently(&batch).await;
                // Sends never started, or given up at the shutdown bound, are released.
                batch.outcomes.close(batch.lease_start.elapsed())
            },
            self.recorder
                .record_as_they_come(&claimed, &batch.outcomes, span.clone()),
        )
        .instrument(span.clone())
        .await;
        let outages = batch.routes.outages();
        match recorded {
            Ok((report, mut decided)) => {
                decided.extend(rest);
                Ok(SentBatch {
                    report,
                    rest: HeldOutcomes::new(claimed, decided, span),
                    outages,
                })
            }
            Err(e) => {
                // What the recorder had is held already; the releases join it.
                self.recorder.hold(HeldOutcomes::new(claimed, rest, span));
                self.sender.open_circuits(&outages);
                Err(e)
            }
        }
    }

    /// Writes a sent batch's last outcomes, and opens the circuit if it met an outage.
    pub(super) async fn finish_batch(&self, sent: SentBatch) -> Result<BatchReport, DispatchError> {
        let SentBatch {
            mut report,
            rest,
            outages,
        } = sent;
        self.sender.open_circuits(&outages);
        let recorded = self.recorder.record(rest).await;
        self.metrics.cycle_completed();
        report.add(&recorded?);
        report.log();
        Ok(report)
    }

    /// A sent batch whose last outcomes cannot be written now: held for the next claim, and
    /// the circuit opened if it met an outage.
    pub(super) fn set_aside(&self, sent: SentBatch) {
        self.sender.open_circuits(&sent.outages);
        self.recorder.hold(sent.rest);
    }
}
