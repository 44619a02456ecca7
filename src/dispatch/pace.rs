//! How fast the dispatcher may send: the send-rate limit all replicas share, cut when the
//! relay says it is throttling and recovering after.
//!
//! With `OUTBOXD_RATE_LIMIT`, every claim first books send slots from a schedule in the
//! database ([`crate::store::send_rate`]), one every `1 / pace` seconds and up to
//! [`HORIZON_SECONDS`] ahead, claims no more rows than it booked, and each send waits for
//! its slot: any number of replicas together stay under the limit, and one replica still
//! keeps all its connections busy when the relay is slow to answer. A throttling reply
//! releases its message without an attempt and halves the shared pace (at most once a
//! second); the pace then recovers by [`RECOVERY_PER_SECOND`] of the limit each second.
//! Without a limit there is no shared pace: a throttling reply pauses this replica's
//! claims for [`UNLIMITED_PAUSE`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use crate::lock::lock;
use crate::store::send_rate::{self, Booking, SlotRequest};
use crate::telemetry::metrics::Metrics;

/// The schedule `OUTBOXD_RATE_LIMIT` books from.
const BUCKET: &str = "global";
/// How far ahead a claim may book send slots: a second's worth of messages at most.
pub const HORIZON_SECONDS: f64 = 1.0;
/// After throttling, the pace grows back by this share of the limit per second.
pub const RECOVERY_PER_SECOND: f64 = 0.02;
/// Throttling never cuts the pace below this share of the limit.
const MIN_PACE_SHARE: f64 = 1.0 / 64.0;
/// How long a replica without a limit stops claiming after a throttling reply.
pub const UNLIMITED_PAUSE: Duration = Duration::from_secs(1);

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

    pub fn per_second(self) -> f64 {
        self.per_second
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
pub(super) struct Slots {
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

/// The dispatcher's side of the pace: the limit, and whether a reply since the last claim
/// said the relay is throttling.
#[derive(Debug)]
pub(super) struct Pace {
    limit: Option<RateLimit>,
    throttled: AtomicBool,
    resume_at: Mutex<Option<Instant>>,
}

impl Pace {
    pub fn new(limit: Option<RateLimit>) -> Self {
        Self {
            limit,
            throttled: AtomicBool::new(false),
            resume_at: Mutex::new(None),
        }
    }

    /// A send met a throttling reply; the next claim slows down.
    pub fn throttled(&self) {
        self.throttled.store(true, Ordering::Relaxed);
    }

    /// Before a claim of up to `wanted` rows: how many it may take now, and their slots.
    pub async fn allowance(
        &self,
        pool: &PgPool,
        wanted: u32,
        metrics: &Metrics,
    ) -> Result<Allowance, sqlx::Error> {
        let throttled = self.throttled.swap(false, Ordering::Relaxed);
        let Some(limit) = self.limit else {
            return Ok(if throttled {
                self.wait(UNLIMITED_PAUSE)
            } else {
                Allowance::Take {
                    rows: wanted,
                    slots: None,
                }
            });
        };
        if throttled {
            send_rate::slow_down(pool, BUCKET, limit.per_second * MIN_PACE_SHARE).await?;
        }
        let booking = send_rate::book(
            pool,
            &SlotRequest {
                bucket: BUCKET,
                limit: limit.per_second,
                wanted: i64::from(wanted),
                horizon_seconds: HORIZON_SECONDS,
                recovery_per_second: RECOVERY_PER_SECOND,
            },
        )
        .await?;
        metrics.send_rate_limit(booking.pace);
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
            _ => self.wait(seconds(booking.starts_in - HORIZON_SECONDS + spacing)),
        })
    }

    /// A claim took fewer rows than it booked slots for: the rest go back.
    pub async fn unused(
        &self,
        pool: &PgPool,
        slots: Option<&Slots>,
        unused: u32,
    ) -> Result<(), sqlx::Error> {
        match slots {
            Some(slots) if unused > 0 => {
                send_rate::hand_back(pool, BUCKET, &slots.booking, i64::from(unused)).await
            }
            _ => Ok(()),
        }
    }

    /// How long the loop should wait before claiming again, if the pace said so.
    pub fn resume_in(&self) -> Option<Duration> {
        let resume_at = self.lock().take()?;
        Some(resume_at.saturating_duration_since(Instant::now()))
    }

    fn wait(&self, wait: Duration) -> Allowance {
        let wait = wait.max(Duration::from_millis(1));
        *self.lock() = Some(Instant::now() + wait);
        Allowance::Wait(wait)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        lock(&self.resume_at)
    }
}

/// A duration from seconds that may be negative or not finite (then zero), at most an hour.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.clamp(0.0, 3600.0)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::RateLimit;

    #[test]
    fn rates_are_read_per_second_minute_or_hour() {
        for (text, per_second) in [
            ("14/s", 14.0),
            ("600/m", 10.0),
            ("50000/h", 50000.0 / 3600.0),
        ] {
            let rate = RateLimit::parse(text).unwrap();
            assert!((rate.per_second() - per_second).abs() < 1e-9, "{text}");
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
