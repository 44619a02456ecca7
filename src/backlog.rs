//! Whether delivery is draining a backlog: the dispatcher says so at each claim that comes
//! back full, and work that can wait (the callback sender) leaves it the cores meanwhile.
//! On a machine whose cores a drain fills, each callback costs a send's share of them; the
//! callbacks still flow during a drain, at a bounded share, and catch up once it ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after a full claim delivery counts as draining.
const DRAINING_FOR: Duration = Duration::from_secs(1);

/// One replica's view of its dispatcher's backlog.
#[derive(Debug)]
pub struct Backlog {
    started: Instant,
    /// Milliseconds after `started` until which delivery is draining.
    draining_until: AtomicU64,
}

impl Default for Backlog {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            draining_until: AtomicU64::new(0),
        }
    }
}

impl Backlog {
    /// A claim came back full: more is due than one claim takes.
    pub fn claimed_full(&self) {
        let until = self.started.elapsed() + DRAINING_FOR;
        let millis = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.draining_until.fetch_max(millis, Ordering::Relaxed);
    }

    /// Whether a claim came back full within the last second.
    pub fn draining(&self) -> bool {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        now < self.draining_until.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_claim_marks_a_drain_for_a_second() {
        let backlog = Backlog::default();
        assert!(!backlog.draining());
        backlog.claimed_full();
        assert!(backlog.draining());
    }
}
