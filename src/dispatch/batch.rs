//! What a batch is at each stage of a cycle: leased (claimed, not yet sent), attempted
//! (each message's outcome decided, not yet recorded), and what a claim came to.

use tokio::time::Instant;

use super::Step;
use crate::message::{ClaimedBatch, Outcome};

/// A claimed batch, with the local time its lease started: the start deadline of its
/// sends counts from there.
pub(super) struct LeasedBatch {
    pub claimed: ClaimedBatch,
    pub lease_start: Instant,
}

/// A batch whose messages were attempted (sent, failed, or given back unsent) and whose
/// outcomes wait to be recorded.
pub(super) struct AttemptedBatch {
    pub claimed: ClaimedBatch,
    /// In the order of `claimed.messages`.
    pub outcomes: Vec<Outcome>,
    /// No message of the batch reached the SMTP server: the circuit opens once recorded.
    pub outage: bool,
    /// From the claim to the end of the sends.
    pub since_claim: chrono::Duration,
    pub span: tracing::Span,
}

/// What a claim came to.
pub(super) enum NextBatch {
    Leased(LeasedBatch),
    /// Nothing due.
    Empty,
    /// Not claimed at all: shutting down, or the circuit is open.
    Halt(Step),
}

/// What one batch, or a drain of several, did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub released: usize,
    /// Outcomes not recorded because another claimer took the rows over.
    pub lost: usize,
    /// Rows whose previous claimer's lease ran out without an outcome.
    pub reclaimed: usize,
}

impl BatchReport {
    pub(super) fn add(&mut self, other: &BatchReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.lost += other.lost;
        self.reclaimed += other.reclaimed;
    }
}
