//! Samples the database gauges on their own schedule, independent of the dispatch loop, so
//! that they keep telling the truth when the loop is hung.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::health::Health;
use crate::store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics, record_sample};

/// Samples now and then every `interval` until `stop`. A failed sample leaves the gauges
/// alone and says so through `outbox_last_sample_timestamp_seconds`, which stops advancing,
/// and `outbox_database_errors_total{operation="sample"}`.
pub async fn run(
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        match tokio::time::timeout(interval, store::sample(health.pool())).await {
            Ok(Ok(sample)) => {
                record_sample(&sample);
                debug!(?sample, "sampled the outbox");
            }
            Ok(Err(e)) => {
                metrics.database_error(DatabaseOperation::Sample);
                warn!(error = %e, "could not sample the outbox gauges");
            }
            Err(_elapsed) => {
                metrics.database_error(DatabaseOperation::Sample);
                warn!("sampling the outbox gauges timed out");
            }
        }
        health.readiness().await;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
