//! What a batch is at each stage of a cycle: claimed, leased (its suppressed recipients
//! known), its outcomes decided one by one as the sends end, sent with its last outcomes
//! still to write, and what it all came to.

use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use super::Step;
use super::pace::SendSlots;
use super::recipients::Suppressed;
use crate::message::{ClaimedBatch, Delivery, Outcome};
use crate::render::ReadPayload;
use crate::store::RowLocks;
use crate::suppression::{Address, ListedAtClaim};

/// Each message's payload, read once by the claimer, in the batch's order.
pub(super) type Payloads = Arc<[ReadPayload]>;

/// A claimed batch, with the local time its lease started: the start deadline of its
/// sends counts from there.
pub(super) struct Claim {
    pub claimed: ClaimedBatch,
    /// Each message's payload, read once by the claimer.
    pub payloads: Payloads,
    /// The suppression list as the claim's statement saw it.
    pub at_claim: ListedAtClaim,
    pub lease_start: Instant,
    /// Some route took all its pace and the claim size allowed: more may be due.
    pub full: bool,
    /// Under a pace, when each message may be sent (from `lease_start`).
    pub slots: SendSlots,
}

impl Claim {
    /// Outcomes that give every row of the claim back unsent.
    pub fn releases(&self) -> Vec<Decided> {
        let after = self.lease_start.elapsed();
        (0..self.claimed.messages.len())
            .map(|index| Decided::new(index, Outcome::not_started(), after))
            .collect()
    }
}

/// A claim ready to send: its recipients on the suppression list are known.
pub(super) struct LeasedBatch {
    pub claim: Claim,
    pub suppressed: Suppressed,
}

/// One message's outcome, decided when its send ended and waiting to be written.
#[derive(Clone)]
pub(super) struct Decided {
    /// The message's place in its batch.
    pub index: usize,
    pub outcome: Outcome,
    /// From the start of the lease to the end of the send.
    pub after: Duration,
    /// How long the send took, when one was made.
    pub took: Option<Duration>,
    /// The recipient the server said does not exist, to suppress (in the list's normal form).
    pub bounced: Option<Address>,
}

impl Decided {
    pub fn new(index: usize, outcome: Outcome, after: Duration) -> Self {
        Self {
            index,
            outcome,
            after,
            took: None,
            bounced: None,
        }
    }
}

/// A batch whose sends are over, with its last outcomes still to write.
pub(super) struct SentBatch {
    /// What the outcomes written during the sends came to.
    pub report: BatchReport,
    pub rest: HeldOutcomes,
    /// The routes on which no send of the batch reached a relay: their circuits open.
    pub outages: Vec<crate::message::Lane>,
}

/// What the claimer's claim came to.
pub(super) enum Claiming {
    /// Boxed: a claim is large, the other answers small.
    Rows(Box<Claim>),
    /// Nothing due.
    NothingDue,
    /// The pace allows no send yet: claim again at this time.
    Paced(Instant),
}

/// What a claim came to.
pub(super) enum NextBatch {
    /// Boxed: a claimed batch is large, and the enum is moved between futures.
    Leased(Box<LeasedBatch>),
    /// Nothing due.
    Empty,
    /// The pace allows no send yet: claim again at this time (a drain's claim may be made
    /// while a batch is still being sent: the wait counts from the claim, not the drain's end).
    Paced(Instant),
    /// Not claimed at all: shutting down, or the circuit is open.
    Halt(Step),
}

impl NextBatch {
    /// The step that ends with this claim, after batches that did `done`: halted (when
    /// nothing was claimed before), paced, or a batch report.
    pub fn step_after(self, done: BatchReport) -> Step {
        match self {
            NextBatch::Halt(step) if done.claimed == 0 => step,
            NextBatch::Paced(at) => Step::Paced {
                report: done,
                resume_in: at.saturating_duration_since(Instant::now()),
            },
            _ => Step::Batch(done),
        }
    }
}

/// What one batch, or a drain of several, did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    /// Only logged, not sent: no SMTP server is configured.
    pub logged_only: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub released: usize,
    /// Messages past their expiry, ended unsent.
    pub expired: usize,
    /// Messages whose every recipient is suppressed, ended unsent.
    pub suppressed: usize,
    /// Messages their producer withdrew while claimed, ended unsent.
    pub cancelled: usize,
    /// Outcomes not recorded because another claimer took the rows over.
    pub lost: usize,
    /// Rows whose previous claimer's lease ran out without an outcome.
    pub reclaimed: usize,
}

impl BatchReport {
    pub(super) fn add(&mut self, other: &BatchReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.logged_only += other.logged_only;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.expired += other.expired;
        self.suppressed += other.suppressed;
        self.cancelled += other.cancelled;
        self.lost += other.lost;
        self.reclaimed += other.reclaimed;
    }

    /// One line per batch at INFO, so that a first run shows mail going out (a line per
    /// message is DEBUG: at INFO it cost a sixth of the drain's CPU).
    pub(super) fn log(&self) {
        if self.claimed == 0 {
            return;
        }
        tracing::info!(
            claimed = self.claimed,
            sent = self.sent,
            logged_only = self.logged_only,
            retried = self.retried,
            dead_lettered = self.dead_lettered,
            released = self.released,
            expired = self.expired,
            suppressed = self.suppressed,
            cancelled = self.cancelled,
            lost = self.lost,
            "batch recorded"
        );
    }

    /// Counts one recorded outcome.
    pub(super) fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Sent {
                via: Delivery::LoggedOnly,
                ..
            } => self.logged_only += 1,
            Outcome::Sent { .. } => self.sent += 1,
            Outcome::Retry { .. } => self.retried += 1,
            Outcome::DeadLetter { .. } => self.dead_lettered += 1,
            Outcome::Release { .. } => self.released += 1,
            Outcome::Expired => self.expired += 1,
            Outcome::Cancelled => self.cancelled += 1,
            Outcome::Suppressed { .. } => self.suppressed += 1,
        }
    }
}

/// How often outcomes held for rows locked by another transaction are tried again.
pub(super) const LOCKED_RETRY: Duration = Duration::from_secs(1);

/// Decided outcomes of one claim, not written yet.
pub(super) struct HeldOutcomes {
    pub claimed: ClaimedBatch,
    pub decided: Vec<Decided>,
    pub span: tracing::Span,
    /// When their rows were found locked: the next try comes [`LOCKED_RETRY`] later at the
    /// earliest, however often the dispatcher claims, and hands them to a waiter that waits
    /// for the locks on a connection of its own (or, while one already waits, writes them
    /// skipping the rows still locked).
    locked_at: Option<Instant>,
}

impl HeldOutcomes {
    /// Outcomes to write at the next chance.
    pub fn new(claimed: ClaimedBatch, decided: Vec<Decided>, span: tracing::Span) -> Self {
        Self {
            claimed,
            decided,
            span,
            locked_at: None,
        }
    }

    /// Outcomes whose rows another transaction has locked, found so now.
    pub fn locked(claimed: ClaimedBatch, decided: Vec<Decided>, span: tracing::Span) -> Self {
        Self {
            locked_at: Some(Instant::now()),
            ..Self::new(claimed, decided, span)
        }
    }

    pub fn is_locked(&self) -> bool {
        self.locked_at.is_some()
    }

    /// The schedule: due at once after a database failure, [`LOCKED_RETRY`] after their
    /// rows were found locked, and all of them when stopping.
    pub fn is_due(&self, stopping: bool) -> bool {
        stopping || self.locked_at.is_none_or(|at| at.elapsed() >= LOCKED_RETRY)
    }

    /// How the next try treats locked rows.
    pub fn row_locks(&self) -> RowLocks {
        if self.is_locked() {
            RowLocks::Skip
        } else {
            RowLocks::WaitBriefly
        }
    }
}
