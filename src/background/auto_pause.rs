//! The automatic pause (`OUTBOXD_AUTO_PAUSE_KINDS`): every so often, each listed kind's
//! latest sends are judged against the bounce and complaint thresholds, and a kind past one
//! is paused as an operator would pause it, until an operator resumes it. Every replica
//! checks; the first to see a breach pauses, the others find the kind paused.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use crate::message::AutoPause;
use crate::store::pauses;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// Checks every listed kind now and then every `interval`, until `stop`.
pub async fn run(
    pool: Store,
    rule: AutoPause,
    metrics: Arc<Metrics>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        for kind in &rule.kinds {
            match check(&pool, &rule, kind.as_str(), interval).await {
                Ok(Some(reason)) => {
                    error!(kind = %kind, reason = %reason, "paused a kind: resume it with outboxd resume once the cause is fixed");
                }
                Ok(None) => {}
                Err(e) => {
                    metrics.database_error(DatabaseOperation::AutoPause);
                    warn!(kind = %kind, error = %e, "could not check the kind's bounces and complaints");
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Pauses `kind` when its latest sends breach a threshold; the reason when this check
/// paused it. The read of the sends gets `within`, the time to the next check, at most.
async fn check(
    pool: &Store,
    rule: &AutoPause,
    kind: &str,
    within: Duration,
) -> Result<Option<String>, sqlx::Error> {
    let recent = pauses::recent_sends(pool, kind, rule.judged_sends(), within).await?;
    let Some(reason) = rule.breach(&recent) else {
        return Ok(None);
    };
    let paused = pauses::pause_automatically(pool, kind, &reason, recent.since).await?;
    Ok(paused.then_some(reason))
}
