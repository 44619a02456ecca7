//! Sending a leased batch: `concurrency` sends (tasks, or in place for a small batch) that
//! each take the next unsent message, decide its outcome as soon as its send ends (see
//! `attempt`) and hand it to the recorder; a start deadline that keeps every send inside
//! the lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use futures_util::future::{join, join_all};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, field, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::attempt::{AttemptResult, caught, outcome_of};
use super::batch::{Decided, LeasedBatch, OutcomeQueue, SentBatch, Unrecorded};
use super::expiry::ExpireAfter;
use super::pace::{Pace, Slots};
use super::recipients::{Filtered, Suppressed};
use super::{DispatchError, Dispatcher};
use crate::mailer::Mailer;
use crate::message::{
    ClaimedBatch, ClaimedMessage, FailureType, Outcome, ReleaseReason, RetryPolicy,
};
use crate::render::Renderer;
use crate::store;
use crate::telemetry;
use crate::telemetry::log_caught;
use crate::telemetry::metrics::Metrics;
use crate::text::mask_addresses;
use crate::trace_context::parse_traceparent;

/// What the sends share: everything one message's render, send and outcome need.
pub(super) struct MessageSender {
    pub renderer: Arc<Renderer>,
    pub mailer: Arc<Mailer>,
    pub metrics: Arc<Metrics>,
    pub retry: RetryPolicy,
    pub stop: CancellationToken,
    pub pace: Arc<Pace>,
    pub expire_after: ExpireAfter,
    pub suppress_hard_bounces: bool,
}

/// One batch being sent, shared by its sends.
struct InFlight {
    messages: Arc<[ClaimedMessage]>,
    next: AtomicUsize,
    outcomes: OutcomeQueue,
    lease_start: Instant,
    start_deadline: Instant,
    /// The database's clock at the claim: expiry is judged against it.
    claimed_at: DateTime<Utc>,
    /// Under a rate limit, each message waits for its send slot.
    slots: Option<Slots>,
    /// Recipients not to mail: the list as of the claim, and those that bounced since.
    suppressed: Suppressed,
    /// Some send reached the server, or some found it unreachable: together they tell an
    /// outage (every send unreachable) from a message's own failure.
    reached: AtomicBool,
    unreachable: AtomicBool,
}

impl Dispatcher {
    /// Sends a leased batch; its outcomes are written as the sends end, a few milliseconds'
    /// worth at a time, so one slow message never holds its batch-mates' outcomes. Returns
    /// when the sends are over, with the last outcomes still to write (the drain writes
    /// them while the next batch is sent).
    pub(super) async fn send_batch(
        &self,
        leased: Box<LeasedBatch>,
    ) -> Result<SentBatch, DispatchError> {
        let LeasedBatch {
            claimed,
            lease_start,
            slots,
            suppressed,
            ..
        } = *leased;
        let span = self.batch_span(&claimed);
        let batch = Arc::new(self.in_flight(&claimed, lease_start, slots, suppressed));
        self.send_and_record(claimed, batch, span).await
    }

    fn batch_span(&self, claimed: &ClaimedBatch) -> tracing::Span {
        info_span!(
            "process outbox_messages",
            otel.kind = "consumer",
            messaging.system = "outboxd",
            messaging.operation.type = "process",
            messaging.destination.name = store::TABLE,
            messaging.batch.message_count = claimed.messages.len(),
            outbox.worker_id = %self.settings.worker_id,
        )
    }

    fn in_flight(
        &self,
        claimed: &ClaimedBatch,
        lease_start: Instant,
        slots: Option<Slots>,
        suppressed: Suppressed,
    ) -> InFlight {
        // A send may take up to two send timeouts (a connection and a transaction; the
        // mailer bounds them, replacing a dead connection included), so none starts after
        // this point: the row is given back rather than sent after another replica could
        // have taken it, with a third timeout left to record the outcome.
        let start_deadline = lease_start
            + self
                .settings
                .lease
                .saturating_sub(self.settings.send_timeout * 3);
        InFlight {
            messages: Arc::clone(&claimed.messages),
            next: AtomicUsize::new(0),
            outcomes: OutcomeQueue::new(claimed.messages.len()),
            lease_start,
            start_deadline,
            claimed_at: claimed.claimed_at,
            slots,
            suppressed,
            reached: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
        }
    }

    /// Sends the batch while recording its outcomes; see [`Self::send_batch`].
    async fn send_and_record(
        &self,
        claimed: ClaimedBatch,
        batch: Arc<InFlight>,
        span: tracing::Span,
    ) -> Result<SentBatch, DispatchError> {
        // The sends are polled before the recorder in every pass (`join`, unlike
        // `tokio::join!`, keeps that order), so the recorder sees the queue closed in the
        // pass the sends end: closing it need not wake this task, which tokio would hand to
        // its other thread (BENCHMARKS.md, *Steady traffic*).
        let (rest, recorded) = join(
            async {
                self.send_concurrently(&batch).await;
                // Sends never started, or given up at the shutdown bound, are released.
                batch.outcomes.close(batch.lease_start.elapsed())
            },
            self.record_as_they_come(&claimed, &batch.outcomes, span.clone()),
        )
        .instrument(span.clone())
        .await;
        let outage =
            batch.unreachable.load(Ordering::Acquire) && !batch.reached.load(Ordering::Acquire);
        match recorded {
            Ok((report, mut decided)) => {
                decided.extend(rest);
                Ok(SentBatch {
                    report,
                    rest: Unrecorded::new(claimed, decided, span),
                    outage,
                })
            }
            Err(e) => {
                // What the recorder had is held already; the releases join it.
                if !rest.is_empty() {
                    self.hold(Unrecorded::new(claimed, rest, span));
                }
                if outage {
                    self.breaker.open(&self.metrics);
                }
                Err(e)
            }
        }
    }

    /// Renders and sends a batch over `concurrency` sends that each take the next unsent
    /// message until none is left; until done or aborted. A large batch's sends are tasks,
    /// so that rendering spreads over the runtime's threads; a small one's run in place, in
    /// this task: they mostly wait on the network, and a task each would cost a thread
    /// wake-up each, more than the rendering they could share (BENCHMARKS.md, *Steady
    /// traffic*).
    async fn send_concurrently(&self, batch: &Arc<InFlight>) {
        let sends_wanted = self
            .settings
            .concurrency
            .clamp(1, batch.messages.len().max(1));
        let sends = (0..sends_wanted).map(|_| {
            let (sender, batch) = (Arc::clone(&self.sender), Arc::clone(batch));
            async move { sender.send_each(&batch).await }
        });
        // A message's own work is caught per message (see `send_each`); a panic outside it
        // ends its send, the others take the rest of the batch, and it is logged once.
        let sends = sends.map(telemetry::catch_panic);
        if batch.messages.len() <= SEND_IN_PLACE_UP_TO {
            tokio::select! {
                biased;
                () = self.shutdown.abort.cancelled() => {}
                ended = join_all(sends) => {
                    ended.into_iter().filter_map(Result::err).for_each(|panic| log_send_panic(&panic));
                }
            }
            return;
        }
        let mut tasks = JoinSet::new();
        for send in sends {
            tasks.spawn(send.in_current_span());
        }
        tokio::select! {
            biased;
            () = self.shutdown.abort.cancelled() => {}
            () = async {
                while let Some(joined) = tasks.join_next().await {
                    match joined {
                        Ok(Ok(())) => {}
                        Ok(Err(panic)) => log_send_panic(&panic),
                        // Cancelled by the runtime, or a panic while the send's future was
                        // dropped (the hook logged that one); its text may quote an address.
                        Err(e) => error!(error = %mask_addresses(&e.to_string()), "a send task failed"),
                    }
                }
            } => {}
        }
        // Sends still running are given up; wait until they are gone, so that the
        // recorder sees the end of the outcomes.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// Logs a send that panicked between messages: each message's own work is caught where it
/// runs (see `MessageSender::send_each`), so none of its messages is left half-done.
fn log_send_panic(panic: &telemetry::CaughtPanic) {
    log_caught(
        panic,
        None,
        None,
        "a send panicked between messages; the batch's other sends take the rest, or it goes back unsent",
    );
}

/// Batches up to this size are sent in the dispatcher's own task.
const SEND_IN_PLACE_UP_TO: usize = 64;

impl MessageSender {
    /// Takes the next unsent message of the batch until none is left; hands each outcome
    /// to the recorder the moment it is decided. A panic anywhere in a message's work is
    /// that message's failure, as in its render and send (see `attempt::caught`): released
    /// instead, it would be claimed again at once and could panic again, in a loop.
    async fn send_each(&self, batch: &InFlight) {
        loop {
            let index = batch.next.fetch_add(1, Ordering::Relaxed);
            let Some(message) = batch.messages.get(index) else {
                return;
            };
            batch.outcomes.started(index);
            let decided = match telemetry::catch_panic(self.decide(batch, index, message)).await {
                Ok(decided) => decided,
                Err(panic) => {
                    log_caught(
                        &panic,
                        Some(message.id),
                        None,
                        "deciding a message's outcome panicked; it is retried later, and dead-lettered after its last attempt",
                    );
                    Decided {
                        index,
                        outcome: outcome_of(
                            message,
                            AttemptResult::Panicked(panic.message),
                            &self.retry,
                        ),
                        after: batch.lease_start.elapsed(),
                        bounced: None,
                    }
                }
            };
            batch.outcomes.finished(decided);
        }
    }

    /// One message: its expiry, its send slot, its render and send, and the outcome they
    /// come to.
    async fn decide(&self, batch: &InFlight, index: usize, message: &ClaimedMessage) -> Decided {
        let attempt = if self.expire_after.expired(message, batch.claimed_at) {
            AttemptResult::Expired
        } else if !self.wait_for_slot(batch, index).await {
            AttemptResult::NotStarted
        } else {
            let attempt = self.render_and_send(message, &batch.suppressed, batch.start_deadline);
            caught(attempt, message.id).await
        };
        match &attempt {
            AttemptResult::Delivered(_) => batch.reached.store(true, Ordering::Release),
            AttemptResult::SendFailed(e) if e.reached_server() => {
                batch.reached.store(true, Ordering::Release);
            }
            AttemptResult::SendFailed(_) => batch.unreachable.store(true, Ordering::Release),
            _ => {}
        }
        let bounced = match &attempt {
            AttemptResult::SendFailed(e) => e
                .unknown_recipient()
                .and_then(|to| to.parse::<lettre::Address>().ok())
                .map(|to| crate::suppression::address_key(&to)),
            _ => None,
        };
        let mut outcome = outcome_of(message, attempt, &self.retry);
        if let Some(address) = bounced.as_ref().filter(|_| self.suppress_hard_bounces) {
            // Its batch-mates to the same address are not sent either.
            batch.suppressed.bounced(address);
            outcome = self.without_the_bounced(message, outcome);
        }
        if matches!(
            outcome,
            Outcome::Release {
                reason: ReleaseReason::Throttled,
                ..
            }
        ) {
            self.pace.throttled();
        }
        Decided {
            index,
            outcome,
            after: batch.lease_start.elapsed(),
            bounced,
        }
    }

    /// A message refused because one of several recipients does not exist is tried again at
    /// once (an attempt counted): that recipient is suppressed by then, so the next attempt
    /// goes to the others. With one recipient it stays a dead letter.
    fn without_the_bounced(&self, message: &ClaimedMessage, outcome: Outcome) -> Outcome {
        let Outcome::DeadLetter {
            error, error_class, ..
        } = outcome
        else {
            return outcome;
        };
        let recipients: std::collections::HashSet<String> = self
            .renderer
            .suppression_keys(message)
            .into_iter()
            .collect();
        if recipients.len() < 2 {
            return Outcome::DeadLetter {
                error,
                error_class,
                failure_type: FailureType::Permanent,
            };
        }
        match Outcome::after_retryable_failure(
            format!("{error}; trying the other recipients again"),
            error_class,
            FailureType::Permanent,
            message.attempts,
            &self.retry,
        ) {
            Outcome::Retry {
                error,
                error_class,
                failure_type,
                ..
            } => Outcome::Retry {
                error,
                error_class,
                failure_type,
                delay: std::time::Duration::ZERO,
            },
            dead => dead,
        }
    }

    /// Waits for the message's send slot under a rate limit; false when shutting down.
    async fn wait_for_slot(&self, batch: &InFlight, index: usize) -> bool {
        let Some(slots) = &batch.slots else {
            return true;
        };
        tokio::select! {
            () = tokio::time::sleep_until(slots.slot(batch.lease_start, index)) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// The span of one send, linked to the request that enqueued the message.
    fn send_span(&self, message: &ClaimedMessage) -> tracing::Span {
        let span = info_span!(
            "send",
            otel.name = format!("send {}", message.kind),
            otel.kind = "producer",
            otel.status_code = field::Empty,
            messaging.system = "outboxd",
            messaging.operation.type = "send",
            messaging.operation.name = "send",
            messaging.destination.name = %message.kind,
            messaging.message.id = message.id,
            outbox.id = message.id,
            outbox.attempt = message.attempts.saturating_add(1),
            error.type = field::Empty,
        );
        if let Some(producer) = message.traceparent.as_deref().and_then(parse_traceparent) {
            span.add_link(producer);
        }
        span
    }

    /// One message: render and send, in a span that links to the request that enqueued it.
    async fn render_and_send(
        &self,
        message: &ClaimedMessage,
        suppressed: &Suppressed,
        start_deadline: Instant,
    ) -> AttemptResult {
        if self.stop.is_cancelled() || Instant::now() >= start_deadline {
            return AttemptResult::NotStarted;
        }
        // Built only when traces are exported: at the default level its fields cost about a
        // sixth of the drain's CPU, for nobody (BENCHMARKS.md).
        let span = if telemetry::spans_exported() {
            self.send_span(message)
        } else {
            tracing::Span::none()
        };
        let attempt = async {
            let email = match self.renderer.render_claimed(message) {
                Ok(email) => email,
                Err(e) => return AttemptResult::RenderFailed(e),
            };
            let fewer = match suppressed.filter(&email.envelope) {
                Filtered::Unchanged => None,
                Filtered::Fewer(envelope) => Some(envelope),
                Filtered::AllSuppressed(reason, recipients) => {
                    return AttemptResult::Suppressed(reason, recipients);
                }
            };
            let envelope = fewer.as_ref().unwrap_or(&email.envelope);
            let started = Instant::now();
            let sent = self.mailer.send(envelope, &email.bytes).await;
            if self.mailer.is_enabled() {
                self.metrics.smtp_send(started.elapsed());
            }
            match sent {
                Ok(delivery) => AttemptResult::Delivered(delivery),
                Err(e) => AttemptResult::SendFailed(e),
            }
        }
        .instrument(span.clone())
        .await;
        let error_type = match &attempt {
            AttemptResult::RenderFailed(_) => Some("render"),
            AttemptResult::SendFailed(e) => Some(e.failure_type().as_str()),
            _ => None,
        };
        if let Some(error_type) = error_type {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", error_type);
        }
        attempt
    }
}
