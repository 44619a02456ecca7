//! What the relay's replies say about the pace, a window of a second or more at a time.
//!
//! A relay that limits a rate accepts as many a second after a cut as before it, and refuses
//! the share of sends above that. A relay that refuses a share of messages whatever the
//! rate (a limit per recipient domain, a greylist answering 4.7.x, a backend that sheds
//! load) refuses the same share after the cut, and cutting again for it, second after
//! second, is how a quarter refused took a 50/s pace down to 2.2/s. So the window after a
//! cut is held against both: where the two foretell shares chance cannot confuse, and the
//! share did not change, it is tolerated from then on, and only refusals above it, by more
//! than chance explains, cut the pace again. In doubt it is the rate: a share that rose
//! (a relay's burst spent) or one a pace grown back since foretells as well is cut for.
//! The tolerated share falls back as the refusals stop.
//!
//! Replies to sends booked at the pace before a cut (up to `settle` after it) say nothing
//! of the new pace and are not judged.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::lock::lock;

/// The shortest window judged: a burst of refusals is one signal.
const WINDOW: Duration = Duration::from_secs(1);
/// One cut takes at most this share off the pace.
pub(super) const MAX_CUT: f64 = 0.75;
/// How many standard errors above the tolerated share a window's share must be to cut.
const NOISE_SIGMAS: f64 = 2.0;
/// How much of the way down to a lower share the tolerated share moves in a window.
const TOLERANCE_DECAY: f64 = 0.5;

/// The replies counted as sends end, and the judge of each window of them.
#[derive(Debug)]
pub(super) struct Replies {
    accepted: AtomicU64,
    refused: AtomicU64,
    judge: Mutex<Judge>,
}

/// A cut the replies call for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Cut {
    /// What the pace is multiplied by.
    pub factor: f64,
    /// The share of the window's sends refused, and the share tolerated.
    pub refused_share: f64,
    pub tolerated: f64,
    /// What the relay accepted over the window, in messages a second (over a second at
    /// least: a relay takes a burst before it refuses): where a found pace starts.
    pub accepted_rate: f64,
}

impl Replies {
    pub fn new(settle: Duration) -> Self {
        Self {
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            judge: Mutex::new(Judge::new(Instant::now(), settle)),
        }
    }

    /// The relay accepted a send.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// The relay answered a send with a throttling reply.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The cut the replies since the last call call for, if any, at `pace`, the pace the
    /// sends were booked at (`None`: nothing paces them yet, and a refusal is judged
    /// without waiting for the window to fill).
    pub fn judge(&self, pace: Option<f64>) -> Option<Cut> {
        let counts = Counts {
            accepted: self.accepted.swap(0, Ordering::Relaxed),
            refused: self.refused.swap(0, Ordering::Relaxed),
        };
        lock(&self.judge).observe(Instant::now(), counts, pace)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    accepted: u64,
    refused: u64,
}

impl Counts {
    fn sent(self) -> u64 {
        self.accepted + self.refused
    }

    fn refused_share(self) -> f64 {
        self.refused as f64 / self.sent().max(1) as f64
    }
}

/// The window that caused the last cut, for judging whether the pace was what the relay
/// refused.
#[derive(Debug, Clone, Copy)]
struct LastCut {
    share: f64,
    /// The pace its sends were booked at.
    pace: f64,
}

#[derive(Debug)]
struct Judge {
    since: Instant,
    counts: Counts,
    settle: Duration,
    settling_until: Option<Instant>,
    last_cut: Option<LastCut>,
    /// The share of sends the relay refuses whatever the pace.
    tolerated: f64,
}

impl Judge {
    fn new(now: Instant, settle: Duration) -> Self {
        Self {
            since: now,
            counts: Counts::default(),
            settle,
            settling_until: None,
            last_cut: None,
            tolerated: 0.0,
        }
    }

    fn observe(&mut self, now: Instant, counts: Counts, pace: Option<f64>) -> Option<Cut> {
        if let Some(until) = self.settling_until {
            // These replies answer sends booked before the cut: the window starts afresh.
            if now >= until {
                self.settling_until = None;
            }
            self.since = now;
            return None;
        }
        self.counts.accepted += counts.accepted;
        self.counts.refused += counts.refused;
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < WINDOW && !(pace.is_none() && self.counts.refused > 0) {
            return None;
        }
        let window = std::mem::take(&mut self.counts);
        self.since = now;
        if window.sent() == 0 {
            return None;
        }
        self.learn(window, pace);
        let share = window.refused_share();
        if window.refused == 0 || share - self.tolerated <= self.noise(window) {
            return None;
        }
        let factor = ((1.0 - share) / (1.0 - self.tolerated)).clamp(1.0 - MAX_CUT, 1.0);
        // A window shorter than a second is mostly the relay's burst: what it accepted then
        // says nothing of its rate.
        self.last_cut = pace
            .filter(|_| elapsed >= WINDOW)
            .map(|pace| LastCut { share, pace });
        self.settling_until = Some(now + self.settle);
        Some(Cut {
            factor,
            refused_share: share,
            tolerated: self.tolerated,
            accepted_rate: window.accepted as f64 / elapsed.as_secs_f64().max(1.0),
        })
    }

    /// Updates the tolerated share from a window at `pace`: to the share a cut did not
    /// change where a limit on the rate would have, and down towards a share clearly
    /// below it.
    fn learn(&mut self, window: Counts, pace: Option<f64>) {
        let share = window.refused_share();
        if let (Some(cut), Some(pace)) = (self.last_cut.take(), pace) {
            // A limit on the rate accepts as many a second as before the cut.
            let accepted = (1.0 - cut.share) * cut.pace;
            let had_it_been_the_rate = (1.0 - accepted / pace).max(0.0);
            let chance =
                NOISE_SIGMAS * (cut.share * (1.0 - cut.share) / window.sent() as f64).sqrt();
            if cut.share - had_it_been_the_rate > chance && (share - cut.share).abs() <= chance {
                self.tolerated = share.min(cut.share);
                return;
            }
        }
        if window.refused == 0 || share < self.tolerated - self.noise(window) {
            self.tolerated -= (self.tolerated - share) * TOLERANCE_DECAY;
        }
    }

    /// How far above the tolerated share a window's share may lie by chance alone.
    fn noise(&self, window: Counts) -> f64 {
        let p = self.tolerated;
        NOISE_SIGMAS * (p * (1.0 - p) / window.sent().max(1) as f64).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Counts, Judge, MAX_CUT};

    const SETTLE: Duration = Duration::from_secs(1);

    /// A judge fed one window a second, each of `sent` sends booked at a pace of `sent` a
    /// second, `refused` of them refused; returns the factor of each window's cut (1 for
    /// none).
    fn run(windows: &[(u64, u64)]) -> (Vec<f64>, Judge) {
        let start = Instant::now();
        let mut judge = Judge::new(start, SETTLE);
        let mut factors = Vec::new();
        for (second, &(sent, refused)) in (1u32..).zip(windows) {
            let counts = Counts {
                accepted: sent - refused,
                refused,
            };
            let now = start + Duration::from_secs(u64::from(second));
            let cut = judge.observe(now, counts, Some(sent as f64));
            factors.push(cut.map_or(1.0, |c| c.factor));
        }
        (factors, judge)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_rate_limit_is_cut_by_the_share_it_refused_and_again_when_it_refuses_again() {
        // 80 a second against a relay taking 40: half refused. After the cut (and the
        // second of sends booked before it) 40 a second go through, then the pace grows.
        let (factors, judge) = run(&[(80, 40), (60, 20), (40, 0), (44, 4)]);
        assert!(close(factors[0], 0.5), "{factors:?}");
        assert!(close(factors[1], 1.0), "the settling second is not judged");
        assert!(close(factors[2], 1.0));
        assert!(close(factors[3], 40.0 / 44.0), "{factors:?}");
        assert!(close(judge.tolerated, 0.0));
    }

    #[test]
    fn a_share_refused_whatever_the_pace_is_cut_once_then_tolerated() {
        // Every fourth refused: one cut, the settling second, then the same quarter.
        let (factors, judge) = run(&[(40, 10), (35, 9), (30, 8), (32, 8), (36, 9), (40, 10)]);
        assert!(close(factors[0], 0.75), "{factors:?}");
        assert!(factors[2..].iter().all(|f| close(*f, 1.0)), "{factors:?}");
        assert!(close(judge.tolerated, 0.25), "{}", judge.tolerated);
        // Refusals well above the tolerated share cut by what lies above it.
        let mut judge = judge;
        let later = Instant::now() + Duration::from_secs(60);
        let cut = judge.observe(
            later,
            Counts {
                accepted: 30,
                refused: 30,
            },
            Some(60.0),
        );
        assert!(close(cut.expect("a cut").factor, 0.5 / 0.75), "{cut:?}");
    }

    #[test]
    fn a_share_that_rises_after_a_cut_is_a_burst_spent_not_a_share_to_tolerate() {
        // 100 a second to a relay taking 40 with 40 in hand: a fifth refused at first, half
        // once the burst is spent.
        let (factors, judge) = run(&[(100, 20), (80, 40), (82, 42)]);
        assert!(close(factors[0], 0.8), "{factors:?}");
        assert!(close(factors[2], 40.0 / 82.0), "{factors:?}");
        assert!(close(judge.tolerated, 0.0));
    }

    #[test]
    fn a_pace_grown_back_past_the_rate_is_cut_again_not_tolerated() {
        // Cut from 42 a second to 40, grown to 44 by the next window: a rate limit and a
        // share whatever the rate foretell the same refusals, and the rate is the usual one.
        let (factors, judge) = run(&[(42, 2), (41, 1), (44, 4)]);
        assert!(close(factors[2], 40.0 / 44.0), "{factors:?}");
        assert!(close(judge.tolerated, 0.0));
    }

    #[test]
    fn the_tolerated_share_falls_back_when_the_refusals_stop() {
        let mut windows = vec![(40, 10), (35, 9), (30, 8)];
        windows.extend([(40, 0); 8]);
        let (_, judge) = run(&windows);
        assert!(judge.tolerated < 0.001, "{}", judge.tolerated);
        // And a refusal then cuts at once, as the relay's limit would want.
        windows.push((40, 4));
        let (factors, _) = run(&windows);
        let last = *factors.last().unwrap();
        assert!((last - 0.9).abs() < 0.01, "{factors:?}");
    }

    #[test]
    fn a_window_under_a_second_is_judged_only_when_nothing_paces_the_sends_yet() {
        let start = Instant::now();
        let counts = Counts {
            accepted: 20,
            refused: 5,
        };
        let soon = start + Duration::from_millis(100);
        let paced = Judge::new(start, SETTLE).observe(soon, counts, Some(250.0));
        assert_eq!(paced, None);
        let cut = Judge::new(start, SETTLE).observe(soon, counts, None);
        let cut = cut.expect("judged at once");
        assert!(close(cut.factor, 0.8));
        assert!(close(cut.accepted_rate, 20.0), "over a second at least");
    }

    #[test]
    fn no_cut_takes_more_than_its_most() {
        let (factors, _) = run(&[(100, 100)]);
        assert!(close(factors[0], 1.0 - MAX_CUT), "{factors:?}");
    }
}
