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
}

/// Books up to `wanted` consecutive slots within the horizon. One statement; the row lock
/// serializes replicas for its duration only.
pub async fn book(pool: &PgPool, request: &SlotRequest<'_>) -> Result<Booking, sqlx::Error> {
    loop {
        let booking: Option<Booking> = fetch_optional_alone(
query_as(
            "WITH current AS ( \
                 SELECT name, clock_timestamp() AS now, \
                        greatest(next_slot, clock_timestamp()) AS start, \
                        least($2, pace + $5 * \
                              greatest(0, extract(epoch FROM clock_timestamp() - updated_at)) * \
                              least(1, coalesce(extract(epoch FROM clock_timestamp() - throttled_at) / $6, 1))) \
                            AS pace \
                 FROM outbox_send_rate WHERE name = $1 FOR UPDATE \
             ), granted AS ( \
                 SELECT name, now, start, pace, \
                        least($3, greatest(0, floor(($4 - extract(epoch FROM start - now)) * pace)))::int8 AS n \
                 FROM current \
             ) \
             UPDATE outbox_send_rate AS b \
             SET next_slot = g.start + make_interval(secs => g.n / g.pace), pace = g.pace, \
                 updated_at = g.now \
             FROM granted AS g WHERE b.name = g.name \
             RETURNING g.n AS granted, extract(epoch FROM g.start - g.now)::float8 AS starts_in, \
                       g.pace::float8 AS pace, b.next_slot AS ends_at",
        )
        .bind(request.bucket)
        .bind(request.limit)
        .bind(request.wanted)
        .bind(request.horizon_seconds)
        .bind(request.increase_per_second)
        .bind(request.ramp_seconds)
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
/// accepted), at most once a second (one burst of throttled replies is one signal), never
/// below `min_pace`. A schedule that does not exist yet, or was not booked from for a
/// minute (a restart), starts again at `start`, the pace the relay was seen to accept.
pub async fn slow_down(
    pool: &PgPool,
    bucket: &str,
    factor: f64,
    min_pace: f64,
    start: f64,
) -> Result<(), sqlx::Error> {
    execute_alone(
        query(
            "INSERT INTO outbox_send_rate AS r (name, pace, throttled_at) \
             VALUES ($1, greatest($2, $4), clock_timestamp()) \
             ON CONFLICT (name) DO UPDATE \
             SET pace = CASE WHEN r.updated_at < clock_timestamp() - interval '1 minute' \
                             THEN greatest($2, $4) ELSE greatest($2, r.pace * $3) END, \
                 throttled_at = clock_timestamp() \
             WHERE r.throttled_at IS NULL OR r.throttled_at < clock_timestamp() - interval '1 second'",
        )
        .bind(bucket)
        .bind(min_pace)
        .bind(factor)
        .bind(start),
        pool,
    )
    .await?;
    Ok(())
}
