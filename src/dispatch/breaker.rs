//! The SMTP circuit breakers, one per route (the lane whose relays they are; see
//! `Mailer::route`): after a batch in which no message of a route reached a relay, the
//! route's lanes are not claimed, and its relays are probed with growing pauses until one
//! answers. Messages keep their attempts meanwhile: an outage is not their fault. The other
//! route's lane goes on.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::wake::OUTAGE_BACKOFF;
use crate::lock::lock;
use crate::mailer::Mailer;
use crate::message::Lane;
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

/// Each route's circuit.
#[derive(Debug)]
pub(super) struct Circuits {
    breakers: Vec<(Lane, CircuitBreaker)>,
}

impl Circuits {
    pub fn new(routes: &[Lane]) -> Self {
        Self {
            breakers: routes
                .iter()
                .map(|route| (*route, CircuitBreaker::default()))
                .collect(),
        }
    }

    /// The lanes that may be claimed: those whose route's circuit is closed. A route whose
    /// wait is over is probed here only when no other route's lane can be claimed; else the
    /// claim does not wait for it, and it closes when its relays' own probers find one up.
    /// When no lane may be claimed, how long until the next probe.
    pub async fn closed_lanes(&self, mailer: &Mailer, metrics: &Metrics) -> Result<Vec<Lane>, Duration> {
        let any_closed = self.breakers.iter().any(|(_, breaker)| breaker.is_closed());
        let mut closed = Vec::with_capacity(self.breakers.len());
        let mut next_probe: Option<Duration> = None;
        for (route, breaker) in &self.breakers {
            let probe = if any_closed { Probe::RelaysUp } else { Probe::Now };
            match breaker.closed_or_wait(*route, mailer, metrics, probe).await {
                None => closed.push(*route),
                Some(wait) => next_probe = Some(next_probe.map_or(wait, |w| w.min(wait))),
            }
        }
        match next_probe {
            Some(wait) if closed.is_empty() => Err(wait),
            _ => Ok(Lane::ALL
                .into_iter()
                .filter(|lane| closed.contains(&mailer.route(*lane)))
                .collect()),
        }
    }

    /// How long until the soonest open circuit's wait is over (zero when it is), if one is
    /// open.
    pub fn next_probe_in(&self) -> Option<Duration> {
        let now = Instant::now();
        self.breakers
            .iter()
            .filter_map(|(_, breaker)| match *lock(&breaker.state) {
                State::Closed => None,
                State::Open { until, .. } => Some(until.saturating_duration_since(now)),
            })
            .min()
    }

    /// Opens a route's circuit after a batch met an outage on it.
    pub fn open(&self, route: Lane, metrics: &Metrics) {
        if let Some((_, breaker)) = self.breakers.iter().find(|(r, _)| *r == route) {
            breaker.open(route, metrics);
        }
    }
}

/// How an open circuit whose wait is over learns whether its relays answer again.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// A probe now, awaited: nothing else can be claimed meanwhile.
    Now,
    /// What the relays' background probers found (`Mailer::route_is_up`): another lane's
    /// claim must not wait for a relay that hangs.
    RelaysUp,
}

/// Open while a route's relays are unreachable; see the module's documentation.
#[derive(Debug, Default)]
struct CircuitBreaker {
    /// Shared: every send reports to it as it ends, and the loop asks it before a claim.
    state: Mutex<State>,
}

impl CircuitBreaker {
    fn is_closed(&self) -> bool {
        matches!(*lock(&self.state), State::Closed)
    }

    /// `None` when sends may go ahead; otherwise how long until the next probe. When the
    /// breaker's wait is over, probes the server once (or reads its relays' state) and
    /// closes or re-opens it.
    async fn closed_or_wait(
        &self,
        route: Lane,
        mailer: &Mailer,
        metrics: &Metrics,
        probe: Probe,
    ) -> Option<Duration> {
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
        let answered = match probe {
            Probe::Now => mailer.probe(route).await,
            Probe::RelaysUp if mailer.route_is_up(route) => Ok(()),
            Probe::RelaysUp => Err(crate::mailer::SendError::Unreachable(
                "every relay of the route is down; their probers try every 5 s".to_owned(),
            )),
        };
        match answered {
            Ok(()) => {
                *lock(&self.state) = State::Closed;
                metrics.circuit_open(route, false);
                info!(route = route.as_str(), "SMTP server reachable again; circuit closed, resuming delivery");
                None
            }
            Err(e) => {
                let failures = failures.saturating_add(1);
                let retry_in = OUTAGE_BACKOFF.delay_after(failures);
                *lock(&self.state) = State::Open {
                    until: Instant::now() + retry_in,
                    failures,
                };
                warn!(route = route.as_str(), error = %e, retry_in = %crate::text::duration(retry_in), "SMTP server still unreachable");
                Some(retry_in)
            }
        }
    }

    /// Opens the circuit after a batch met an outage.
    fn open(&self, route: Lane, metrics: &Metrics) {
        let retry_in = OUTAGE_BACKOFF.delay_after(1);
        metrics.circuit_open(route, true);
        *lock(&self.state) = State::Open {
            until: Instant::now() + retry_in,
            failures: 1,
        };
        error!(
            route = route.as_str(),
            retry_in = %crate::text::duration(retry_in),
            "SMTP server unreachable: circuit open, claiming of its lanes paused; messages keep their attempts"
        );
    }
}
