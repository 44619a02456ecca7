//! Sending a leased batch: `concurrency` tasks that each take the next unsent message, a
//! start deadline that keeps every send inside the lease, and the decision from what an
//! attempt came to to the message's outcome.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, field, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::Dispatcher;
use super::batch::{AttemptedBatch, LeasedBatch};
use crate::lock::lock;
use crate::mailer::{Mailer, SendError};
use crate::message::{ClaimedMessage, Delivery, Outcome, Permanence, ReleaseReason};
use crate::render::{RenderError, Renderer};
use crate::store;
use crate::telemetry::metrics::Metrics;
use crate::trace_context::parse_traceparent;

/// What an attempt at one message came to, before it is turned into an outcome.
#[derive(Debug)]
pub(super) enum AttemptResult {
    Delivered(Delivery),
    RenderFailed(RenderError),
    SendFailed(SendError),
    /// Not started: shutting down, or too close to the end of the lease.
    NotStarted,
    /// Started, then given up at the shutdown bound; it may or may not have been delivered.
    Abandoned,
}

/// Where one message of a batch being sent stands.
enum Slot {
    Waiting,
    Started,
    Done(AttemptResult),
}

/// What the send tasks share: everything one message's render and send needs.
pub(super) struct MessageSender {
    pub renderer: Arc<Renderer>,
    pub mailer: Arc<Mailer>,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
}

impl Dispatcher {
    /// Sends a leased batch and decides each message's outcome; records nothing.
    pub(super) async fn send_batch(&self, leased: LeasedBatch) -> AttemptedBatch {
        let LeasedBatch {
            claimed,
            lease_start,
        } = leased;
        let span = info_span!(
            "process outbox_messages",
            otel.kind = "consumer",
            messaging.system = "outboxd",
            messaging.operation.type = "process",
            messaging.destination.name = store::TABLE,
            messaging.batch.message_count = claimed.messages.len(),
            outbox.worker_id = %self.settings.worker_id,
        );
        let (outcomes, outage) = async {
            // A send may run for up to send_timeout, so none starts after this point: the
            // row is given back rather than sent after another replica could have taken it.
            let start_deadline = lease_start
                + self
                    .settings
                    .lease
                    .saturating_sub(self.settings.send_timeout * 2);
            let attempts = self
                .send_concurrently(&claimed.messages, start_deadline)
                .await;
            let outage = is_outage(&attempts);
            let outcomes: Vec<Outcome> = attempts
                .into_iter()
                .map(|(message, attempt)| self.outcome_of(message, attempt, outage))
                .collect();
            (outcomes, outage)
        }
        .instrument(span.clone())
        .await;
        AttemptedBatch {
            since_claim: chrono::Duration::from_std(lease_start.elapsed()).unwrap_or_default(),
            claimed,
            outcomes,
            outage,
            span,
        }
    }

    /// Renders and sends a batch over `concurrency` tasks that each take the next unsent
    /// message until none is left, so that rendering and SMTP spread over the runtime's
    /// threads without a task per message; until done or aborted.
    async fn send_concurrently<'m>(
        &self,
        messages: &'m Arc<[ClaimedMessage]>,
        start_deadline: Instant,
    ) -> Vec<(&'m ClaimedMessage, AttemptResult)> {
        let slots = Arc::new(Mutex::new(
            (0..messages.len())
                .map(|_| Slot::Waiting)
                .collect::<Vec<_>>(),
        ));
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        for _ in 0..self.settings.concurrency.clamp(1, messages.len().max(1)) {
            let (sender, batch, slots, next) = (
                Arc::clone(&self.sender),
                Arc::clone(messages),
                Arc::clone(&slots),
                Arc::clone(&next),
            );
            tasks.spawn(
                async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(message) = batch.get(i) else { break };
                        lock(&slots)[i] = Slot::Started;
                        let attempt = sender.render_and_send(message, start_deadline).await;
                        lock(&slots)[i] = Slot::Done(attempt);
                    }
                }
                .in_current_span(),
            );
        }
        tokio::select! {
            biased;
            () = self.shutdown.abort.cancelled() => {}
            () = async {
                while let Some(joined) = tasks.join_next().await {
                    if let Err(e) = joined {
                        error!(error = %e, "a send task failed");
                    }
                }
            } => {}
        }
        // Sends still running are given up; those that finished just as the bound ran out
        // keep what they were.
        tasks.abort_all();
        // An aborted task may still be finishing a poll on another thread: read the slots
        // in place rather than taking the vector from under it.
        let mut slots = lock(&slots);
        messages
            .iter()
            .zip(slots.iter_mut())
            .map(|(m, slot)| {
                let attempt = match std::mem::replace(slot, Slot::Waiting) {
                    Slot::Done(attempt) => attempt,
                    Slot::Started => AttemptResult::Abandoned,
                    Slot::Waiting => AttemptResult::NotStarted,
                };
                (m, attempt)
            })
            .collect()
    }

    /// The outcome an attempt comes to; `outage` releases send failures unattempted.
    fn outcome_of(
        &self,
        message: &ClaimedMessage,
        attempt: AttemptResult,
        outage: bool,
    ) -> Outcome {
        match attempt {
            AttemptResult::Delivered(via) => Outcome::Sent { via },
            AttemptResult::RenderFailed(e) => Outcome::DeadLetter {
                error: e.to_string(),
                error_class: e.error_class().to_owned(),
                permanence: Permanence::Permanent,
            },
            AttemptResult::SendFailed(e) if outage => Outcome::Release {
                reason: ReleaseReason::SmtpUnavailable,
                error: Some(e.to_string()),
            },
            AttemptResult::SendFailed(e) => match e.permanence() {
                Permanence::Permanent => Outcome::DeadLetter {
                    error: e.to_string(),
                    error_class: e.error_class(),
                    permanence: Permanence::Permanent,
                },
                Permanence::Transient => Outcome::after_transient_failure(
                    e.to_string(),
                    e.error_class(),
                    message.attempts,
                    &self.settings.retry,
                ),
            },
            AttemptResult::NotStarted => Outcome::not_started(),
            AttemptResult::Abandoned => Outcome::abandoned(),
        }
    }
}

/// A batch met an outage when some send found the server unreachable and none reached it.
fn is_outage(attempts: &[(&ClaimedMessage, AttemptResult)]) -> bool {
    let unreachable = attempts
        .iter()
        .any(|(_, a)| matches!(a, AttemptResult::SendFailed(e) if !e.reached_server()));
    let reached = attempts.iter().any(|(_, a)| match a {
        AttemptResult::Delivered(_) => true,
        AttemptResult::SendFailed(e) => e.reached_server(),
        _ => false,
    });
    unreachable && !reached
}

impl MessageSender {
    /// One message: render and send, in a span that links to the request that enqueued it.
    async fn render_and_send(
        &self,
        message: &ClaimedMessage,
        start_deadline: Instant,
    ) -> AttemptResult {
        if self.stop.is_cancelled() || Instant::now() >= start_deadline {
            return AttemptResult::NotStarted;
        }
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
            outbox.attempt = message.attempts + 1,
            error.type = field::Empty,
        );
        if let Some(producer) = message.traceparent.as_deref().and_then(parse_traceparent) {
            span.add_link(producer);
        }
        let attempt = async {
            let email = match self.renderer.render_claimed(message) {
                Ok(email) => email,
                Err(e) => return AttemptResult::RenderFailed(e),
            };
            let started = Instant::now();
            let sent = self.mailer.send(&email.envelope, &email.bytes).await;
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
            AttemptResult::SendFailed(e) => Some(e.permanence().as_str()),
            _ => None,
        };
        if let Some(error_type) = error_type {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", error_type);
        }
        attempt
    }
}
