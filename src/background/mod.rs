//! What runs beside the dispatcher and is not it: the database gauges and readiness on
//! their own schedule, retention, the Prometheus recorder's upkeep, and the health state
//! that the probes read.

pub mod health;
pub mod retention;
pub mod sampler;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

/// How often the recorder drains its histograms' buckets.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps the Prometheus recorder tidy until `stop`; without an HTTP listener of its own,
/// the exporter leaves this to its owner.
pub async fn recorder_upkeep(prometheus: PrometheusHandle, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(UPKEEP_INTERVAL) => prometheus.run_upkeep(),
        }
    }
}
