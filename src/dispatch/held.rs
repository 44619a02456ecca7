//! Outcomes decided but not written yet, held by the recorder under one schedule: after
//! the database did not take them (it was down, or the connection dropped), before the
//! next claim; when another transaction has locked their rows, [`super::batch::LOCKED_RETRY`] after
//! that was found, by one task at a time that waits for the locks while claims go on.

use std::sync::Mutex;

use tokio::task::JoinHandle;

use super::batch::HeldOutcomes;
use crate::lock::lock;
use crate::store::{self};

/// Outcomes whose rows another transaction has locked, being written by a task that waits
/// for the locks on a connection of its own.
pub(super) struct LockWaiter {
    pub held: HeldOutcomes,
    pub task: JoinHandle<Result<store::Recorded, sqlx::Error>>,
}

/// Every outcome the recorder holds.
#[derive(Default)]
pub(super) struct Held {
    /// Shared: a batch's sends hold outcomes the database did not take while the next
    /// claim (joined with them in the drain) writes those held before.
    state: Mutex<HeldState>,
}

#[derive(Default)]
struct HeldState {
    /// Oldest first.
    waiting: Vec<HeldOutcomes>,
    /// At most one write waits on row locks.
    waiter: Option<LockWaiter>,
}

impl Held {
    pub fn push(&self, held: HeldOutcomes) {
        if !held.decided.is_empty() {
            lock(&self.state).waiting.push(held);
        }
    }

    /// Takes the outcomes due for another try, oldest first; the others stay.
    pub fn take_due(&self, stopping: bool) -> Vec<HeldOutcomes> {
        let mut state = lock(&self.state);
        let (due, later) = std::mem::take(&mut state.waiting)
            .into_iter()
            .partition(|held| held.is_due(stopping));
        state.waiting = later;
        due
    }

    /// Gives back outcomes taken with [`Self::take_due`] and not written, before any held
    /// since: oldest first.
    pub fn put_back(&self, untried: impl IntoIterator<Item = HeldOutcomes>) {
        let mut state = lock(&self.state);
        let untried: Vec<_> = untried.into_iter().collect();
        state.waiting.splice(0..0, untried);
    }

    /// Hands outcomes for locked rows to a task that `start` spawns to wait for the locks,
    /// unless one already waits: then they are given back, to be tried skipping locked rows.
    pub fn wait_for_locks(
        &self,
        held: HeldOutcomes,
        start: impl FnOnce(&HeldOutcomes) -> JoinHandle<Result<store::Recorded, sqlx::Error>>,
    ) -> Option<HeldOutcomes> {
        let mut state = lock(&self.state);
        if state.waiter.is_some() {
            return Some(held);
        }
        let task = start(&held);
        state.waiter = Some(LockWaiter { held, task });
        None
    }

    /// The task waiting on row locks, once it has ended (or at once when stopping).
    pub fn ended_waiter(&self, stopping: bool) -> Option<LockWaiter> {
        let mut state = lock(&self.state);
        match &state.waiter {
            Some(waiter) if stopping || waiter.task.is_finished() => state.waiter.take(),
            _ => None,
        }
    }

    /// Whether outcomes are held for rows another transaction has locked.
    pub fn holds_locked(&self) -> bool {
        let state = lock(&self.state);
        state.waiter.is_some() || state.waiting.iter().any(HeldOutcomes::is_locked)
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn messages(&self) -> usize {
        let state = lock(&self.state);
        let waiting = state.waiter.as_ref().map_or(0, |w| w.held.decided.len());
        waiting
            + state
                .waiting
                .iter()
                .map(|held| held.decided.len())
                .sum::<usize>()
    }
}
