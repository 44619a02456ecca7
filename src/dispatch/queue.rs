//! The outcomes of a batch on their way from its sends to the recorder, gathered a few
//! milliseconds' worth at a time, and where each message of the batch stands.

use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;

use super::batch::Decided;
use crate::lock::lock;
use crate::message::Outcome;

/// The most outcomes one write takes.
const RECORD_CHUNK: usize = 256;
/// How long outcomes gather before they are written. Waking the recorder for each outcome
/// cost a fifth more CPU per message in a drain, and a write per outcome 60% more of the
/// database's; at 200 messages a second this holds about four.
const RECORD_LINGER: Duration = Duration::from_millis(20);

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
    /// Shared: the send tasks push, the recorder takes.
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
                Some(Decided::new(index, outcome, after))
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

#[cfg(test)]
mod tests {
    use super::OutcomeQueue;
    use crate::dispatch::batch::Decided;
    use crate::message::{Delivery, Outcome};
    use std::time::Duration;

    #[test]
    fn closing_releases_the_unstarted_and_the_abandoned_and_refuses_late_outcomes() {
        let queue = OutcomeQueue::new(3);
        let sent = Outcome::Sent {
            via: Delivery::Smtp,
            reply: None,
            relay: None,
            fallback: false,
        };
        queue.started(0);
        queue.started(1);
        assert!(queue.finished(Decided {
            index: 1,
            outcome: sent.clone(),
            after: Duration::ZERO,
            took: None,
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
            took: None,
            bounced: None,
        }));
    }
}
