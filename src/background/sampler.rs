//! Samples the database gauges on their own schedule, independent of the dispatch loop, so
//! that they keep telling the truth when the loop is hung.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::health::Health;
use crate::store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// How long past the sample interval the sampler waits for the server to cancel a sample
/// before it stops waiting (a server that does not answer at all).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Samples now and then every `interval` until `stop`, on a connection of its own (not
/// readiness's), each sample cancelled by the server if it outlasts the interval. A failed
/// sample leaves the gauges alone and says so through `outbox_last_sample_timestamp_seconds`,
/// which stops advancing, and `outbox_database_errors_total{operation="sample"}`.
pub async fn run(
    pool: Store,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    interval: Duration,
    stop: CancellationToken,
) {
    // The newest timeline event read: cancellations are counted from the events after it.
    let mut events_after = None;
    loop {
        let sampled = tokio::select! {
            () = stop.cancelled() => return,
            sampled = tokio::time::timeout(interval + CANCEL_GRACE, store::sample(&pool, interval, events_after)) => sampled,
        };
        match sampled {
            Ok(Ok(sample)) => {
                events_after = Some(sample.events.last_id);
                metrics.sample(&sample);
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
