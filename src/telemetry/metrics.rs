//! Prometheus metrics: every name defined once here, documented in docs/src/metrics.md, used by
//! `dashboards/` and `alerts/`, and checked by the tests. These names are a public contract.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::mailer::RelayState;
use crate::message::{Delivery, FailureType, Lane, Lanes, Outcome, ReleaseReason};
use crate::store::Prunable;
use crate::suppression::{BounceType, FeedbackSource};

mod definitions;
mod otlp;
mod register;
pub use definitions::*;
use register::{register_feedback_counters, register_suppressed};
mod sample;

pub use super::labels::{
    BackgroundTask, CallbackFailure, DatabaseOperation, DsnResult, LookupResult, OTHER_KIND, UnsubscribeResult, WebhookResult,
};


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
        counter!(CANCELLED).increment(0);
        gauge!(CALLBACKS_PENDING).set(0.0);
        gauge!(CALLBACK_OLDEST_AGE).set(0.0);
        for failure in CallbackFailure::ALL {
            counter!(CALLBACK_FAILURES, "reason" => failure.as_str()).increment(0);
        }
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
            // Counted from the timeline's events, where the producers' own are too.
            Outcome::Cancelled => {}
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
            self.send_rate_limit(*route, 0.0);
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

    /// A callback's POST failed.
    pub fn callback_failed(&self, failure: CallbackFailure) {
        counter!(CALLBACK_FAILURES, "reason" => failure.as_str()).increment(1);
    }

    /// A route's shared send rate now (the lane whose relays it paces), in messages per
    /// second.
    pub fn send_rate_limit(&self, route: Lane, per_second: f64) {
        gauge!(SEND_RATE_LIMIT, "lane" => route.as_str()).set(per_second);
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
