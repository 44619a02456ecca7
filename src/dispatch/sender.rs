//! The sender: a leased batch sent over `concurrency` sends (tasks, or in place for a small
//! batch) that each take the next unsent message and hand its outcome to the recorder as
//! soon as it is decided (see `message_sender`); a start deadline that keeps every send
//! inside the lease; and the SMTP circuit breaker.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info_span};

use super::DispatchSettings;
use super::batch::LeasedBatch;
use super::breaker::Circuits;
use super::message_sender::{InFlight, MessageSender, RouteOutcomes};
use super::queue::OutcomeQueue;
use crate::mailer::Mailer;
use crate::message::{ClaimedBatch, Lane};
use crate::store;
use crate::telemetry::metrics::Metrics;
use crate::text::mask_addresses;

/// Sends leased batches, `concurrency` messages at a time, and keeps the SMTP circuit.
pub(super) struct Sender {
    messages: Arc<MessageSender>,
    mailer: Arc<Mailer>,
    metrics: Arc<Metrics>,
    circuits: Circuits,
    abort: CancellationToken,
    settings: DispatchSettings,
}

impl Sender {
    pub fn new(
        messages: MessageSender,
        abort: CancellationToken,
        settings: DispatchSettings,
    ) -> Self {
        let routes = messages.mailer.routes();
        messages
            .metrics
            .register_relays(&routes, &messages.mailer.relays());
        Self {
            circuits: Circuits::new(&routes),
            mailer: Arc::clone(&messages.mailer),
            metrics: Arc::clone(&messages.metrics),
            messages: Arc::new(messages),
            abort,
            settings,
        }
    }

    /// The lanes whose circuit is closed, which may be claimed; when none, how long until a
    /// circuit's next probe. Says each relay's state as it stands.
    pub async fn closed_lanes(&self) -> Result<Vec<Lane>, Duration> {
        let lanes = self
            .circuits
            .closed_lanes(&self.mailer, &self.metrics)
            .await;
        self.metrics.relays(&self.mailer.relays());
        lanes
    }

    /// How long until the soonest open circuit's next look, if one is open.
    pub fn next_probe_in(&self) -> Option<Duration> {
        self.circuits.next_probe_in()
    }

    /// A batch met an outage on these routes: their lanes are not claimed until one of
    /// their relays answers a probe.
    pub fn open_circuits(&self, routes: &[Lane]) {
        for route in routes {
            self.circuits.open(*route, &self.metrics);
        }
    }

    /// A leased batch, ready for its sends, and its span.
    pub fn in_flight(&self, leased: LeasedBatch) -> (ClaimedBatch, Arc<InFlight>, tracing::Span) {
        let LeasedBatch { claim, suppressed } = leased;
        let span = self.batch_span(&claim.claimed);
        // A send may take up to two send timeouts (a connection and a transaction; the
        // mailer bounds them, replacing a dead connection included), so none starts after
        // this point: the row is given back rather than sent after another replica could
        // have taken it, with a third timeout left to record the outcome.
        let start_deadline = claim.lease_start
            + self
                .settings
                .lease
                .saturating_sub(self.settings.send_timeout * 3);
        let batch = InFlight {
            messages: Arc::clone(&claim.claimed.messages),
            payloads: claim.payloads,
            next: AtomicUsize::new(0),
            outcomes: OutcomeQueue::new(claim.claimed.messages.len()),
            lease_start: claim.lease_start,
            start_deadline,
            claimed_at: claim.claimed.claimed_at,
            slots: claim.slots,
            suppressed,
            routes: RouteOutcomes::default(),
        };
        (claim.claimed, Arc::new(batch), span)
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

    /// Renders and sends a batch over `concurrency` sends that each take the next unsent
    /// message until none is left; until done or aborted. A large batch's sends are tasks,
    /// so that rendering spreads over the runtime's threads; a small one's run in place, in
    /// this task: they mostly wait on the network, and a task each would cost a thread
    /// wake-up each, more than the rendering they could share (BENCHMARKS.md, *Steady
    /// traffic*).
    pub async fn send_concurrently(&self, batch: &Arc<InFlight>) {
        let sends_wanted = self
            .settings
            .concurrency
            .clamp(1, batch.messages.len().max(1));
        let sends = (0..sends_wanted).map(|_| {
            let (sender, batch) = (Arc::clone(&self.messages), Arc::clone(batch));
            async move { sender.send_each(&batch).await }
        });
        if batch.messages.len() <= SEND_IN_PLACE_UP_TO {
            tokio::select! {
                biased;
                () = self.abort.cancelled() => {}
                _ = join_all(sends) => {}
            }
            return;
        }
        let mut tasks = JoinSet::new();
        for send in sends {
            tasks.spawn(send.in_current_span());
        }
        tokio::select! {
            biased;
            () = self.abort.cancelled() => {}
            () = async {
                while let Some(joined) = tasks.join_next().await {
                    match joined {
                        Ok(()) => {}
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

/// Batches up to this size are sent in the dispatcher's own task.
const SEND_IN_PLACE_UP_TO: usize = 64;
