//! How the replies of each window are judged: rates, tolerated shares, chance.

use std::time::Duration;

use tokio::time::Instant;

use super::{Counts, Judge, MAX_CUT};

const SETTLE: Duration = Duration::from_secs(1);

/// A judge fed one window a second of `sent` replies, `refused` of them refused, sent at a
/// pace of `sent` a second that held more back (or, without `held_back`, sent all there
/// was); the factor of each window's cut (1 for none).
fn run_with(windows: &[(u64, u64)], held_back: bool) -> (Vec<f64>, Judge) {
    let start = Instant::now();
    let mut judge = Judge::new(start, SETTLE);
    let mut factors = Vec::new();
    for (second, &(sent, refused)) in (1u64..).zip(windows) {
        let now = start + Duration::from_secs(second);
        let counts = Counts {
            accepted: sent - refused,
            refused,
            held_back,
        };
        let cut = judge.observe(now, counts, Some(sent as f64));
        factors.push(cut.map_or(1.0, |c| c.factor));
    }
    (factors, judge)
}

fn run(windows: &[(u64, u64)]) -> (Vec<f64>, Judge) {
    run_with(windows, true)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn cuts(factors: &[f64]) -> usize {
    factors.iter().filter(|f| !close(**f, 1.0)).count()
}

#[test]
fn a_rate_limit_is_cut_by_the_share_it_refused_and_again_when_it_refuses_again() {
    // 80 a second against a relay taking 40: half refused. After the cut (and the second
    // of sends booked before it) 40 a second go through, then the pace grows.
    let (factors, judge) = run(&[(80, 40), (60, 20), (40, 0), (44, 4)]);
    assert!(close(factors[0], 0.5), "{factors:?}");
    assert!(close(factors[1], 1.0), "the settling second is not judged");
    assert!(close(factors[2], 1.0));
    assert!(close(factors[3], 40.0 / 44.0), "{factors:?}");
    assert!(close(judge.tolerated, 0.0));
}

#[test]
fn a_share_refused_whatever_the_pace_is_cut_twice_then_tolerated() {
    // Every fourth refused: a cut, the settling second, the same quarter at the lower pace;
    // again; then no more cuts at that share.
    let (factors, judge) = run(&[
        (40, 10),
        (30, 8),
        (30, 8),
        (22, 6),
        (22, 6),
        (25, 6),
        (30, 8),
        (36, 9),
    ]);
    assert!(close(factors[0], 0.75), "{factors:?}");
    assert_eq!(cuts(&factors), 2, "{factors:?}");
    assert_eq!(cuts(&factors[4..]), 0, "{factors:?}");
    assert!(
        (0.25..0.28).contains(&judge.tolerated),
        "{}",
        judge.tolerated
    );
    assert!(judge.learnt, "what is learnt is shared");
    // Refusals well above the tolerated share cut by what lies above it.
    let (mut judge, start) = (judge, Instant::now());
    let counts = Counts {
        accepted: 30,
        refused: 30,
        held_back: true,
    };
    let cut = judge.observe(start + Duration::from_secs(60), counts, Some(60.0));
    let expected = 0.5 / (1.0 - judge.tolerated);
    assert!(close(cut.expect("a cut").factor, expected), "{cut:?}");
}

#[test]
fn a_burst_that_runs_out_as_the_pace_falls_is_not_taken_for_a_share_to_tolerate() {
    // 100 a second to a relay taking 25 with 25 in hand: half refused, then, at 50 a
    // second, half again (the burst is spent): the same share once. The next cut shows it
    // was the rate.
    let (factors, judge) = run(&[(100, 50), (50, 25), (50, 25), (25, 0), (25, 0), (28, 3)]);
    assert_eq!(cuts(&factors[..4]), 2, "{factors:?}");
    assert!(close(judge.tolerated, 0.0), "{}", judge.tolerated);
    assert!(close(factors[5], 25.0 / 28.0), "{factors:?}");
}

#[test]
fn cuts_while_the_pace_holds_nothing_back_teach_nothing() {
    // Fewer messages to send than the pace allows: a cut changes nothing sent, so the same
    // share after it says nothing of the relay.
    let windows = [(25, 5), (25, 5), (25, 5), (25, 5), (25, 5)];
    let (factors, judge) = run_with(&windows, false);
    assert_eq!(cuts(&factors), 3, "{factors:?}");
    assert!(close(judge.tolerated, 0.0));
}

#[test]
fn the_tolerated_share_falls_back_when_the_refusals_stop() {
    let mut windows = vec![(40, 10), (30, 8), (30, 8), (22, 6), (22, 6)];
    windows.extend([(40, 0); 10]);
    let (_, judge) = run(&windows);
    assert!(judge.tolerated < 0.001, "{}", judge.tolerated);
    // And a refusal then cuts at once, as the relay's limit would want.
    windows.push((40, 4));
    let (factors, _) = run(&windows);
    let last = *factors.last().unwrap();
    assert!((last - 0.9).abs() < 0.01, "{factors:?}");
}

#[test]
fn a_window_is_judged_early_only_when_nothing_paces_the_sends_yet() {
    let start = Instant::now();
    let counts = Counts {
        accepted: 20,
        refused: 5,
        held_back: false,
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
fn a_few_replies_are_judged_only_once_the_longest_window_has_passed() {
    let start = Instant::now();
    let mut judge = Judge::new(start, SETTLE);
    let few = Counts {
        accepted: 2,
        refused: 2,
        held_back: true,
    };
    for second in 1..5 {
        let now = start + Duration::from_secs(second);
        assert_eq!(judge.observe(now, few, Some(4.0)), None, "{second}");
    }
    let now = start + Duration::from_secs(5);
    assert!(judge.observe(now, few, Some(4.0)).is_some());
}

#[test]
fn a_cut_elsewhere_keeps_what_was_sent_before_it_from_being_judged() {
    let start = Instant::now();
    let mut judge = Judge::new(start, SETTLE);
    judge.settle_from(start + Duration::from_millis(500));
    let half = Counts {
        accepted: 20,
        refused: 20,
        held_back: true,
    };
    for (second, judged) in [(1, false), (2, false), (3, true)] {
        let now = start + Duration::from_secs(second);
        let cut = judge.observe(now, half, Some(40.0));
        assert_eq!(cut.is_some(), judged, "{second}");
    }
}

#[test]
fn no_cut_takes_more_than_its_most() {
    let (factors, _) = run(&[(100, 100)]);
    assert!(close(factors[0], 1.0 - MAX_CUT), "{factors:?}");
}
