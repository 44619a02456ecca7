//! The loop and its public single steps: [`Dispatcher::run`] waits and drains until
//! shutdown; [`Dispatcher::drain`] claims batches while they come back full;
//! [`Dispatcher::dispatch_once`] claims, sends and records one batch, for tests to drive.

use std::time::Duration;

use tracing::{debug, error, info};

use super::batch::LOCKED_RETRY;
use super::batch::{BatchReport, NextBatch, SentBatch};
use super::steps::claim_next;
use super::wake::{OUTAGE_BACKOFF, Wakeups, Woken};
use super::{DispatchError, Dispatcher, Step};
use crate::store;

impl Dispatcher {
    /// Claims one batch of due rows, sends it and records every outcome: one step, for
    /// tests to drive.
    #[cfg(feature = "testing")]
    pub async fn dispatch_once(&mut self) -> Result<Step, DispatchError> {
        let delivery = &self.delivery;
        Ok(match claim_next(&mut self.claimer, delivery, None).await? {
            NextBatch::Leased(leased) => {
                let sent = delivery.send_batch(leased).await?;
                Step::Batch(delivery.finish_batch(sent).await?)
            }
            other => other.step_after(BatchReport::default()),
        })
    }

    /// Dispatches batches until one comes back short, as the original design did. After a
    /// full batch the next one is claimed while this one is sent, so no connection waits on
    /// the database. Each claim takes rows due by the time of the claim before it, so what
    /// falls due during a drain (a priority message, a retry) is claimed a batch or two
    /// later: a retry with no delay too, so it comes back within the drain.
    pub async fn drain(&mut self) -> Result<Step, DispatchError> {
        let Self {
            claimer, delivery, ..
        } = self;
        let delivery = &*delivery;
        let mut total = BatchReport::default();
        let mut previous: Option<SentBatch> = None;
        let mut next = claim_next(claimer, delivery, None).await?;
        while let NextBatch::Leased(leased) = next {
            let due_by = Some(leased.claim.claimed.claimed_at);
            let full = leased.claim.full;
            let (sent, finished, following) = tokio::join!(
                delivery.send_batch(leased),
                async {
                    match previous.take() {
                        Some(previous) => delivery.finish_batch(previous).await.map(Some),
                        None => Ok(None),
                    }
                },
                async {
                    if full {
                        claim_next(claimer, delivery, due_by).await.map(Some)
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
                    delivery.set_aside(sent);
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
                    total.add(&delivery.finish_batch(sent).await?);
                    return Ok(Step::Batch(total));
                }
                Err(e) => {
                    // The claim failed; the batch just sent still gets its last outcomes
                    // written, or held if the database is gone too.
                    if let Err(also) = delivery.finish_batch(sent).await {
                        debug!(error = %also, "the last outcomes of a batch are held");
                    }
                    return Err(e);
                }
            }
        }
        if let Some(previous) = previous {
            total.add(&delivery.finish_batch(previous).await?);
        }
        Ok(next.step_after(total))
    }

    /// Runs until shutdown: drain, then wait for a notification, the poll interval, the
    /// circuit breaker's next probe, or a database back-off. Never returns an error:
    /// database and SMTP outages are waited out. It owns the dispatcher: run it on a task
    /// of its own.
    pub async fn run(mut self) {
        let mut wakeups = Wakeups::new(
            self.claimer.listen(),
            self.claimer.database().store().clone(),
            self.delivery.metrics.clone(),
        );
        let mut database_failures = 0_u32;
        // A row left by this worker's previous run is removed at its first drain.
        let mut circuit_said_open = true;
        info!(
            worker_id = %self.settings.worker_id,
            poll_interval = %crate::text::duration(self.settings.poll_interval),
            linger = %crate::text::duration(self.settings.linger),
            batch_size = self.settings.batch_size,
            concurrency = self.settings.concurrency,
            "dispatcher started"
        );
        while !self.delivery.shutdown.stop.is_cancelled() {
            wakeups.listen(self.claimer.floor()).await;
            let looked = tokio::time::Instant::now();
            let drained = self.drain().await;
            self.say_circuit(&drained, &mut circuit_said_open).await;
            let next = self.next_look(drained, &mut database_failures, &mut wakeups, looked);
            let Some((wait, notified)) = next else {
                break;
            };
            // Every wait ends within a poll interval, so the heartbeat the liveness probe
            // reads keeps beating through SMTP and database outages.
            self.delivery.metrics.cycle_completed();
            let stop = &self.delivery.shutdown.stop;
            let woken = wakeups
                .wait(wait, notified, stop, self.claimer.floor())
                .await;
            match woken {
                Woken::Stopped => break,
                Woken::Heard => {
                    wakeups
                        .linger(self.settings.linger, stop, self.claimer.floor())
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

    /// Keeps this replica's open circuit where `outboxd stats` reads it: said at each probe
    /// while open, removed once closed. Best effort: it tells operators, it steers nothing.
    async fn say_circuit(&self, drained: &Result<Step, DispatchError>, said_open: &mut bool) {
        // A database error says nothing of the circuit.
        let Ok(step) = drained else { return };
        let open = matches!(step, Step::CircuitOpen { .. });
        let pool = self.claimer.database().store();
        let worker = &self.settings.worker_id;
        let said = match (open, *said_open) {
            (true, _) => store::circuits::opened(pool, worker).await,
            (false, true) => store::circuits::closed(pool, worker).await,
            (false, false) => return,
        };
        match said {
            Ok(()) => *said_open = open,
            Err(e) => debug!(error = %e, "could not record the SMTP circuit for the command line"),
        }
    }

    /// Gives back the connection kept between statements: the pool cannot close while it
    /// is out. [`Self::run`] does so as it ends (and a `run` that panics drops it); a caller
    /// of [`Self::dispatch_once`] or [`Self::drain`] must before closing the pool.
    pub fn release_connection(&self) {
        self.claimer.database().release();
    }

    /// Records the outcomes held after a database failure, and those held for rows another
    /// transaction has locked when their next try is due (all of them when stopping).
    pub async fn record_held(&self) -> Result<BatchReport, DispatchError> {
        let stopping = self.delivery.shutdown.stop.is_cancelled();
        self.delivery.recorder.record_held(stopping).await
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn held_outcomes(&self) -> usize {
        self.delivery.recorder.held_outcomes()
    }

    /// When the loop next looks for work, after a drain: the one place that decides. The
    /// drain's step says how long: the pace's wait, the circuit breaker's next probe (also
    /// when only one lane's circuit is open), a database back-off, or, after an ordinary
    /// drain, the poll interval, which a
    /// notification ends sooner (`true`). Every wait ends within the poll interval, by the
    /// next try of outcomes held for locked rows (an application's commit sends no
    /// notification) and, after an ordinary drain, by the soonest retry or `not_before`
    /// row known to fall due. `None` when stopping.
    fn next_look(
        &self,
        drained: Result<Step, DispatchError>,
        database_failures: &mut u32,
        wakeups: &mut Wakeups,
        looked: tokio::time::Instant,
    ) -> Option<(Duration, bool)> {
        let (wait, notified) = match drained {
            Ok(Step::Stopped) => return None,
            Ok(Step::CircuitOpen { retry_in }) => (retry_in, false),
            Ok(Step::Paced { report, resume_in }) => {
                *database_failures = 0;
                debug!(?report, resume_in = %crate::text::duration(resume_in), "drained what the pace allows");
                (resume_in, false)
            }
            Ok(Step::Batch(report)) => {
                *database_failures = 0;
                if report.claimed > 0 {
                    debug!(?report, "drained");
                }
                (self.settings.poll_interval, true)
            }
            Err(e) => {
                let DispatchError::Database { operation, .. } = &e;
                self.delivery.metrics.database_error(*operation);
                *database_failures = database_failures.saturating_add(1);
                let retry_in = OUTAGE_BACKOFF.delay_after(*database_failures);
                error!(
                    error = %e,
                    retry_in = %crate::text::duration(retry_in),
                    "dispatch cycle failed; retrying"
                );
                (retry_in, false)
            }
        };
        let mut wait = wait.min(wakeups.poll_interval(self.settings.poll_interval));
        // One lane's circuit open while the other's claim came back: its next look is due
        // with its probe, not a poll interval later.
        if let Some(probe_in) = self.delivery.sender.next_probe_in() {
            wait = wait.min(probe_in);
        }
        if self.delivery.recorder.holds_locked() {
            wait = wait.min(LOCKED_RETRY);
        }
        for retry in self.delivery.recorder.take_retries_due() {
            wakeups.expect(retry);
        }
        if let Some(due) = wakeups.until_due(looked).filter(|_| notified) {
            wait = wait.min(due);
        }
        Some((wait, notified))
    }
}
