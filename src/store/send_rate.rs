//! The send schedule all replicas book from before they claim, so that a send-rate limit
//! holds for the table, not per process (see the migration that creates
//! `outbox_send_rate`).

use super::statements::{execute_alone, fetch_optional_alone};
use super::statements::{query, query_as};
use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

/// One booking.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    pub bucket: &'a str,
    /// The configured limit, in messages per second: the most the pace recovers to.
    pub limit: f64,
    /// The most slots to book (the claim size).
    pub wanted: i64,
    /// How far ahead of now slots may be booked, in seconds.
    pub horizon_seconds: f64,
    /// How many messages a second the pace grows by each second after throttling, up to
    /// `limit`: additive increase.
    pub increase_per_second: f64,
    /// How long after a cut the growth takes to reach `increase_per_second`, from nothing:
    /// right after a cut the pace is near what the relay takes, and grows slowly there.
    pub ramp_seconds: f64,
    /// The share of sends the relay refuses whatever the pace, as this replica learnt it
    /// since its last booking: kept for every replica. `None`: keep the schedule's.
    pub tolerated_share: Option<f64>,
}

/// What a booking got: `granted` slots, the first `starts_in` seconds from now, then one
/// every `1 / pace` seconds.
#[derive(Debug, Clone, Copy, PartialEq, FromRow)]
pub struct Booking {
    pub granted: i64,
    pub starts_in: f64,
    /// The pace now, in messages per second.
    pub pace: f64,
    /// The first free slot after this booking: slots are handed back only while it is
    /// still the last booking.
    pub ends_at: DateTime<Utc>,
    /// The share of sends the relay refuses whatever the pace, as the replicas learnt it.
    pub tolerated_share: f64,
}

/// How far the pace has grown, in seconds of full growth, `$x` seconds after a cut, its
/// growth ramping up from nothing over `$6` seconds: the integral of `min(1, t / $6)` from
/// 0 to `$x`. A booking grows the pace by the difference of this between its time and the
/// last booking's, so that the growth is the same however often replicas book.
macro_rules! ramp_integral {
    ($x:literal) => {
        concat!(
            "(CASE WHEN greatest(0, ",
            $x,
            ") <= $6 THEN greatest(0, ",
            $x,
            ") ^ 2 / (2 * $6) ELSE ",
            $x,
            " - $6 / 2 END)"
        )
    };
}

/// Books up to `wanted` consecutive slots within the horizon. One statement; the row lock
/// serializes replicas for its duration only.
pub async fn book(pool: &PgPool, request: &SlotRequest<'_>) -> Result<Booking, sqlx::Error> {
    loop {
        let booking: Option<Booking> = fetch_optional_alone(
query_as(
            concat!(
                "WITH current AS ( \
                 SELECT r.name, c.now, greatest(r.next_slot, c.now) AS start, \
                        least($2, r.pace + $5 * CASE WHEN r.throttled_at IS NULL \
                            THEN greatest(0, extract(epoch FROM c.now - r.updated_at)) \
                            ELSE greatest(0, ",
                ramp_integral!("extract(epoch FROM c.now - r.throttled_at)"),
                " - ",
                ramp_integral!("extract(epoch FROM r.updated_at - r.throttled_at)"),
                ") END) AS pace \
                 FROM outbox_send_rate AS r, (SELECT clock_timestamp() AS now) AS c \
                 WHERE r.name = $1 FOR UPDATE OF r \
             ), granted AS ( \
                 SELECT name, now, start, pace, \
                        least($3, greatest(0, floor(($4 - extract(epoch FROM start - now)) * pace)))::int8 AS n \
                 FROM current \
             ) \
             UPDATE outbox_send_rate AS b \
             SET next_slot = g.start + make_interval(secs => g.n / g.pace), pace = g.pace, \
                 updated_at = g.now, \
                 tolerated_share = coalesce($7, b.tolerated_share) \
             FROM granted AS g WHERE b.name = g.name \
             RETURNING g.n AS granted, extract(epoch FROM g.start - g.now)::float8 AS starts_in, \
                       g.pace::float8 AS pace, b.next_slot AS ends_at, b.tolerated_share",
            ))
        .bind(request.bucket)
        .bind(request.limit)
        .bind(request.wanted)
        .bind(request.horizon_seconds)
        .bind(request.increase_per_second)
        .bind(request.ramp_seconds)
        .bind(request.tolerated_share)
        ,
 pool)
        .await?;
        if let Some(booking) = booking {
            return Ok(booking);
        }
        // The first booking on this table: the schedule starts now, at the full pace.
        execute_alone(
            query(
                "INSERT INTO outbox_send_rate (name, pace) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING",
            )
            .bind(request.bucket)
            .bind(request.limit),
            pool,
        )
        .await?;
    }
}

/// Hands back the last `slots` of a booking a claim could not fill, unless another booking
/// came after it (then they stay unused: slower, never faster).
pub async fn hand_back(
    pool: &PgPool,
    bucket: &str,
    booking: &Booking,
    slots: i64,
) -> Result<(), sqlx::Error> {
    execute_alone(
        query(
            "UPDATE outbox_send_rate SET next_slot = next_slot - make_interval(secs => $3) \
         WHERE name = $1 AND next_slot = $2",
        )
        .bind(bucket)
        .bind(booking.ends_at)
        .bind(slots as f64 / booking.pace),
        pool,
    )
    .await?;
    Ok(())
}

/// The relay said it is throttling: multiply the pace by `factor` (the share of sends it
/// accepted), at most once every 2 s for all replicas (the second after a cut shows what
/// it did, and the replicas judge it apart: one burst of refusals is one signal), never
/// below `min_pace`. A schedule that does not exist yet, or was not booked from for
/// `stale_after` (a restart, a found pace forgotten), starts again at `start`, the pace the
/// relay was seen to accept.
pub async fn slow_down(
    pool: &PgPool,
    bucket: &str,
    factor: f64,
    min_pace: f64,
    start: f64,
    stale_after: std::time::Duration,
) -> Result<(), sqlx::Error> {
    execute_alone(
        query(
            "INSERT INTO outbox_send_rate AS r (name, pace, throttled_at) \
             VALUES ($1, greatest($2, $4), clock_timestamp()) \
             ON CONFLICT (name) DO UPDATE \
             SET pace = CASE WHEN r.updated_at < clock_timestamp() - make_interval(secs => $5) \
                             THEN greatest($2, $4) ELSE greatest($2, r.pace * $3) END, \
                 throttled_at = clock_timestamp() \
             WHERE r.throttled_at IS NULL OR r.throttled_at < clock_timestamp() - interval '2 seconds'",
        )
        .bind(bucket)
        .bind(min_pace)
        .bind(factor)
        .bind(start)
        .bind(stale_after.as_secs_f64()),
        pool,
    )
    .await?;
    Ok(())
}
