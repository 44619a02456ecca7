//! What runs beside the dispatcher and is not it: the database gauges and readiness on
//! their own schedule, retention, the Prometheus recorder's upkeep, and the health state
//! that the probes read.

pub mod auto_pause;
pub mod health;
pub mod retention;
pub mod sampler;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::telemetry::metrics::{BackgroundTask, Metrics};
use crate::telemetry::{PanicContext, catch_panic};
use crate::text::mask_addresses;

/// The pause before a failed background task is started again; it doubles while the task
/// keeps failing, up to [`MAX_RESTART_PAUSE`].
const RESTART_PAUSE: Duration = Duration::from_secs(1);
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(60);

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

/// Runs a background task until it ends by itself (at `stop`); when it fails instead (a
/// panic, which the hook logs once at ERROR), counts it in `outbox_background_task_restarts_total`, and
/// starts it again, so that no task dies silently.
pub async fn supervise<F, Fut>(
    task: BackgroundTask,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    mut start: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut pause = RESTART_PAUSE;
    loop {
        let context = PanicContext {
            outbox_id: None,
            task: Some(task.as_str()),
            what: "a background task panicked; starting it again",
        };
        match tokio::spawn(catch_panic(context, start())).await {
            Ok(Ok(())) => return,
            // The hook logged it, saying which task.
            Ok(Err(_)) => {}
            // Cancelled by the runtime, or a panic while the task's future was dropped
            // (the hook logged that one); its text may quote an address.
            Err(e) => error!(
                task = task.as_str(),
                error = %mask_addresses(&e.to_string()),
                "a background task failed; starting it again"
            ),
        }
        metrics.background_task_restarted(task);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_RESTART_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_until_it_ends() {
        let runs = Arc::new(AtomicU32::new(0));
        let metrics = Arc::new(Metrics::new([], Default::default(), false));
        let counted = Arc::clone(&runs);
        supervise(
            BackgroundTask::Retention,
            metrics,
            CancellationToken::new(),
            move || {
                let run = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    assert!(run > 0, "the first run fails");
                }
            },
        )
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
