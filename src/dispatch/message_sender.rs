//! One message's work, start to end: its expiry, its send slot, its render and send in a
//! span linked to the request that enqueued it, and the outcome they come to (see
//! `attempt`). A panic anywhere in it is caught here, once, and is that message's failure.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, field, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::attempt::{self, AttemptResult, outcome_of};
use super::batch::Decided;
use super::batch::Payloads;
use super::expiry::ExpireAfter;
use super::pace::{ReplyCounts, SendSlots};
use super::queue::OutcomeQueue;
use super::recipients::{Filtered, Suppressed};
use crate::mailer::Mailer;
use crate::message::{ClaimedMessage, Kind, Lane, Lanes, RetryPolicy};
use crate::render::{ReadPayload, Renderer};
use crate::telemetry::{self, PanicContext};
use crate::trace_context::parse_traceparent;

/// What the sends share: everything one message's render, send and outcome need.
pub(super) struct MessageSender {
    pub renderer: Arc<Renderer>,
    pub mailer: Arc<Mailer>,
    pub metrics: Arc<telemetry::metrics::Metrics>,
    pub retry: RetryPolicy,
    pub stop: CancellationToken,
    /// Shared with the claimer's paces, which judge what each route's relays answered.
    pub replies: ReplyCounts,
    pub expire_after: ExpireAfter,
    pub suppress_hard_bounces: bool,
    /// Each message's lane, which the suppression list's lane entries stop.
    pub lanes: Lanes,
    /// The kinds an unsubscribe or a complaint does not stop (`essential` in kind.toml).
    pub essential: BTreeSet<Kind>,
}

/// One batch being sent, shared by its sends.
pub(super) struct InFlight {
    pub messages: Arc<[ClaimedMessage]>,
    pub payloads: Payloads,
    /// Shared: the next message to send, taken by whichever of the batch's send tasks is
    /// free.
    pub next: AtomicUsize,
    pub outcomes: OutcomeQueue,
    pub lease_start: Instant,
    pub start_deadline: Instant,
    /// The database's clock at the claim: expiry is judged against it.
    pub claimed_at: DateTime<Utc>,
    /// Under a pace, each message waits for its send slot.
    pub slots: SendSlots,
    /// Recipients not to mail: the list as of the claim, and those that bounced since.
    pub suppressed: Suppressed,
    /// What the sends met on each route: together they tell an outage from a message's own
    /// failure.
    pub routes: RouteOutcomes,
}

/// Whether some send of a route (the lane whose relays it went to) reached a relay, and
/// whether some found none reachable: set by the send tasks, read once they are done.
#[derive(Debug, Default)]
pub(super) struct RouteOutcomes {
    reached: [AtomicBool; 2],
    unreachable: [AtomicBool; 2],
}

impl RouteOutcomes {
    fn place(route: Lane) -> usize {
        match route {
            Lane::Transactional => 0,
            Lane::Bulk => 1,
        }
    }

    fn note(&self, route: Lane, reached: bool) {
        let flags = if reached { &self.reached } else { &self.unreachable };
        flags[Self::place(route)].store(true, Ordering::Release);
    }

    /// The routes that met an outage: no send reached a relay, and some found none
    /// reachable.
    pub fn outages(&self) -> Vec<Lane> {
        Lane::ALL
            .into_iter()
            .filter(|route| {
                let place = Self::place(*route);
                self.unreachable[place].load(Ordering::Acquire)
                    && !self.reached[place].load(Ordering::Acquire)
            })
            .collect()
    }
}

impl MessageSender {
    /// Takes the next unsent message of the batch until none is left; hands each outcome
    /// to the recorder the moment it is decided. A panic anywhere in a message's work is
    /// that message's failure: released instead, it would be claimed again at once and
    /// could panic again, in a loop.
    pub async fn send_each(&self, batch: &InFlight) {
        loop {
            let index = batch.next.fetch_add(1, Ordering::Relaxed);
            let Some(message) = batch.messages.get(index) else {
                return;
            };
            batch.outcomes.started(index);
            let context = PanicContext {
                outbox_id: Some(message.id),
                task: None,
                what: "a message's render, send or outcome panicked; it is retried later, and dead-lettered after its last attempt",
            };
            let decided =
                match telemetry::catch_panic(context, self.decide(batch, index, message)).await {
                    Ok(decided) => decided,
                    Err(said) => Decided::new(
                        index,
                        outcome_of(message, AttemptResult::Panicked(said), &self.retry),
                        batch.lease_start.elapsed(),
                    ),
                };
            batch.outcomes.finished(decided);
        }
    }

    /// One message: its expiry, its send slot, its render and send, and the outcome they
    /// come to.
    async fn decide(&self, batch: &InFlight, index: usize, message: &ClaimedMessage) -> Decided {
        let (attempt, took) = if message.cancel_requested {
            (AttemptResult::Cancelled, None)
        } else if self.expire_after.expired(message, batch.claimed_at) {
            (AttemptResult::Expired, None)
        } else if !self.wait_for_slot(batch, index).await {
            (AttemptResult::NotStarted, None)
        } else {
            self.render_and_send(message, &batch.payloads[index], batch)
                .await
        };
        let route = self.mailer.route(self.lanes.of(&message.kind));
        match &attempt {
            AttemptResult::Delivered(_) => batch.routes.note(route, true),
            AttemptResult::SendFailed(e) => batch.routes.note(route, e.reached_server()),
            _ => {}
        }
        let bounced = match &attempt {
            AttemptResult::SendFailed(e) => e
                .unknown_recipient()
                .and_then(|to| to.parse::<lettre::Address>().ok())
                .map(|to| crate::suppression::Address::of(&to)),
            _ => None,
        };
        // The pace hears every throttling reply, also one that costs a message that has met
        // too many an attempt: else a long episode falls silent and the pace is forgotten
        // while the relay still refuses.
        let replies = self
            .replies
            .of(self.mailer.route(self.lanes.of(&message.kind)));
        match &attempt {
            AttemptResult::SendFailed(e) if e.is_throttling() => replies.throttled(),
            AttemptResult::Delivered(_) => replies.accepted(),
            _ => {}
        }
        let mut outcome = outcome_of(message, attempt, &self.retry);
        if let Some(address) = bounced.as_ref().filter(|_| self.suppress_hard_bounces) {
            // Its batch-mates to the same address are not sent either.
            batch.suppressed.bounced(address);
            outcome =
                attempt::without_the_bounced(message, &batch.payloads[index], outcome, &self.retry);
        }
        Decided {
            index,
            outcome,
            after: batch.lease_start.elapsed(),
            took,
            bounced,
        }
    }

    /// Waits for the message's send slot under a rate limit; false when shutting down.
    async fn wait_for_slot(&self, batch: &InFlight, index: usize) -> bool {
        let Some(slot) = batch.slots.at(batch.lease_start, index) else {
            return true;
        };
        tokio::select! {
            () = tokio::time::sleep_until(slot) => true,
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

    /// One message: render and send, in a span that links to the request that enqueued it;
    /// how long the send took, when it was made.
    async fn render_and_send(
        &self,
        message: &ClaimedMessage,
        payload: &ReadPayload,
        batch: &InFlight,
    ) -> (AttemptResult, Option<Duration>) {
        if self.stop.is_cancelled() || Instant::now() >= batch.start_deadline {
            return (AttemptResult::NotStarted, None);
        }
        // Built only when traces are exported: at the default level its fields cost about a
        // sixth of the drain's CPU, for nobody (BENCHMARKS.md).
        let span = if telemetry::spans_exported() {
            self.send_span(message)
        } else {
            tracing::Span::none()
        };
        let (attempt, took) = async {
            let email = match self.renderer.render_read(message, payload) {
                Ok(email) => email,
                Err(e) => return (AttemptResult::RenderFailed(e), None),
            };
            let lane = self.lanes.of(&message.kind);
            let essential = self.essential.contains(message.kind.as_str());
            let fewer = match batch.suppressed.filter(&email.envelope, lane, essential) {
                Filtered::Unchanged => None,
                Filtered::Fewer(envelope) => Some(envelope),
                Filtered::AllSuppressed(listing, recipients) => {
                    return (AttemptResult::Suppressed(listing, recipients), None);
                }
            };
            let envelope = fewer.as_ref().unwrap_or(&email.envelope);
            let started = Instant::now();
            let sent = self.mailer.send(lane, envelope, &email.bytes).await;
            let took = self.mailer.is_enabled().then(|| started.elapsed());
            if let Some(took) = took {
                self.metrics.smtp_send(took);
            }
            match sent {
                Ok(sent) => (AttemptResult::Delivered(sent), took),
                Err(e) => (AttemptResult::SendFailed(e), took),
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
        (attempt, took)
    }
}
