//! Where a claim starts scanning the due index: a floor per lane, raised by each claim,
//! lowered by the insert trigger's notifications, cleared by a full scan every
//! [`FULL_SCAN_EVERY`]. Why: docs/adr/0003-the-claim-floor.md.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use crate::message::LaneScan;
use crate::store;

/// How often a claim ignores the floor and scans the due index from its start.
pub(super) const FULL_SCAN_EVERY: Duration = Duration::from_secs(60);

/// How far below the bound of a scan that came back short a lane's floor stays: a release
/// or a retry committed just after the claim's snapshot has a `next_attempt_at` from its
/// own start, a little before it. Outcome writes mostly take milliseconds; those that wait
/// on a row lock are left to the full scan.
const SETTLE: Duration = Duration::from_secs(5);

/// The floor: the claimer's, which raises it while a drain runs and lends it to the
/// wake-ups, which lower it between drains.
#[derive(Debug)]
pub(super) struct ClaimFloor {
    state: State,
}

#[derive(Debug)]
struct State {
    floor: Floors,
    /// A floor is kept only while notifications can lower it.
    listening: bool,
    /// Counts every lowering, so that a claim that started before one does not raise
    /// the floor over the row that lowered it.
    lowerings: u64,
    next_full_scan: Instant,
}

/// Where each lane's part of a claim scans from; `None` is the start of the due index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Floors {
    pub transactional: Option<DateTime<Utc>>,
    pub bulk: Option<DateTime<Utc>>,
}

impl Floors {
    /// Where each lane's next scan can start after a claim found `transactional` and
    /// `bulk`; `None` for a lane that learnt nothing, which keeps its floor.
    pub fn after(transactional: LaneScan, bulk: LaneScan) -> Self {
        Self {
            transactional: floor_after(transactional),
            bulk: floor_after(bulk),
        }
    }

    /// Both floors lowered to `due`, where they are above it.
    fn lowered_to(self, due: DateTime<Utc>) -> Self {
        Self {
            transactional: self.transactional.map(|floor| floor.min(due)),
            bulk: self.bulk.map(|floor| floor.min(due)),
        }
    }
}

/// The higher of the two places a lane's scan may start from: its lowest row claimed, and
/// a little before the bound of a scan that came back short.
fn floor_after(scan: LaneScan) -> Option<DateTime<Utc>> {
    let settle = TimeDelta::from_std(SETTLE).unwrap_or(TimeDelta::zero());
    let emptied = scan
        .emptied_to
        .and_then(|bound| bound.checked_sub_signed(settle));
    scan.lowest_due.max(emptied)
}

/// What a claim started from.
#[derive(Debug, Clone, Copy)]
pub(super) struct ScanStart {
    pub floor: Floors,
    lowerings: u64,
}

/// What the notifications heard during a wait said about rows below the floor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Heard {
    /// The lowest due time a notification named.
    pub lowest_due: Option<DateTime<Utc>>,
    /// The due times notifications named that were still to come when they were heard
    /// (`not_before` rows), each once: the loop wakes at each.
    pub later: Vec<DateTime<Utc>>,
    /// A notification named none, or some may have been missed.
    pub unknown: bool,
    /// Of the notification checks, the tokens that came back.
    pub checks: Vec<String>,
}

impl Heard {
    /// Adds one notification: the insert trigger's, or a check's.
    pub fn notification(&mut self, channel: &str, payload: &str) {
        if channel == store::CHECK_CHANNEL {
            self.checks.push(payload.to_owned());
        } else {
            self.payload(payload);
        }
    }

    /// Whether the insert trigger said anything: new messages, or some may be missed.
    pub fn of_messages(&self) -> bool {
        self.unknown || self.lowest_due.is_some()
    }

    /// Adds one notification's payload: the due time in milliseconds since the epoch, or
    /// anything else (unknown).
    pub fn payload(&mut self, payload: &str) {
        match payload
            .parse::<i64>()
            .ok()
            .and_then(DateTime::from_timestamp_millis)
        {
            Some(due) => {
                self.lowest_due = Some(self.lowest_due.map_or(due, |l| l.min(due)));
                if due > Utc::now() && !self.later.contains(&due) {
                    self.later.push(due);
                }
            }
            None => self.unknown = true,
        }
    }
}

impl ClaimFloor {
    pub fn new() -> Self {
        Self {
            state: State {
                floor: Floors::default(),
                listening: false,
                lowerings: 0,
                next_full_scan: Instant::now() + FULL_SCAN_EVERY,
            },
        }
    }

    /// Where the next claim scans from: `None` (the start) when not listening, when no
    /// floor is known, or when a full scan is due.
    pub fn start(&mut self) -> ScanStart {
        self.start_at(Instant::now())
    }

    /// [`Self::start`] at `now`. A full scan that is due clears the floors, rather than
    /// ignoring them for one claim: a claim that then fails, or whose part for a lane had
    /// no room (the tiers before it filled the batch), leaves that lane to scan from the
    /// start at the next claim. Ignored for one claim, the full scan was spent on it, and
    /// the rows it is there for waited another [`FULL_SCAN_EVERY`].
    fn start_at(&mut self, now: Instant) -> ScanStart {
        let state = &mut self.state;
        if now >= state.next_full_scan {
            state.next_full_scan = now + FULL_SCAN_EVERY;
            state.floor = Floors::default();
            state.lowerings += 1;
        }
        let floor = if state.listening {
            state.floor
        } else {
            Floors::default()
        };
        ScanStart {
            floor,
            lowerings: state.lowerings,
        }
    }

    /// A claim that started at `start` left no due row of a lane below `after`
    /// ([`Floors::after`]): the lane's floor moves there, unless a notification lowered it
    /// meanwhile. A lane the claim learnt nothing of keeps its floor.
    pub fn claimed(&mut self, start: ScanStart, after: Floors) {
        let state = &mut self.state;
        if !state.listening || state.lowerings != start.lowerings {
            return;
        }
        if after.transactional.is_some() {
            state.floor.transactional = after.transactional;
        }
        if after.bulk.is_some() {
            state.floor.bulk = after.bulk;
        }
    }

    /// Rows may have appeared below the floor.
    pub fn heard(&mut self, heard: Heard) {
        let state = &mut self.state;
        if heard.unknown {
            state.floor = Floors::default();
        } else if let Some(due) = heard.lowest_due {
            state.floor = state.floor.lowered_to(due);
        } else {
            return;
        }
        state.lowerings += 1;
    }

    /// LISTEN started or stopped: either way, what happened meanwhile is unknown.
    pub fn listening(&mut self, listening: bool) {
        let state = &mut self.state;
        state.listening = listening;
        state.floor = Floors::default();
        state.lowerings += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(millis).expect("a valid time")
    }

    fn both(millis: i64) -> Floors {
        Floors {
            transactional: Some(at(millis)),
            bulk: Some(at(millis)),
        }
    }

    fn listening_floor_at(millis: i64) -> ClaimFloor {
        let mut floor = ClaimFloor::new();
        floor.listening(true);
        let start = floor.start();
        floor.claimed(start, both(millis));
        floor
    }

    #[test]
    fn there_is_no_floor_without_listen() {
        let mut floor = ClaimFloor::new();
        let start = floor.start();
        floor.claimed(start, both(100));
        assert_eq!(floor.start().floor, Floors::default());
    }

    #[test]
    fn a_claim_raises_each_lanes_floor_to_its_lowest_row_and_a_lane_without_one_keeps_it() {
        let mut floor = listening_floor_at(100);
        assert_eq!(floor.start().floor, both(100));
        let start = floor.start();
        floor.claimed(start, Floors::default());
        assert_eq!(floor.start().floor, both(100));
        let transactional_only = Floors {
            transactional: Some(at(300)),
            bulk: None,
        };
        let start = floor.start();
        floor.claimed(start, transactional_only);
        let moved = floor.start().floor;
        assert_eq!(
            (moved.transactional, moved.bulk),
            (Some(at(300)), Some(at(100)))
        );
    }

    #[test]
    fn a_lane_that_came_back_short_rises_to_just_before_the_bound_of_its_scan() {
        let bound = at(60_000);
        let settled = bound.checked_sub_signed(TimeDelta::from_std(SETTLE).expect("short"));
        let emptied = LaneScan {
            lowest_due: None,
            emptied_to: Some(bound),
        };
        let full = LaneScan {
            lowest_due: Some(at(100)),
            emptied_to: None,
        };
        let after = Floors::after(emptied, full);
        assert_eq!((after.transactional, after.bulk), (settled, Some(at(100))));
        let both_known = LaneScan {
            lowest_due: Some(at(59_000)),
            emptied_to: Some(bound),
        };
        assert_eq!(
            Floors::after(both_known, full).transactional,
            Some(at(59_000))
        );
        assert_eq!(Floors::after(LaneScan::default(), full).transactional, None);
    }

    #[test]
    fn a_notified_due_time_lowers_the_floor_and_an_unknown_one_clears_it() {
        let mut floor = listening_floor_at(100);
        let mut heard = Heard::default();
        heard.payload("150");
        heard.payload("40");
        floor.heard(heard);
        assert_eq!(floor.start().floor, both(40));
        let mut heard = Heard::default();
        heard.payload("");
        floor.heard(heard);
        assert_eq!(floor.start().floor, Floors::default());
    }

    #[test]
    fn a_claim_started_before_a_lowering_does_not_undo_it() {
        let mut floor = listening_floor_at(100);
        let start = floor.start();
        let mut heard = Heard::default();
        heard.payload("40");
        floor.heard(heard);
        floor.claimed(start, both(120));
        assert_eq!(floor.start().floor, both(40));
    }

    #[test]
    fn a_full_scan_is_owed_to_each_lane_until_a_claim_learns_where_it_starts() {
        let mut floor = listening_floor_at(100);
        let later = Instant::now() + FULL_SCAN_EVERY;
        assert_eq!(floor.start_at(later).floor, Floors::default());
        // That claim failed: the next one scans from the start all the same.
        assert_eq!(floor.start_at(later).floor, Floors::default());
        // One that learnt of the transactional lane only (the bulk part had no room)
        // leaves the bulk lane to scan from the start.
        let start = floor.start_at(later);
        let transactional_only = Floors {
            transactional: Some(at(300)),
            bulk: None,
        };
        floor.claimed(start, transactional_only);
        let next = floor.start_at(later).floor;
        assert_eq!((next.transactional, next.bulk), (Some(at(300)), None));
    }

    #[test]
    fn losing_listen_clears_the_floor() {
        let mut floor = listening_floor_at(100);
        floor.listening(false);
        floor.listening(true);
        assert_eq!(floor.start().floor, Floors::default());
    }
}
