//! What a batch is at each stage of a cycle: leased (claimed, not yet sent), its outcomes
//! decided one by one as the sends end, and what a claim came to.

use std::time::Duration;

use tokio::time::Instant;

use super::Step;
use crate::message::{ClaimedBatch, Outcome};

/// A claimed batch, with the local time its lease started: the start deadline of its
/// sends counts from there.
pub(super) struct LeasedBatch {
    pub claimed: ClaimedBatch,
    pub lease_start: Instant,
}

/// One message's outcome, decided when its send ended and waiting to be written.
pub(super) struct Decided {
    /// The message's place in its batch.
    pub index: usize,
    pub outcome: Outcome,
    /// From the start of the lease to the end of the send.
    pub after: Duration,
}

/// Decided outcomes of one claim that the database did not take (it was down, or the
/// connection dropped): written before anything else is claimed.
pub(super) struct Unrecorded {
    pub claimed: ClaimedBatch,
    pub decided: Vec<Decided>,
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
