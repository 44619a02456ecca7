//! What a batch is at each stage of a cycle: leased (claimed, not yet sent), its outcomes
//! decided one by one as the sends end, and what a claim came to.

use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::pace::Slots;
use super::recipients::Suppressed;

use super::Step;
use crate::lock::lock;
use crate::message::{ClaimedBatch, Outcome};
use crate::store::RowLocks;

/// The most outcomes one write takes.
const RECORD_CHUNK: usize = 256;
/// How long outcomes gather before they are written. Waking the recorder for each outcome
/// cost a fifth more CPU per message in a drain, and a write per outcome 60% more of the
/// database's; at 200 messages a second this holds about four.
const RECORD_LINGER: Duration = Duration::from_millis(20);

/// A claimed batch, with the local time its lease started: the start deadline of its
/// sends counts from there.
pub(super) struct LeasedBatch {
    pub claimed: ClaimedBatch,
    pub lease_start: Instant,
    /// The most rows the claim asked for: the batch size, or fewer under a rate limit.
    /// A batch this full means more may be due.
    pub requested: u32,
    /// Under a rate limit, when each message may be sent (from `lease_start`).
    pub slots: Option<Slots>,
    /// The batch's recipients on the suppression list, as of the claim.
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
    /// The recipient the server said does not exist, to suppress (in the list's normal form).
    pub bounced: Option<String>,
}

/// Where one message of a batch being sent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Waiting,
    Started,
    /// Its outcome went to the recorder.
    Done,
}

/// A batch's outcomes on their way from the send tasks to the recorder, and where each
/// message stands, under one lock: an outcome is marked done exactly when it is queued.
pub(super) struct OutcomeQueue {
    state: Mutex<QueueState>,
    /// Rung when a chunk is full.
    ready: Notify,
}

struct QueueState {
    slots: Vec<Slot>,
    decided: Vec<Decided>,
    /// The sends are over: nothing more will be queued.
    closed: bool,
}

impl OutcomeQueue {
    pub fn new(messages: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                slots: vec![Slot::Waiting; messages],
                decided: Vec::new(),
                closed: false,
            }),
            ready: Notify::new(),
        }
    }

    pub fn started(&self, index: usize) {
        lock(&self.state).slots[index] = Slot::Started;
    }

    /// Queues an outcome; `false` (and nothing queued) once the queue is closed.
    pub fn finished(&self, decided: Decided) -> bool {
        let mut state = lock(&self.state);
        if state.closed {
            return false;
        }
        state.slots[decided.index] = Slot::Done;
        state.decided.push(decided);
        if state.decided.len() >= RECORD_CHUNK {
            self.ready.notify_one();
        }
        true
    }

    /// The sends are over; returns outcomes for the messages whose sends never ended:
    /// not started, or abandoned at the shutdown bound (a panic in a message's send is
    /// caught, and decides its outcome). Wakes nobody: the recorder runs in the same task
    /// and is polled right after (see `send_and_record`).
    pub fn close(&self, after: Duration) -> Vec<Decided> {
        let mut state = lock(&self.state);
        state.closed = true;
        state
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                let outcome = match slot {
                    Slot::Done => return None,
                    Slot::Waiting => Outcome::not_started(),
                    Slot::Started => Outcome::abandoned(),
                };
                Some(Decided {
                    index,
                    outcome,
                    after,
                    bounced: None,
                })
            })
            .collect()
    }

    /// The next outcomes to write: what gathered within [`RECORD_LINGER`] (or a full chunk
    /// sooner), or, once the sends are over, the rest.
    pub async fn next_chunk(&self) -> Chunk {
        loop {
            {
                let mut state = lock(&self.state);
                if state.closed {
                    return Chunk::Rest(std::mem::take(&mut state.decided));
                }
                if state.decided.len() >= RECORD_CHUNK {
                    return Chunk::Write(std::mem::take(&mut state.decided));
                }
            }
            // `closed` registers no waker: the sends close the queue from this task, and
            // poll the recorder right after (see `send_and_record`).
            let closed = std::future::poll_fn(|_| {
                if lock(&self.state).closed {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            tokio::select! {
                () = self.ready.notified() => {}
                () = closed => {}
                () = tokio::time::sleep(RECORD_LINGER) => {
                    let mut state = lock(&self.state);
                    if !state.decided.is_empty() && !state.closed {
                        return Chunk::Write(std::mem::take(&mut state.decided));
                    }
                }
            }
        }
    }
}

/// What the recorder takes from an [`OutcomeQueue`].
pub(super) enum Chunk {
    /// Outcomes to write now, while the sends go on.
    Write(Vec<Decided>),
    /// The sends are over: what is left, written while the next batch is sent.
    Rest(Vec<Decided>),
}

/// A batch whose sends are over, with its last outcomes still to write.
pub(super) struct SentBatch {
    /// What the outcomes written during the sends came to.
    pub report: BatchReport,
    pub rest: Unrecorded,
    /// No send of the batch reached the server: the circuit opens.
    pub outage: bool,
}

/// Decided outcomes of one claim that the database did not take (it was down, or the
/// connection dropped): written before anything else is claimed. Or outcomes whose rows
/// another transaction has locked: claims go on, and they are tried again now and then.
pub(super) struct Unrecorded {
    pub claimed: ClaimedBatch,
    pub decided: Vec<Decided>,
    pub span: tracing::Span,
    /// When the rows were found locked: the next try skips locked rows at once, and comes
    /// [`LOCKED_RETRY`] later at the earliest, however often the dispatcher claims.
    pub locked_at: Option<Instant>,
}

/// How often outcomes held for rows locked by another transaction are tried again.
pub(super) const LOCKED_RETRY: Duration = Duration::from_secs(1);

impl Unrecorded {
    /// Outcomes the database did not take, tried again as any others.
    pub fn new(claimed: ClaimedBatch, decided: Vec<Decided>, span: tracing::Span) -> Self {
        Self {
            claimed,
            decided,
            span,
            locked_at: None,
        }
    }

    /// How the next try treats locked rows.
    pub fn row_locks(&self) -> RowLocks {
        if self.locked_at.is_some() {
            RowLocks::Skip
        } else {
            RowLocks::WaitBriefly
        }
    }
}

/// What a claim came to.
pub(super) enum NextBatch {
    /// Boxed: a claimed batch is large, and the enum is moved between futures.
    Leased(Box<LeasedBatch>),
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
    /// Messages past their expiry, ended unsent.
    pub expired: usize,
    /// Messages whose every recipient is suppressed, ended unsent.
    pub suppressed: usize,
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
        self.expired += other.expired;
        self.suppressed += other.suppressed;
        self.lost += other.lost;
        self.reclaimed += other.reclaimed;
    }
}

#[cfg(test)]
mod tests {
    use super::{Decided, OutcomeQueue};
    use crate::message::{Delivery, Outcome};
    use std::time::Duration;

    #[test]
    fn closing_releases_the_unstarted_and_the_abandoned_and_refuses_late_outcomes() {
        let queue = OutcomeQueue::new(3);
        let sent = Outcome::Sent {
            via: Delivery::Smtp,
        };
        queue.started(0);
        queue.started(1);
        assert!(queue.finished(Decided {
            index: 1,
            outcome: sent.clone(),
            after: Duration::ZERO,
            bounced: None,
        }));
        let rest = queue.close(Duration::from_secs(1));
        let outcomes: Vec<_> = rest.iter().map(|d| (d.index, d.outcome.clone())).collect();
        assert_eq!(
            outcomes,
            [(0, Outcome::abandoned()), (2, Outcome::not_started())]
        );
        // Closed: a late outcome is refused.
        assert!(!queue.finished(Decided {
            index: 2,
            outcome: sent,
            after: Duration::ZERO,
            bounced: None,
        }));
    }
}
