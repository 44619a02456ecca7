//! How fast the dispatcher may send: the send-rate limit all replicas share, cut when the
//! relay says it is throttling and recovering after.
//!
//! With `OUTBOXD_RATE_LIMIT`, every claim first draws tokens from a bucket in the database
//! ([`store::send_rate`]) and claims no more rows than it got, so that any number of
//! replicas together stay under the limit. A throttling reply releases its message
//! without an attempt and halves the shared pace (at most once a second); the pace then
//! recovers by [`RECOVERY_PER_SECOND`] of the limit each second. Without a limit there is
//! no shared pace: a throttling reply pauses this replica's claims for [`UNLIMITED_PAUSE`].

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use crate::lock::lock;
use crate::store::send_rate::{self, TokenRequest};
use crate::telemetry::metrics::Metrics;

/// The bucket `OUTBOXD_RATE_LIMIT` draws from.
const BUCKET: &str = "global";
/// The bucket holds a tenth of a second of the pace (at least one message): the most a
/// sink can see above the limit in any one-second window.
pub const BURST_SECONDS: f64 = 0.1;
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

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

/// How many rows the next claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allowance {
    Take(u32),
    /// None yet: look again after this long.
    Wait(Duration),
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

    /// Before a claim of up to `wanted` rows: how many it may take now.
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
                Allowance::Take(wanted)
            });
        };
        if throttled {
            send_rate::slow_down(pool, BUCKET, limit.per_second * MIN_PACE_SHARE).await?;
        }
        let grant = send_rate::take(
            pool,
            &TokenRequest {
                bucket: BUCKET,
                limit: limit.per_second,
                wanted: i64::from(wanted),
                burst_seconds: BURST_SECONDS,
                recovery_per_second: RECOVERY_PER_SECOND,
            },
        )
        .await?;
        metrics.send_rate_limit(grant.pace);
        Ok(match u32::try_from(grant.granted) {
            Ok(granted) if granted > 0 => Allowance::Take(granted),
            _ => self.wait(Duration::from_secs_f64(
                ((1.0 - grant.left) / grant.pace).clamp(0.001, 3600.0),
            )),
        })
    }

    /// A claim took fewer rows than it was allowed: the rest go back to the bucket.
    pub async fn unused(&self, pool: &PgPool, tokens: u32) -> Result<(), sqlx::Error> {
        if self.limit.is_none() || tokens == 0 {
            return Ok(());
        }
        send_rate::give_back(pool, BUCKET, i64::from(tokens)).await
    }

    /// How long the loop should wait before claiming again, if the pace said so.
    pub fn resume_in(&self) -> Option<Duration> {
        let resume_at = self.lock().take()?;
        Some(resume_at.saturating_duration_since(Instant::now()))
    }

    fn wait(&self, wait: Duration) -> Allowance {
        *self.lock() = Some(Instant::now() + wait);
        Allowance::Wait(wait)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        lock(&self.resume_at)
    }
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
