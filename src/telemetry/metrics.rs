//! Prometheus metrics: every name defined once here, documented in docs/src/metrics.md, used by
//! `dashboards/` and `alerts/`, and checked by the tests. These names are a public contract.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::mailer::RelayState;
use crate::message::{Delivery, FailureType, Lane, Lanes, Outcome, ReleaseReason};
use crate::store::Prunable;
use crate::suppression::{BounceType, FeedbackSource};

mod otlp;
mod register;
use register::{register_feedback_counters, register_suppressed};
mod sample;

pub use super::labels::{
    BackgroundTask, DatabaseOperation, DsnResult, LookupResult, OTHER_KIND, UnsubscribeResult, WebhookResult,
};

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, type, unit and help text, all defined here and nowhere else.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    pub name: &'static str,
    pub metric_type: MetricType,
    /// `Some` for metrics measured in seconds.
    pub unit: Option<Unit>,
    pub help: &'static str,
}

const fn def(
    name: &'static str,
    metric_type: MetricType,
    unit: Option<Unit>,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        metric_type,
        unit,
        help,
    }
}

const SECONDS: Option<Unit> = Some(Unit::Seconds);

/// Declares each metric's name constant and its entry in [`ALL`] together, so that no
/// metric can be exported without its type and help, or be left out of the conventions
/// test that loops over `ALL` (`outbox_background_task_restarts_total` once was).
macro_rules! metrics {
    ($($name:ident = $text:literal, $kind:ident, $unit:expr, $help:literal;)*) => {
        $(pub const $name: &str = $text;)*

        /// Every metric outboxd exports; described to the recorder from this list, and the
        /// tests check every entry on a live `/metrics`.
        pub const ALL: &[MetricDef] = {
            use MetricType::{Counter, Gauge, Histogram};
            &[$(def($name, $kind, $unit, $help)),*]
        };
    };
}

metrics! {
    OLDEST_PENDING_AGE = "outbox_oldest_pending_age_seconds", Gauge, SECONDS,
        "How long the oldest pending message has been due (now minus the later of created_at and not_before); 0 when nothing is pending.";
    OLDEST_READY_AGE = "outbox_oldest_ready_age_seconds", Gauge, SECONDS,
        "How long the oldest message that is due now, and neither backing off nor leased, has waited to be claimed.";
    PENDING = "outbox_pending_messages", Gauge, None,
        "Messages neither dispatched nor dead-lettered, due or not.";
    DEAD_LETTERS = "outbox_dead_letter_messages", Gauge, None,
        "Dead-lettered messages.";
    OLDEST_TRANSACTION_AGE = "outbox_database_oldest_transaction_age_seconds", Gauge, SECONDS,
        "Age of the oldest transaction or snapshot open in outboxd's database (sessions of other roles where its role may see them: pg_read_all_stats): while it lasts, vacuum cannot remove sent rows' dead entries.";
    TABLE_DEAD_TUPLES = "outbox_table_dead_tuples", Gauge, None,
        "Dead tuples in outbox_messages, as PostgreSQL's statistics last counted them: what vacuum has yet to remove.";
    LAST_SAMPLE = "outbox_last_sample_timestamp_seconds", Gauge, SECONDS,
        "Unix time of the last successful sample of the database gauges.";
    SENT = "outbox_messages_sent_total", Counter, None,
        "Messages handed to SMTP successfully (delivery=\"smtp\"), or only logged and ended as logged_only, not sent, because no SMTP server is configured (delivery=\"log\").";
    SEND_FAILURES = "outbox_send_failures_total", Counter, None,
        "Failed delivery attempts, by class: transient (not delivered, retried), permanent (not delivered, dead-lettered) or ambiguous (the server had the whole message when its reply failed to come: perhaps delivered, retried with the same Message-ID).";
    DEAD_LETTERED = "outbox_messages_dead_lettered_total", Counter, None,
        "Messages dead-lettered, by the class of their last failure.";
    RELEASED = "outbox_messages_released_total", Counter, None,
        "Claimed messages given back unsent, by reason.";
    RECLAIMED = "outbox_messages_reclaimed_total", Counter, None,
        "Messages claimed after another claimer's lease ran out (a crashed or stalled replica).";
    LEASE_LOST = "outbox_lease_lost_total", Counter, None,
        "Outcomes not recorded because the lease had been taken over.";
    DELIVERY_LATENCY = "outbox_delivery_latency_seconds", Histogram, SECONDS,
        "From when a message fell due to when the SMTP server accepted it, by kind and lane; a bucket at each delivery objective's threshold (60 s).";
    SMTP_SEND_DURATION = "outbox_smtp_send_duration_seconds", Histogram, SECONDS,
        "Duration of one SMTP send, connection included.";
    DATABASE_ERRORS = "outbox_database_errors_total", Counter, None,
        "Failed database operations.";
    CIRCUIT_OPEN = "outbox_smtp_circuit_open", Gauge, None,
        "1 while a route's SMTP circuit breaker is open: every relay of the lane (lane=\"bulk\" only with OUTBOXD_BULK_SMTP_URL; else transactional carries both lanes) is unreachable, and the lane is not claimed.";
    NOTIFICATIONS_WORKING = "outbox_notifications_working", Gauge, None,
        "1 while a NOTIFY this replica sends comes back on its LISTEN connection; 0 when it does not (a transaction pooler in the way: set OUTBOXD_LISTEN_DATABASE_URL), and the dispatcher polls every 2 s instead.";
    LAST_CYCLE = "outbox_last_cycle_timestamp_seconds", Gauge, SECONDS,
        "Unix time of the dispatch loop's last completed cycle: its heartbeat.";
    READY = "outbox_ready", Gauge, None,
        "1 while this replica is ready: database reachable, schema migrated, not shutting down.";
    BUILD_INFO = "outbox_build_info", Gauge, None,
        "Always 1; labels carry the version and whether SMTP delivery is enabled.";
    PRUNED = "outbox_messages_pruned_total", Counter, None,
        "Dispatched and discarded rows deleted by retention, by state.";
    BACKGROUND_RESTARTS = "outbox_background_task_restarts_total", Counter, None,
        "Background tasks (retention, the sampler, the recorder's upkeep) started again after they failed or panicked, by task; each failure is also logged at ERROR.";
    THROTTLED = "outbox_throttled_total", Counter, None,
        "SMTP replies that said the relay is throttling (421/45x with 4.7.x, or a reply about rate or throttling): the message was released without an attempt and the pace cut.";
    EXPIRED = "outbox_messages_expired_total", Counter, None,
        "Messages not sent because their expiry passed first (expires_at, or OUTBOXD_EXPIRE_AFTER for their kind); not dead letters.";
    SEND_RATE_LIMIT = "outbox_send_rate_limit_per_second", Gauge, None,
        "The send rate the replicas share now (OUTBOXD_RATE_LIMIT, or without one the pace found from throttling replies; cut by throttling and recovering); 0 with no limit until the relay throttles.";
    SUPPRESSED = "outbox_messages_suppressed_total", Counter, None,
        "Messages not sent because every recipient is on the suppression list, by the first recipient's reason and the scope of its entry (all, bulk or transactional); not dead letters.";
    BOUNCES = "outbox_bounces_received_total", Counter, None,
        "Bounces received, by source (smtp: a 5xx reply saying the mailbox does not exist; ses, postmark, webhook: a provider's notification) and type (hard, soft, undetermined). Hard bounces suppress their address.";
    COMPLAINTS = "outbox_complaints_received_total", Counter, None,
        "Spam complaints received from a provider, by source; each suppresses its address.";
    WEBHOOK_REQUESTS = "outbox_webhook_requests_total", Counter, None,
        "Requests to the bounce and complaint webhooks, by source and result (accepted, or why refused).";
    RELAY_UP = "outbox_relay_up", Gauge, None,
        "1 while a relay (host:port; lane: transactional for OUTBOXD_SMTP_URL and its fallbacks, bulk for OUTBOXD_BULK_SMTP_URL and its) takes messages, 0 while it is down: passed over, and probed every 5 s.";
    RELAY_SENT = "outbox_relay_sent_total", Counter, None,
        "Messages a relay accepted, by relay (host:port) and whether it is a fallback (fallback=\"true\": the relays before it could not take them).";
    UNSUBSCRIBES = "outbox_unsubscribes_total", Counter, None,
        "One-click unsubscribe requests (RFC 8058, POST /unsubscribe/TOKEN), by result: recorded, already_recorded, refused (not a link outboxd made, or not the RFC's body), failed (not recorded now; the sender retries).";
    BOUNCE_LISTENER = "outbox_bounce_listener_messages_total", Counter, None,
        "Messages the bounce listener (OUTBOXD_BOUNCE_LISTEN) took, by result: recorded (a DSN about our message), replay, not_a_bounce (an auto-reply, or no failure reported), forged (a return path outboxd did not make), too_large, failed (not recorded now; refused with a 451, the sender retries).";
    RECIPIENT_LOOKUPS = "outbox_recipient_lookups_total", Counter, None,
        "Recipient lookups (the API's, the admin page's), by result: answered, busy (every connection for lookups in use: refused at once), timed_out (stopped by the server), failed.";
    LANE_OLDEST_READY_AGE = "outbox_lane_oldest_ready_age_seconds", Gauge, SECONDS,
        "Per lane (bulk: the kinds in OUTBOXD_BULK_KINDS; transactional: every other kind), how long its oldest message that is due now, and neither backing off nor leased, has waited to be claimed. Paused kinds are left out.";
    LANE_OLDEST_PENDING_AGE = "outbox_lane_oldest_pending_age_seconds", Gauge, SECONDS,
        "Per lane, how long its oldest pending message has been due (as outbox_oldest_pending_age_seconds). Paused kinds are left out.";
    LANE_READY = "outbox_lane_ready_messages", Gauge, None,
        "Per lane, messages due now, neither backing off nor leased. Paused kinds are left out.";
    LANE_SENT = "outbox_lane_sent_total", Counter, None,
        "Messages sent (as outbox_messages_sent_total), per lane: a bulk lane with ready messages and no sends has stopped.";
    KIND_PAUSED = "outbox_kind_paused", Gauge, None,
        "1 while an operator's pause holds a kind's messages unclaimed (outboxd pause), 0 once it is resumed; kinds without templates are folded into kind=\"other\".";
    KIND_AUTO_PAUSED = "outbox_kind_auto_paused", Gauge, None,
        "1 while outboxd itself holds a kind paused on a bounce or complaint breach (OUTBOXD_AUTO_PAUSE_KINDS), until an operator resumes it.";
    KIND_PAUSE_AGE = "outbox_kind_pause_age_seconds", Gauge, SECONDS,
        "How long a kind has been paused; 0 when it is not.";
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
const SMTP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the process-wide Prometheus recorder once and returns its handle. When
/// [`super::init`] set up an OTLP meter, the same metrics also go to it (a fan-out).
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    // get_or_init runs the install once even when several apps start at the same moment
    // (the tests do): a second install would fail, the recorder being process-wide.
    static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        let buckets = [
            (DELIVERY_LATENCY, LATENCY_BUCKETS),
            (SMTP_SEND_DURATION, SMTP_BUCKETS),
        ];
        let mut builder = PrometheusBuilder::new();
        for (name, bounds) in buckets {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.to_owned()), bounds)
                .map_err(|e| format!("cannot set the buckets of {name}: {e}"))?;
        }
        let prometheus = builder.build_recorder();
        let handle = prometheus.handle();
        let installed = match super::otlp_meter() {
            Some(meter) => metrics::set_global_recorder(
                metrics_util::layers::FanoutBuilder::default()
                    .add_recorder(prometheus)
                    .add_recorder(otlp::OtelRecorder::new(meter, &buckets))
                    .build(),
            )
            .map_err(|e| e.to_string()),
            None => metrics::set_global_recorder(prometheus).map_err(|e| e.to_string()),
        };
        installed.map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
        describe();
        Ok(handle)
    });
    handle.clone().map_err(anyhow::Error::msg)
}

fn describe() {
    for metric in ALL {
        let (name, help) = (metric.name, metric.help);
        match (metric.metric_type, metric.unit) {
            (MetricType::Counter, Some(unit)) => describe_counter!(name, unit, help),
            (MetricType::Counter, None) => describe_counter!(name, help),
            (MetricType::Gauge, Some(unit)) => describe_gauge!(name, unit, help),
            (MetricType::Gauge, None) => describe_gauge!(name, help),
            (MetricType::Histogram, Some(unit)) => describe_histogram!(name, unit, help),
            (MetricType::Histogram, None) => describe_histogram!(name, help),
        }
    }
}

/// What the dispatcher reports as it goes; also the heartbeat the liveness probe reads.
#[derive(Debug)]
pub struct Metrics {
    kinds: BTreeSet<String>,
    lanes: Lanes,
    /// The `kind` labels that have had a pause, so that a resume sets them back to 0.
    paused_labels: Mutex<BTreeSet<String>>,
    last_cycle_unix_ms: AtomicU64,
}

impl Metrics {
    /// Pre-registers every counter at 0 for the known kinds, so that rates exist from the
    /// first scrape and a dashboard never shows "no data" for a kind that has not failed yet.
    pub fn new<'a>(
        kinds: impl IntoIterator<Item = &'a str>,
        lanes: Lanes,
        smtp_enabled: bool,
    ) -> Self {
        let metrics = Self {
            kinds: kinds.into_iter().map(str::to_owned).collect(),
            lanes,
            paused_labels: Mutex::new(BTreeSet::new()),
            last_cycle_unix_ms: AtomicU64::new(unix_ms(SystemTime::now())),
        };
        let delivery = if smtp_enabled {
            Delivery::Smtp
        } else {
            Delivery::LoggedOnly
        };
        // Histograms too: a rate needs the series to exist before its first observation.
        drop(histogram!(SMTP_SEND_DURATION));
        for kind in metrics.kinds.iter().map(String::as_str).chain([OTHER_KIND]) {
            let lane = metrics.lanes.of(kind).as_str();
            drop(histogram!(DELIVERY_LATENCY, "kind" => kind.to_owned(), "lane" => lane));
            counter!(SENT, "kind" => kind.to_owned(), "delivery" => delivery.as_str()).increment(0);
            counter!(EXPIRED, "kind" => kind.to_owned()).increment(0);
            register_suppressed(kind, metrics.lanes.of(kind));
            for failure_type in FailureType::ALL {
                counter!(SEND_FAILURES, "kind" => kind.to_owned(), "class" => failure_type.as_str())
                    .increment(0);
                counter!(DEAD_LETTERED, "kind" => kind.to_owned(), "class" => failure_type.as_str())
                    .increment(0);
            }
        }
        for lane in Lane::ALL {
            counter!(LANE_SENT, "lane" => lane.as_str()).increment(0);
        }
        for reason in ReleaseReason::ALL {
            counter!(RELEASED, "reason" => reason.as_str()).increment(0);
        }
        for operation in DatabaseOperation::ALL {
            counter!(DATABASE_ERRORS, "operation" => operation.as_str()).increment(0);
        }
        for state in Prunable::ALL {
            counter!(PRUNED, "state" => state.as_str()).increment(0);
        }
        for task in BackgroundTask::ALL {
            counter!(BACKGROUND_RESTARTS, "task" => task.as_str()).increment(0);
        }
        register_feedback_counters();
        counter!(RECLAIMED).increment(0);
        counter!(LEASE_LOST).increment(0);
        counter!(THROTTLED).increment(0);
        gauge!(SEND_RATE_LIMIT).set(0.0);
        gauge!(READY).set(0.0);
        gauge!(
            BUILD_INFO,
            "version" => env!("CARGO_PKG_VERSION"),
            "smtp_enabled" => if smtp_enabled { "true" } else { "false" }
        )
        .set(1.0);
        metrics.cycle_completed();
        metrics
    }

    /// The `kind` label for a kind: itself if templates exist for it, `other` otherwise.
    pub fn kind_label(&self, kind: &str) -> String {
        if self.kinds.contains(kind) {
            kind.to_owned()
        } else {
            OTHER_KIND.to_owned()
        }
    }

    /// Counts one recorded outcome; `latency` is due-to-accepted for a sent message.
    pub fn outcome(&self, kind: &str, outcome: &Outcome, latency: Option<Duration>) {
        let lane = self.lanes.of(kind);
        let kind = self.kind_label(kind);
        match outcome {
            Outcome::Sent {
                via,
                relay,
                fallback,
                ..
            } => {
                counter!(LANE_SENT, "lane" => lane.as_str()).increment(1);
                if let Some(relay) = relay {
                    counter!(RELAY_SENT, "relay" => relay.clone(), "fallback" => fallback.to_string())
                        .increment(1);
                }
                if let Some(latency) = latency {
                    histogram!(DELIVERY_LATENCY, "kind" => kind.clone(), "lane" => lane.as_str())
                        .record(latency.as_secs_f64());
                }
                counter!(SENT, "kind" => kind, "delivery" => via.as_str()).increment(1);
            }
            Outcome::Retry { failure_type, .. } => {
                counter!(SEND_FAILURES, "kind" => kind, "class" => failure_type.as_str())
                    .increment(1);
            }
            Outcome::DeadLetter { failure_type, .. } => {
                counter!(SEND_FAILURES, "kind" => kind.clone(), "class" => failure_type.as_str())
                    .increment(1);
                counter!(DEAD_LETTERED, "kind" => kind, "class" => failure_type.as_str())
                    .increment(1);
            }
            Outcome::Release { reason, .. } => {
                if *reason == ReleaseReason::SmtpUnavailable {
                    counter!(SEND_FAILURES, "kind" => kind, "class" => FailureType::Transient.as_str())
                        .increment(1);
                }
                if *reason == ReleaseReason::Throttled {
                    counter!(THROTTLED).increment(1);
                }
                counter!(RELEASED, "reason" => reason.as_str()).increment(1);
            }
            Outcome::Expired => counter!(EXPIRED, "kind" => kind).increment(1),
            Outcome::Suppressed { reason, scope, .. } => {
                counter!(SUPPRESSED, "kind" => kind, "reason" => reason.as_str(), "scope" => scope.as_str())
                    .increment(1);
            }
        }
    }

    /// Counts one bounce reported by a server or a provider.
    pub fn bounce(&self, source: FeedbackSource, bounce_type: BounceType) {
        counter!(BOUNCES, "source" => source.as_str(), "type" => bounce_type.as_str()).increment(1);
    }

    /// Counts one spam complaint reported by a provider.
    pub fn complaint(&self, source: FeedbackSource) {
        counter!(COMPLAINTS, "source" => source.as_str()).increment(1);
    }

    /// Counts one request to a feedback webhook.
    pub fn webhook_request(&self, source: FeedbackSource, result: WebhookResult) {
        counter!(WEBHOOK_REQUESTS, "source" => source.as_str(), "result" => result.as_str())
            .increment(1);
    }

    /// Each route's circuit closed, and each relay's sent counter at 0, once at start, so
    /// that a rate over it has a series before the first message; and each relay's state.
    pub fn register_relays(&self, routes: &[Lane], relays: &[RelayState]) {
        for route in routes {
            self.circuit_open(*route, false);
        }
        let mut lanes_seen = BTreeSet::new();
        for relay in relays {
            let fallback = (!lanes_seen.insert(relay.lane)).to_string();
            counter!(RELAY_SENT, "relay" => relay.relay.clone(), "fallback" => fallback)
                .increment(0);
        }
        self.relays(relays);
    }

    /// Each relay's state, labelled with its route (the lane whose relays it is).
    pub fn relays(&self, relays: &[RelayState]) {
        for relay in relays {
            gauge!(RELAY_UP, "relay" => relay.relay.clone(), "lane" => relay.lane.as_str())
                .set(if relay.up { 1.0 } else { 0.0 });
        }
    }

    /// Counts one message the bounce listener took.
    pub fn bounce_listener(&self, result: DsnResult) {
        counter!(BOUNCE_LISTENER, "result" => result.as_str()).increment(1);
    }

    /// Counts one one-click unsubscribe request.
    pub fn unsubscribe(&self, result: UnsubscribeResult) {
        counter!(UNSUBSCRIBES, "result" => result.as_str()).increment(1);
    }

    pub fn recipient_lookup(&self, result: LookupResult) {
        counter!(RECIPIENT_LOOKUPS, "result" => result.as_str()).increment(1);
    }

    pub fn smtp_send(&self, duration: Duration) {
        histogram!(SMTP_SEND_DURATION).record(duration.as_secs_f64());
    }

    pub fn reclaimed(&self) {
        counter!(RECLAIMED).increment(1);
    }

    pub fn lease_lost(&self) {
        counter!(LEASE_LOST).increment(1);
    }

    pub fn database_error(&self, operation: DatabaseOperation) {
        counter!(DATABASE_ERRORS, "operation" => operation.as_str()).increment(1);
    }

    pub fn pruned(&self, state: Prunable, rows: u64) {
        counter!(PRUNED, "state" => state.as_str()).increment(rows);
    }

    pub fn background_task_restarted(&self, task: BackgroundTask) {
        counter!(BACKGROUND_RESTARTS, "task" => task.as_str()).increment(1);
    }

    /// The shared send rate now, in messages per second.
    pub fn send_rate_limit(&self, per_second: f64) {
        gauge!(SEND_RATE_LIMIT).set(per_second);
    }

    /// A route's circuit (the lane whose relays they are) opened or closed.
    pub fn circuit_open(&self, route: Lane, open: bool) {
        gauge!(CIRCUIT_OPEN, "lane" => route.as_str()).set(if open { 1.0 } else { 0.0 });
    }

    pub fn notifications_working(&self, working: bool) {
        gauge!(NOTIFICATIONS_WORKING).set(if working { 1.0 } else { 0.0 });
    }

    pub fn ready(&self, ready: bool) {
        gauge!(READY).set(if ready { 1.0 } else { 0.0 });
    }

    /// The heartbeat: the loop made progress now.
    pub fn cycle_completed(&self) {
        let now = SystemTime::now();
        self.last_cycle_unix_ms
            .store(unix_ms(now), Ordering::Relaxed);
        gauge!(LAST_CYCLE).set(unix_seconds(now));
    }

    /// How long since the loop last made progress.
    pub fn since_last_cycle(&self) -> Duration {
        let last = self.last_cycle_unix_ms.load(Ordering::Relaxed);
        Duration::from_millis(unix_ms(SystemTime::now()).saturating_sub(last))
    }
}

/// Sets the database gauges from a sample.
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
