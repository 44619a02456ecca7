//! How fast the dispatcher may send: slots booked from a schedule all replicas share (with
//! `OUTBOXD_RATE_LIMIT`, or once the relay throttles without one), cut when the relay says
//! it is throttling ([`replies`]), grown back after, and a found pace forgotten after
//! [`FORGET_AFTER`] without a refusal. Why: docs/adr/0004-the-pace.md.

mod replies;
mod routes;

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio::time::Instant;
use tracing::debug;

use crate::message::Lane;
use crate::store::send_rate::{self, Booking, SlotRequest};
use crate::telemetry::metrics::Metrics;
pub(crate) use replies::ReplyCount;
use replies::{Cut, Judgement, Replies};
pub(super) use routes::{Paces, Plan, Planned, ReplyCounts, SendSlots};

/// The schedule `OUTBOXD_RATE_LIMIT` books from.
const BUCKET: &str = "global";
/// The schedule `OUTBOXD_BULK_RATE_LIMIT` books from: the bulk lane's own relays'.
const BULK_BUCKET: &str = "bulk";
/// The schedule of the pace found for the bulk lane's own relays.
const BULK_DISCOVERED: &str = "bulk.discovered";
/// How far ahead a claim may book send slots: a second's worth of messages at most.
pub const HORIZON_SECONDS: f64 = 1.0;
/// After throttling, the pace grows back by this share of the limit per second.
pub const RECOVERY_PER_SECOND: f64 = 0.02;
/// How long after a cut the growth takes to reach its full rate: the pace stays near what
/// the relay took, where another refusal is likely, and grows faster as it holds.
pub const RAMP_SECONDS: f64 = 10.0;
/// Throttling never cuts the pace below this share of the limit.
const MIN_PACE_SHARE: f64 = 1.0 / 64.0;
/// The schedule of the pace found without a configured limit.
pub const DISCOVERED: &str = "discovered";
/// Without a limit, the pace grows back by this share of the pace of its last cut per
/// second, and by at least [`MIN_INCREASE`].
pub const DISCOVERY_INCREASE: f64 = 0.05;
/// The least a found pace grows by per second, in messages a second.
const MIN_INCREASE: f64 = 1.0;
/// The slowest a found pace goes, in messages a second.
const MIN_DISCOVERED: f64 = 0.1;
/// The fastest a found pace goes: the highest limit `OUTBOXD_RATE_LIMIT` takes.
const DISCOVERY_CEILING: f64 = 1_000_000.0;
/// How long a found pace outlives the relay's last throttling refusal. A relay that still
/// limits the rate says so again within this: the pace grows into its limit within a ramp
/// ([`RAMP_SECONDS`]), and the ceiling doubles each second the relay takes all it is given.
/// Shorter would send bursts into a relay that limits per minute; longer keeps mail waiting
/// after the push-back has ended (two ramps: 20 s).
pub const FORGET_AFTER: Duration = Duration::from_secs(20);
/// A found pace's ceiling doubles at most once in this long.
const CEILING_GROWTH_EVERY: Duration = Duration::from_secs(1);

/// A send rate: messages per second, minute or hour (`14/s`, `600/m`, `50000/h`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    per_second: f64,
}

impl RateLimit {
    /// Parses `N/s`, `N/m` or `N/h`, for the command line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected =
            || format!("{text:?}: expected messages per unit, like 14/s, 600/m or 50000/h");
        let (count, unit) = text.trim().split_once('/').ok_or_else(expected)?;
        let count: f64 = count.trim().parse().map_err(|_| expected())?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            _ => return Err(expected()),
        };
        if !(count.is_finite() && count > 0.0) {
            return Err(format!("{text:?}: the rate must be more than 0"));
        }
        let per_second = count / seconds;
        if !(1.0 / 3600.0..=1_000_000.0).contains(&per_second) {
            return Err(format!(
                "{text:?}: the rate must be between 1/h and 1000000/s"
            ));
        }
        Ok(Self { per_second })
    }
}

/// How many rows the next claim may take, and when each may be sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Allowance {
    Take {
        rows: u32,
        /// `None` without a limit: send at once.
        slots: Option<Slots>,
    },
    /// None yet: look again after this long.
    Wait(Duration),
}

/// The send slots a claim booked: the `i`-th message of the batch may be sent `first +
/// i × spacing` after the booking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::dispatch) struct Slots {
    pub first: Duration,
    pub spacing: Duration,
    booking: Booking,
}

impl Slots {
    /// When the message at `index` of a batch booked at `booked` may be sent.
    pub fn slot(&self, booked: Instant, index: usize) -> Instant {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        booked + self.first + self.spacing.saturating_mul(index)
    }
}

/// The dispatcher's side of the pace: the limit, and the replies since the last claim.
/// The claimer's alone; the send tasks only count replies ([`ReplyCount`]).
#[derive(Debug)]
pub(super) struct Pace {
    /// The route it paces: the lane whose relays send.
    route: Lane,
    limit: Option<RateLimit>,
    replies: Replies,
    /// Without a limit, once the relay has throttled: the pace found, until it is
    /// forgotten.
    discovered: Option<Found>,
    /// The pace of the last booking: what the sends since were paced at; `None` before
    /// any (without a limit, until the relay throttles).
    booked_pace: Option<f64>,
}

/// A pace found from throttling replies: how far it may grow, and how fast.
#[derive(Debug, Clone, Copy)]
struct Found {
    /// The pace before its last cut, doubled each second the pace held sends back and the
    /// relay refused none.
    ceiling: f64,
    grown_at: Instant,
    /// The ceiling has doubled since the last cut: past where the relay last refused, the
    /// pace grows to each new ceiling within a second rather than creeping up to it.
    probing: bool,
}

impl Found {
    fn after_cut(pace_before: f64, now: Instant) -> Self {
        Self {
            ceiling: pace_before.clamp(MIN_INCREASE, DISCOVERY_CEILING),
            grown_at: now,
            probing: false,
        }
    }

    /// Messages a second the pace grows by each second: back towards where the relay
    /// refused, a share of the ceiling; past it, the doubled ceiling's gap in a second.
    fn increase(self) -> f64 {
        let share = if self.probing {
            0.5
        } else {
            DISCOVERY_INCREASE
        };
        (share * self.ceiling).max(MIN_INCREASE)
    }

    /// Doubles the ceiling when the pace has reached it, held sends back and met no
    /// refusal: the relay takes more than the pace lets through.
    fn outgrown(&mut self, pace: Option<f64>, now: Instant) {
        let at_ceiling = pace.is_some_and(|pace| pace >= 0.9 * self.ceiling);
        if at_ceiling && now.saturating_duration_since(self.grown_at) >= CEILING_GROWTH_EVERY {
            self.ceiling = (2.0 * self.ceiling).min(DISCOVERY_CEILING);
            self.grown_at = now;
            self.probing = true;
        }
    }
}

/// What one claim's booking asks of a schedule.
struct Schedule {
    bucket: &'static str,
    ceiling: f64,
    increase: f64,
    min_pace: f64,
    /// A schedule not booked from for this long starts again at a cut from the rate the
    /// relay was seen to accept, not from the pace it was left at.
    stale_after: Duration,
}

impl Pace {
    pub fn new(limit: Option<RateLimit>, route: Lane) -> Self {
        Self {
            route,
            limit,
            // Slots booked before a cut are sent at the pace before it, up to the horizon.
            replies: Replies::new(seconds(HORIZON_SECONDS)),
            discovered: None,
            booked_pace: None,
        }
    }

    /// The schedule a configured limit books from.
    fn limited_bucket(&self) -> &'static str {
        match self.route {
            Lane::Transactional => BUCKET,
            Lane::Bulk => BULK_BUCKET,
        }
    }

    /// The schedule of the pace found without a limit.
    fn discovered_bucket(&self) -> &'static str {
        match self.route {
            Lane::Transactional => DISCOVERED,
            Lane::Bulk => BULK_DISCOVERED,
        }
    }

    /// Where the send tasks count the relay's replies, which the next claim judges.
    pub fn reply_count(&self) -> Arc<ReplyCount> {
        self.replies.count()
    }

    /// The schedule this claim books from, or none (no limit, and no cut yet or the pace
    /// found forgotten). `before` is the pace the replies judged were booked at.
    fn schedule(&mut self, judged: &Judgement, before: Option<f64>) -> Option<Schedule> {
        if let Some(limit) = self.limit {
            return Some(Schedule {
                bucket: self.limited_bucket(),
                ceiling: limit.per_second,
                increase: limit.per_second * RECOVERY_PER_SECOND,
                min_pace: limit.per_second * MIN_PACE_SHARE,
                stale_after: Duration::from_secs(60),
            });
        }
        let discovered = &mut self.discovered;
        if let Some(cut) = judged.cut {
            *discovered = Some(Found::after_cut(
                before.unwrap_or(cut.sent_rate),
                Instant::now(),
            ));
        } else if judged.quiet_for.is_none_or(|quiet| quiet >= FORGET_AFTER) {
            *discovered = None;
        } else if let Some(found) = discovered.as_mut().filter(|_| judged.outgrown) {
            found.outgrown(before, Instant::now());
        }
        let found = (*discovered)?;
        Some(Schedule {
            bucket: self.discovered_bucket(),
            ceiling: found.ceiling,
            increase: found.increase(),
            min_pace: MIN_DISCOVERED,
            stale_after: FORGET_AFTER,
        })
    }

    /// Before a claim of up to `wanted` rows: how many it may take now, and their slots.
    pub async fn allowance(
        &mut self,
        pool: &Store,
        wanted: u32,
        metrics: &Metrics,
    ) -> Result<Allowance, sqlx::Error> {
        let booked_before = self.booked_pace;
        let judged = self.replies.judge(booked_before);
        let cut = judged.cut;
        let Some(schedule) = self.schedule(&judged, booked_before) else {
            if booked_before.is_some() {
                // The pace found is forgotten: nothing paces the sends now.
                self.booked_pace = None;
                metrics.send_rate_limit(self.route, 0.0);
            }
            return Ok(Allowance::Take {
                rows: wanted,
                slots: None,
            });
        };
        if let Some(cut) = cut {
            Self::cut(pool, &schedule, cut).await?;
        }
        let booking = send_rate::book(
            pool,
            &SlotRequest {
                bucket: schedule.bucket,
                limit: schedule.ceiling,
                wanted: i64::from(wanted),
                horizon_seconds: HORIZON_SECONDS,
                increase_per_second: schedule.increase,
                ramp_seconds: RAMP_SECONDS,
                tolerated_share: self.replies.learnt(),
            },
        )
        .await?;
        self.booked(cut, booked_before, &booking, metrics);
        let spacing = 1.0 / booking.pace;
        Ok(match u32::try_from(booking.granted) {
            Ok(rows) if rows > 0 => Allowance::Take {
                rows,
                slots: Some(Slots {
                    first: seconds(booking.starts_in),
                    spacing: seconds(spacing),
                    booking,
                }),
            },
            // The horizon is full: the next slot opens when the first booked one is due.
            _ => {
                self.replies.held_back();
                let wait = seconds(booking.starts_in - HORIZON_SECONDS + spacing);
                Allowance::Wait(wait.max(Duration::from_millis(1)))
            }
        })
    }

    /// Cuts the shared schedule's pace as the replies call for.
    async fn cut(pool: &Store, schedule: &Schedule, cut: Cut) -> Result<(), sqlx::Error> {
        debug!(
            factor = cut.factor,
            refused_share = cut.refused_share,
            tolerated_share = cut.tolerated,
            "the relay is throttling: cutting the pace"
        );
        send_rate::slow_down(
            pool,
            schedule.bucket,
            cut.factor,
            schedule.min_pace,
            cut.accepted_rate.clamp(schedule.min_pace, schedule.ceiling),
            schedule.stale_after,
        )
        .await
    }

    /// After a booking: the gauge, and what the shared schedule says of the other replicas
    /// (a cut of theirs, the share they learnt to tolerate).
    fn booked(&mut self, cut: Option<Cut>, before: Option<f64>, booking: &Booking, metrics: &Metrics) {
        metrics.send_rate_limit(self.route, booking.pace);
        if cut.is_none() && before.is_some_and(|before| booking.pace < before * 0.99) {
            self.replies.cut_elsewhere();
        }
        self.booked_pace = Some(booking.pace);
        self.replies.shared(booking.tolerated_share);
    }

    /// A claim that wanted `wanted` rows, was allowed `allowed` and took `taken`: when it
    /// took all it was allowed and wanted more, the pace held sends back.
    pub fn claimed(&mut self, wanted: u32, allowed: u32, taken: u32) {
        if allowed < wanted && taken >= allowed {
            self.replies.held_back();
        }
    }

    /// A claim took fewer rows than it booked slots for: the rest go back.
    ///
    /// The slots were booked from the schedule the claim used; without a limit, that is
    /// the found one.
    pub async fn unused(
        &self,
        pool: &Store,
        slots: Option<&Slots>,
        unused: u32,
    ) -> Result<(), sqlx::Error> {
        match slots {
            Some(slots) if unused > 0 => {
                let bucket = if self.limit.is_some() {
                    self.limited_bucket()
                } else {
                    self.discovered_bucket()
                };
                send_rate::hand_back(pool, bucket, &slots.booking, i64::from(unused)).await
            }
            _ => Ok(()),
        }
    }
}

/// A duration from seconds that may be negative or not finite (then zero), at most an hour.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.clamp(0.0, 3600.0)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Found, MIN_INCREASE, RateLimit};

    #[test]
    fn a_found_pace_grows_past_its_cut_only_while_the_relay_takes_all_it_is_given() {
        let start = Instant::now();
        // Cut in quiet traffic: 0.3 a second were being sent.
        let mut found = Found::after_cut(0.3, start);
        assert_eq!(found.ceiling, MIN_INCREASE);
        let second = |n: u64| start + Duration::from_secs(n);
        // Below its ceiling, the pace grows by itself; the ceiling stays.
        found.outgrown(Some(0.5), second(1));
        assert_eq!(found.ceiling, 1.0);
        // At its ceiling, holding sends back, refused nothing: it doubles, once a second.
        found.outgrown(Some(1.0), second(2));
        found.outgrown(Some(1.0), second(2));
        assert_eq!(found.ceiling, 2.0);
        for n in 3..12 {
            let pace = found.ceiling;
            found.outgrown(Some(pace), second(n));
        }
        assert_eq!(
            found.ceiling, 1024.0,
            "ten seconds of demand: over a thousand a second"
        );
        assert!(
            found.increase() > 50.0,
            "and it grows as fast: {}",
            found.increase()
        );
        // A cut puts the ceiling at the pace before it.
        assert_eq!(Found::after_cut(40.0, second(12)).ceiling, 40.0);
    }

    #[test]
    fn rates_are_read_per_second_minute_or_hour() {
        for (text, per_second) in [
            ("14/s", 14.0),
            ("600/m", 10.0),
            ("50000/h", 50000.0 / 3600.0),
        ] {
            let rate = RateLimit::parse(text).unwrap();
            assert!((rate.per_second - per_second).abs() < 1e-9, "{text}");
        }
    }

    #[test]
    fn a_rate_that_cannot_be_meant_is_refused_with_what_was_expected() {
        for bad in [
            "14",
            "14/d",
            "0/s",
            "-5/s",
            "x/s",
            "nan/s",
            "inf/s",
            "2000000/s",
            "1/1s",
        ] {
            let error = RateLimit::parse(bad).unwrap_err();
            assert!(error.contains(bad), "{bad}: {error}");
        }
    }
}
