//! The send schedule all replicas book from before they claim, so that a send-rate limit
//! holds for the table, not per process (see the migration that creates
//! `outbox_send_rate`).

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::statement::Sql;
use super::statements::Store;

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

/// Books up to `wanted` consecutive slots within the horizon. One statement; the row lock
/// serializes replicas for its duration only.
pub async fn book(store: &Store, request: &SlotRequest<'_>) -> Result<Booking, sqlx::Error> {
    loop {
        let booking: Option<Booking> = store
            .optional(
                store
                    .query_as(Sql::BookSlots)
                    .bind(request.bucket)
                    .bind(request.limit)
                    .bind(request.wanted)
                    .bind(request.horizon_seconds)
                    .bind(request.increase_per_second)
                    .bind(request.ramp_seconds)
                    .bind(request.tolerated_share),
            )
            .await?;
        if let Some(booking) = booking {
            return Ok(booking);
        }
        store
            .execute(
                store
                    .query(Sql::StartSchedule)
                    .bind(request.bucket)
                    .bind(request.limit),
            )
            .await?;
    }
}

/// Hands back the last `slots` of a booking a claim could not fill, unless another booking
/// came after it (then they stay unused: slower, never faster).
pub async fn hand_back(
    store: &Store,
    bucket: &str,
    booking: &Booking,
    slots: i64,
) -> Result<(), sqlx::Error> {
    store
        .execute(
            store
                .query(Sql::HandBackSlots)
                .bind(bucket)
                .bind(booking.ends_at)
                .bind(slots as f64 / booking.pace),
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
    store: &Store,
    bucket: &str,
    factor: f64,
    min_pace: f64,
    start: f64,
    stale_after: std::time::Duration,
) -> Result<(), sqlx::Error> {
    store
        .execute(
            store
                .query(Sql::SlowDown)
                .bind(bucket)
                .bind(min_pace)
                .bind(factor)
                .bind(start)
                .bind(stale_after.as_secs_f64()),
        )
        .await?;
    Ok(())
}
