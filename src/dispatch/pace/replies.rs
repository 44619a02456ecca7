//! What the relay's replies say about the pace, a window of a second or more at a time:
//! a share refused above what the relay refuses whatever the rate cuts the pace; a share
//! that stayed the same across two falls of the pace is tolerated. Why:
//! docs/adr/0004-the-pace.md. Replies to sends booked at the pace before a cut (up to
//! `settle` after it) say nothing of the new pace and are not judged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The shortest window judged: a burst of refusals is one signal.
const WINDOW: Duration = Duration::from_secs(1);
/// The fewest replies a window is judged on, unless it reaches [`LONGEST_WINDOW`]: a share
/// of a handful of replies is mostly chance (two of four refused is not half).
const FEWEST_REPLIES: u64 = 20;
/// The longest a window waits for [`FEWEST_REPLIES`].
const LONGEST_WINDOW: Duration = Duration::from_secs(5);
/// One cut takes at most this share off the pace.
pub(super) const MAX_CUT: f64 = 0.75;
/// How many standard errors apart two shares must be to differ.
const NOISE_SIGMAS: f64 = 2.0;
/// How much of the way down to a lower share the tolerated share moves in a window.
const TOLERANCE_DECAY: f64 = 0.5;
/// The least fall of the pace that says something of the relay: a tenth.
const MIN_FALL: f64 = 0.1;
/// How many falls in a row must leave the share unchanged before it is tolerated: one
/// could be a relay's burst running out just as the pace fell.
const FALLS_TO_TOLERATE: u32 = 2;
/// The highest share ever tolerated.
const MOST_TOLERATED: f64 = 0.99;

/// The relay's replies, counted by the send tasks as each send ends and taken by the
/// claim's judgement: the one part of the pace they share.
#[derive(Debug, Default)]
pub(crate) struct ReplyCount {
    /// Shared: the send tasks add, the claim takes.
    accepted: AtomicU64,
    /// Shared, as `accepted`.
    refused: AtomicU64,
}

impl ReplyCount {
    /// The relay accepted a send.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// The relay answered a send with a throttling reply.
    pub fn throttled(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The replies counted since the last call.
    fn take(&self) -> (u64, u64) {
        (
            self.accepted.swap(0, Ordering::Relaxed),
            self.refused.swap(0, Ordering::Relaxed),
        )
    }
}

/// The judge of the replies, a window at a time; the claim path's alone.
#[derive(Debug)]
pub(super) struct Replies {
    count: Arc<ReplyCount>,
    /// The pace held sends back since the last judgement: more were due than it allowed.
    held_back: bool,
    judge: Judge,
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
    /// What was sent over the window, in messages a second (over a second at least): the
    /// pace before the cut, where nothing paced the sends.
    pub sent_rate: f64,
}

/// What the replies since the last judgement say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Judgement {
    /// The cut they call for, if any.
    pub cut: Option<Cut>,
    /// The pace held sends back, and the relay took them and refused none: the pace, not
    /// the relay, is what limits sending now.
    pub outgrown: bool,
    /// How long since the relay last refused a send as throttling; `None`: never.
    pub quiet_for: Option<Duration>,
}

impl Replies {
    pub fn new(settle: Duration) -> Self {
        Self {
            count: Arc::default(),
            held_back: false,
            judge: Judge::new(Instant::now(), settle),
        }
    }

    /// Where the send tasks count the replies.
    pub fn count(&self) -> Arc<ReplyCount> {
        Arc::clone(&self.count)
    }

    /// The pace allowed fewer messages than were due.
    pub fn held_back(&mut self) {
        self.held_back = true;
    }

    /// The cut the replies since the last call call for, if any. `pace` is the pace their
    /// sends were booked at; `None`: nothing paces them yet, and a refusal is judged
    /// without waiting for the window to fill.
    pub fn judge(&mut self, pace: Option<f64>) -> Judgement {
        let (accepted, refused) = self.count.take();
        let counts = Counts {
            accepted,
            refused,
            held_back: std::mem::take(&mut self.held_back),
        };
        let now = Instant::now();
        let judge = &mut self.judge;
        if counts.refused > 0 {
            judge.last_refusal = Some(now);
        }
        Judgement {
            cut: judge.observe(now, counts, pace),
            outgrown: counts.held_back && counts.accepted > 0 && counts.refused == 0,
            quiet_for: judge
                .last_refusal
                .map(|at| now.saturating_duration_since(at)),
        }
    }

    /// Another replica cut the shared pace: what was sent before it is not judged.
    pub fn cut_elsewhere(&mut self) {
        self.judge.settle_from(Instant::now());
    }

    /// The tolerated share, when this replica's replies changed it since it last said so:
    /// for the shared schedule, so that every replica tolerates what one has learnt.
    pub fn learnt(&mut self) -> Option<f64> {
        let judge = &mut self.judge;
        std::mem::take(&mut judge.learnt).then_some(judge.tolerated)
    }

    /// The tolerated share the replicas share now.
    pub fn shared(&mut self, tolerated: f64) {
        let judge = &mut self.judge;
        if !judge.learnt {
            judge.tolerated = tolerated.clamp(0.0, MOST_TOLERATED);
        }
    }
}

/// Replies, and whether the pace held sends back meanwhile.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counts {
    accepted: u64,
    refused: u64,
    held_back: bool,
}

impl Counts {
    fn sent(self) -> u64 {
        self.accepted + self.refused
    }

    fn refused_share(self) -> f64 {
        self.refused as f64 / self.sent().max(1) as f64
    }

    fn add(&mut self, more: Counts) {
        self.accepted += more.accepted;
        self.refused += more.refused;
        self.held_back |= more.held_back;
    }
}

/// A window judged in which the pace held sends back: the pace and the share refused.
#[derive(Debug, Clone, Copy)]
struct Seen {
    pace: f64,
    share: f64,
}

#[derive(Debug)]
struct Judge {
    since: Instant,
    window: Counts,
    settle: Duration,
    settling_until: Option<Instant>,
    /// The last window judged in which the pace held sends back.
    before: Option<Seen>,
    /// Falls of the pace in a row that left the share refused unchanged.
    unchanged: u32,
    /// The share of sends the relay refuses whatever the pace.
    tolerated: f64,
    /// `tolerated` changed here and is not yet shared.
    learnt: bool,
    /// When the last throttling refusal was counted.
    last_refusal: Option<Instant>,
}

impl Judge {
    fn new(now: Instant, settle: Duration) -> Self {
        Self {
            since: now,
            window: Counts::default(),
            settle,
            settling_until: None,
            before: None,
            unchanged: 0,
            tolerated: 0.0,
            learnt: false,
            last_refusal: None,
        }
    }

    fn settle_from(&mut self, now: Instant) {
        self.settling_until = Some(now + self.settle);
        self.window = Counts::default();
        self.since = now;
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
        self.window.add(counts);
        let elapsed = now.saturating_duration_since(self.since);
        let filled = elapsed >= WINDOW && self.window.sent() >= FEWEST_REPLIES;
        let at_once = pace.is_none() && self.window.refused > 0;
        if !filled && !at_once && elapsed < LONGEST_WINDOW {
            return None;
        }
        let window = std::mem::take(&mut self.window);
        self.since = now;
        if window.sent() == 0 {
            return None;
        }
        self.learn(window, pace);
        let share = window.refused_share();
        tracing::trace!(
            sent = window.sent(),
            refused = window.refused,
            held_back = window.held_back,
            pace,
            tolerated = self.tolerated,
            unchanged = self.unchanged,
            "the relay's replies judged"
        );
        if window.refused == 0 || share - self.tolerated <= self.noise(window) {
            return None;
        }
        let factor = ((1.0 - share) / (1.0 - self.tolerated)).clamp(1.0 - MAX_CUT, 1.0);
        self.settle_from(now);
        Some(Cut {
            factor,
            refused_share: share,
            tolerated: self.tolerated,
            accepted_rate: window.accepted as f64 / elapsed.as_secs_f64().max(1.0),
            sent_rate: window.sent() as f64 / elapsed.as_secs_f64().max(1.0),
        })
    }

    /// Updates the tolerated share from a window at `pace`: to the share that falls of the
    /// pace left unchanged where a limit on the rate would have changed it, and down towards
    /// a share clearly below it.
    fn learn(&mut self, window: Counts, pace: Option<f64>) {
        let share = window.refused_share();
        let now = pace
            .filter(|_| window.held_back)
            .map(|pace| Seen { pace, share });
        if let (Some(before), Some(now)) = (self.before, now)
            && now.pace < before.pace * (1.0 - MIN_FALL)
        {
            // A limit on the rate accepts as many a second as before the fall.
            let accepted = before.pace * (1.0 - before.share);
            let had_it_been_the_rate = (1.0 - accepted / now.pace).max(0.0);
            let chance =
                NOISE_SIGMAS * (before.share * (1.0 - before.share) / window.sent() as f64).sqrt();
            if before.share - had_it_been_the_rate > chance {
                if (share - before.share).abs() <= chance {
                    self.unchanged += 1;
                } else {
                    self.unchanged = 0;
                }
                if self.unchanged >= FALLS_TO_TOLERATE {
                    let tolerated = share.min(before.share).min(MOST_TOLERATED);
                    self.tolerated = self.tolerated.max(tolerated);
                    self.learnt = true;
                }
            }
        }
        if now.is_some() {
            self.before = now;
        }
        if self.tolerated > 0.0
            && (window.refused == 0 || share < self.tolerated - self.noise(window))
        {
            self.tolerated -= (self.tolerated - share) * TOLERANCE_DECAY;
            self.learnt = true;
        }
        if window.refused == 0 {
            self.unchanged = 0;
        }
    }

    /// How far above the tolerated share a window's share may lie by chance alone.
    fn noise(&self, window: Counts) -> f64 {
        let p = self.tolerated;
        NOISE_SIGMAS * (p * (1.0 - p) / window.sent().max(1) as f64).sqrt()
    }
}

#[cfg(test)]
mod tests;
