//! The SMTP circuit breaker: after a batch in which no message reached the server, claiming
//! pauses, and the server is probed with growing pauses until it answers. Messages keep
//! their attempts meanwhile: an outage is not their fault.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::wake::OUTAGE_BACKOFF;
use crate::lock::lock;
use crate::mailer::Mailer;
use crate::telemetry::metrics::Metrics;

#[derive(Debug, Default)]
enum State {
    #[default]
    Closed,
    Open {
        until: Instant,
        failures: u32,
    },
}

/// Open while the SMTP server is unreachable; see the module's documentation.
#[derive(Debug, Default)]
pub(super) struct CircuitBreaker {
    /// Shared: every send reports to it as it ends, and the loop asks it before a claim.
    state: Mutex<State>,
}

impl CircuitBreaker {
    /// `None` when sends may go ahead; otherwise how long until the next probe. When the
    /// breaker's wait is over, probes the server once and closes or re-opens it.
    pub async fn closed_or_wait(&self, mailer: &Mailer, metrics: &Metrics) -> Option<Duration> {
        let failures = match *lock(&self.state) {
            State::Closed => return None,
            State::Open { until, failures } => {
                let now = Instant::now();
                if now < until {
                    return Some(until - now);
                }
                failures
            }
        };
        match mailer.probe().await {
            Ok(()) => {
                *lock(&self.state) = State::Closed;
                metrics.circuit_open(false);
                info!("SMTP server reachable again; circuit closed, resuming delivery");
                None
            }
            Err(e) => {
                let failures = failures.saturating_add(1);
                let retry_in = OUTAGE_BACKOFF.delay_after(failures);
                *lock(&self.state) = State::Open {
                    until: Instant::now() + retry_in,
                    failures,
                };
                warn!(error = %e, retry_in = %crate::text::duration(retry_in), "SMTP server still unreachable");
                Some(retry_in)
            }
        }
    }

    /// Opens the circuit after a batch met an outage.
    pub fn open(&self, metrics: &Metrics) {
        let retry_in = OUTAGE_BACKOFF.delay_after(1);
        metrics.circuit_open(true);
        *lock(&self.state) = State::Open {
            until: Instant::now() + retry_in,
            failures: 1,
        };
        error!(
            retry_in = %crate::text::duration(retry_in),
            "SMTP server unreachable: circuit open, claiming paused; messages keep their attempts"
        );
    }
}
