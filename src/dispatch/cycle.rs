//! The loop and its public single steps: [`Dispatcher::run`] waits and drains until
//! shutdown; [`Dispatcher::drain`] claims batches while they come back full;
//! [`Dispatcher::dispatch_once`] claims, sends and records one batch, for tests to drive.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::batch::{BatchReport, LOCKED_RETRY, LeasedBatch, NextBatch, SentBatch};
use super::pace::Allowance;
use super::wake::{OUTAGE_BACKOFF, Wakeups, Woken};
use super::{DispatchError, Dispatcher, Step};
use crate::message::ClaimedBatch;
use crate::store::ClaimRequest;
use crate::telemetry::metrics::DatabaseOperation;

impl Dispatcher {
    /// Claims one batch of due rows, sends it and records every outcome.
    pub async fn dispatch_once(&self) -> Result<Step, DispatchError> {
        Ok(match self.claim_next(None).await? {
            NextBatch::Halt(step) => step,
            NextBatch::Empty => Step::Batch(BatchReport::default()),
            NextBatch::Leased(leased) => {
                let sent = self.send_batch(leased).await?;
                Step::Batch(self.finish_batch(sent).await?)
            }
        })
    }

    /// Dispatches batches until one comes back short, as the original design did. Rows
    /// that fall due during the drain (new ones, or retries with no delay) wait for the
    /// next cycle, so a failing message is not retried in a tight loop. After a full batch
    /// the next one is claimed while this one is sent, so no connection waits on the
    /// database.
    pub async fn drain(&self) -> Result<Step, DispatchError> {
        let mut total = BatchReport::default();
        let mut due_by = None;
        let mut previous: Option<SentBatch> = None;
        let mut next = self.claim_next(None).await?;
        while let NextBatch::Leased(leased) = next {
            due_by = due_by.or(Some(leased.claimed.claimed_at));
            let full = leased.claimed.messages.len() >= leased.requested as usize;
            let (sent, finished, following) = tokio::join!(
                self.send_batch(leased),
                async {
                    match previous.take() {
                        Some(previous) => self.finish_batch(previous).await.map(Some),
                        None => Ok(None),
                    }
                },
                async {
                    if full {
                        self.claim_next(due_by).await.map(Some)
                    } else {
                        Ok(None)
                    }
                },
            );
            // On a database error, the outcomes not written are held (and written before
            // the next claim); a batch claimed meanwhile comes back when its lease ends.
            let sent = match (sent, finished) {
                (Ok(sent), Ok(report)) => {
                    total.add(&report.unwrap_or_default());
                    sent
                }
                (Ok(sent), Err(e)) => {
                    self.set_aside(sent);
                    return Err(e);
                }
                (Err(e), _) => return Err(e),
            };
            match following {
                Ok(Some(following)) => {
                    previous = Some(sent);
                    next = following;
                }
                Ok(None) => {
                    total.add(&self.finish_batch(sent).await?);
                    return Ok(Step::Batch(total));
                }
                Err(e) => {
                    // The claim failed; the batch just sent still gets its last outcomes
                    // written, or held if the database is gone too.
                    if let Err(also) = self.finish_batch(sent).await {
                        debug!(error = %also, "the last outcomes of a batch are held");
                    }
                    return Err(e);
                }
            }
        }
        if let Some(previous) = previous {
            total.add(&self.finish_batch(previous).await?);
        }
        Ok(match next {
            NextBatch::Halt(step) if total.claimed == 0 => step,
            _ => Step::Batch(total),
        })
    }

    /// A sent batch whose last outcomes cannot be written now: held for the next claim, and
    /// the circuit opened if it met an outage.
    fn set_aside(&self, sent: SentBatch) {
        if sent.outage {
            self.breaker.open(&self.metrics);
        }
        self.hold(sent.rest);
    }

    /// Runs until shutdown: drain, then wait for a notification, the poll interval, the
    /// circuit breaker's next probe, or a database back-off. Never returns an error:
    /// database and SMTP outages are waited out.
    pub async fn run(&self) {
        let mut wakeups = Wakeups::new(self.database.pool().clone(), self.metrics.clone());
        let mut database_failures = 0_u32;
        info!(
            worker_id = %self.settings.worker_id,
            poll_interval = %humantime::format_duration(self.settings.poll_interval),
            linger = %humantime::format_duration(self.settings.linger),
            batch_size = self.settings.batch_size,
            concurrency = self.settings.concurrency,
            "dispatcher started"
        );
        while !self.shutdown.stop.is_cancelled() {
            wakeups.listen(&self.floor).await;
            let drained = self.drain().await;
            let Some((wait, notified)) = self.next_wait(drained, &mut database_failures) else {
                break;
            };
            // Every wait ends within a poll interval, so the heartbeat the liveness probe
            // reads keeps beating through SMTP and database outages.
            self.metrics.cycle_completed();
            // Outcomes held for locked rows are tried again every second, even when idle:
            // an application's commit sends no notification.
            let wait = match self.holds_locked() {
                true => wait.min(self.settings.poll_interval).min(LOCKED_RETRY),
                false => wait.min(self.settings.poll_interval),
            };
            let woken = wakeups
                .wait(wait, notified, &self.shutdown.stop, &self.floor)
                .await;
            match woken {
                Woken::Stopped => break,
                Woken::Heard => {
                    wakeups
                        .linger(self.settings.linger, &self.shutdown.stop, &self.floor)
                        .await;
                }
                Woken::Look => {}
            }
        }
        match self.record_held().await {
            Err(e) => error!(
                error = %e,
                messages = self.held_outcomes(),
                "could not record the outcomes of sent messages; they will be sent again when their lease ends"
            ),
            Ok(_) if self.held_outcomes() > 0 => error!(
                messages = self.held_outcomes(),
                "could not record the outcomes of sent messages whose rows another transaction still locks; they will be sent again when their lease ends"
            ),
            Ok(_) => {}
        }
        self.release_connection();
        info!("dispatcher stopped");
    }

    /// Gives back the connection kept between statements: the pool cannot close while it
    /// is out. [`Self::run`] does so as it ends; a caller of [`Self::dispatch_once`] or
    /// [`Self::drain`], or of a `run` that panicked, must before closing the pool.
    pub fn release_connection(&self) {
        self.database.release();
    }

    /// How long to wait after a drain, and whether a notification ends the wait; `None`
    /// when stopping.
    fn next_wait(
        &self,
        drained: Result<Step, DispatchError>,
        database_failures: &mut u32,
    ) -> Option<(Duration, bool)> {
        Some(match drained {
            Ok(Step::Stopped) => return None,
            Ok(Step::CircuitOpen { retry_in }) => (retry_in, false),
            Ok(Step::Batch(report)) => {
                *database_failures = 0;
                if report.claimed > 0 {
                    debug!(?report, "drained");
                }
                // Paced: come back when the next message may go, not at the next poll.
                match self.pace.resume_in() {
                    Some(resume_in) => (resume_in, false),
                    None => (self.settings.poll_interval, true),
                }
            }
            Err(e) => {
                let DispatchError::Database { operation, .. } = &e;
                self.metrics.database_error(*operation);
                *database_failures = database_failures.saturating_add(1);
                let retry_in = OUTAGE_BACKOFF.delay_after(*database_failures);
                error!(
                    error = %e,
                    retry_in = %humantime::format_duration(retry_in),
                    "dispatch cycle failed; retrying"
                );
                (retry_in, false)
            }
        })
    }

    /// Doubles the claim after a full batch, up to the most allowed, so that a backlog
    /// drains in large batches with default options; a short batch means the backlog is
    /// gone, and the claim starts small again (low latency, little held per claim).
    fn adapt_claim_size(&self, full: bool) {
        let size = if full {
            self.claim_size
                .load(Ordering::Relaxed)
                .saturating_mul(2)
                .min(self.settings.max_batch_size)
        } else {
            self.settings.batch_size
        };
        self.claim_size.store(size, Ordering::Relaxed);
    }

    /// Claims the next batch, unless shutting down or the SMTP circuit is open. Outcomes
    /// held after a database failure are recorded first, and those held for locked rows
    /// tried again when due.
    async fn claim_next(&self, due_by: Option<DateTime<Utc>>) -> Result<NextBatch, DispatchError> {
        if self.shutdown.stop.is_cancelled() {
            return Ok(NextBatch::Halt(Step::Stopped));
        }
        self.record_held().await?;
        if let Some(retry_in) = self
            .breaker
            .closed_or_wait(&self.mailer, &self.metrics)
            .await
        {
            return Ok(NextBatch::Halt(Step::CircuitOpen { retry_in }));
        }
        let (requested, slots) = match self
            .pace
            .allowance(
                self.database.pool(),
                self.claim_size.load(Ordering::Relaxed),
                &self.metrics,
            )
            .await
            .map_err(DispatchError::database(DatabaseOperation::Claim))?
        {
            Allowance::Take { rows, slots } => (rows, slots),
            Allowance::Wait(_) => return Ok(NextBatch::Empty),
        };
        // The lease starts in the database during the claim; counting from before it
        // errs on the safe side. The send slots count from the booking, just before.
        let lease_start = Instant::now();
        let mut claimed = self.claim_rows(requested, due_by).await?;
        let taken = u32::try_from(claimed.messages.len()).unwrap_or(u32::MAX);
        self.adapt_claim_size(taken >= requested);
        let unused = requested.saturating_sub(taken);
        if let Err(e) = self
            .pace
            .unused(self.database.pool(), slots.as_ref(), unused)
            .await
        {
            // The rows are claimed: send them. The schedule only runs a little slow.
            self.metrics.database_error(DatabaseOperation::Claim);
            warn!(error = %e, slots = unused, "could not hand unused send slots back");
        }
        if claimed.messages.is_empty() {
            return Ok(NextBatch::Empty);
        }
        // Read once, here: the batch need not carry it to its sends.
        let at_claim = std::mem::take(&mut claimed.suppression);
        let suppressed = self
            .suppressed_or_release(&claimed, at_claim, lease_start)
            .await?;
        Ok(NextBatch::Leased(Box::new(LeasedBatch {
            claimed,
            lease_start,
            requested,
            slots,
            suppressed,
        })))
    }

    /// Claims up to `limit` due rows from the claim floor up, and moves the floor.
    async fn claim_rows(
        &self,
        limit: u32,
        due_by: Option<DateTime<Utc>>,
    ) -> Result<ClaimedBatch, DispatchError> {
        let scan = self.floor.start();
        let claimed = self
            .database
            .claim(&ClaimRequest {
                limit: i64::from(limit),
                lease: self.settings.lease,
                worker_id: &self.settings.worker_id,
                due_by,
                max_payload_bytes: i64::try_from(self.settings.max_payload_bytes)
                    .unwrap_or(i64::MAX),
                floor: scan.floor,
            })
            .await
            .map_err(DispatchError::database(DatabaseOperation::Claim))?;
        self.floor.claimed(scan, claimed.lowest_due);
        Ok(claimed)
    }
}
