//! The state of the outbox at a glance, for `outboxd stats`, the API and the admin page.

use super::statements::{query, query_as};
use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::message::actions::{action_expired, action_suppressed};

/// One kind's share of [`Stats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KindStats {
    pub pending: i64,
    pub due: i64,
    pub in_flight: i64,
    pub dead_letters: i64,
    pub sent_last_hour: i64,
    /// Ended unsent in the last hour because their expiry passed.
    pub expired_last_hour: i64,
    /// Ended unsent in the last hour because every recipient is suppressed.
    pub suppressed_last_hour: i64,
}

/// The state of the outbox at a glance.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    pub pending: i64,
    pub due: i64,
    pub in_flight: i64,
    pub dead_letters: i64,
    pub oldest_pending_age_seconds: f64,
    pub sent_last_hour: i64,
    pub expired_last_hour: i64,
    pub suppressed_last_hour: i64,
    pub kinds: BTreeMap<String, KindStats>,
}

/// Counts per kind, each from a partial index: pending rows, dead letters, and the last
/// hour of sent rows, never the whole history.
pub async fn stats(pool: &PgPool) -> Result<Stats, sqlx::Error> {
    let mut stats = Stats::default();
    let pending = query(concat!(
        "SELECT kind, count(*) AS pending, \
                count(*) FILTER (WHERE next_attempt_at <= now()) AS due, \
                count(*) FILTER (WHERE locked_until > now()) AS in_flight, \
                coalesce(extract(epoch FROM now() - outbox_on_the_calendar(min(greatest(created_at, not_before)) \
                    FILTER (WHERE greatest(created_at, not_before) <= now()))), 0)::float8 AS oldest \
         FROM outbox_messages WHERE ",
        pending!(),
        " GROUP BY kind",
    ))
    .fetch_all(pool)
    .await?;
    for row in &pending {
        let entry = stats.kinds.entry(row.try_get("kind")?).or_default();
        entry.pending = row.try_get("pending")?;
        entry.due = row.try_get("due")?;
        entry.in_flight = row.try_get("in_flight")?;
        let oldest: f64 = row.try_get("oldest")?;
        stats.oldest_pending_age_seconds = stats.oldest_pending_age_seconds.max(oldest);
    }
    let per_kind: [(&str, CountOf); 4] = [
        (concat!("WHERE ", dead_letter!()), |k| &mut k.dead_letters),
        ("WHERE dispatched_at > now() - interval '1 hour'", |k| {
            &mut k.sent_last_hour
        }),
        (
            concat!(
                "WHERE discarded_at > now() - interval '1 hour' AND end_reason = '",
                action_expired!(),
                "'"
            ),
            |k| &mut k.expired_last_hour,
        ),
        (
            concat!(
                "WHERE discarded_at > now() - interval '1 hour' AND end_reason = '",
                action_suppressed!(),
                "'"
            ),
            |k| &mut k.suppressed_last_hour,
        ),
    ];
    for (filter, field) in per_kind {
        for (kind, n) in count_per_kind(pool, filter).await? {
            *field(stats.kinds.entry(kind).or_default()) = n;
        }
    }
    for kind in stats.kinds.values() {
        stats.pending += kind.pending;
        stats.due += kind.due;
        stats.in_flight += kind.in_flight;
        stats.dead_letters += kind.dead_letters;
        stats.sent_last_hour += kind.sent_last_hour;
        stats.expired_last_hour += kind.expired_last_hour;
        stats.suppressed_last_hour += kind.suppressed_last_hour;
    }
    Ok(stats)
}

/// Which count of a kind's stats a query fills.
type CountOf = fn(&mut KindStats) -> &mut i64;

/// Rows per kind matching `filter`, a literal `WHERE` clause (each matches a partial
/// index).
async fn count_per_kind(
    pool: &PgPool,
    filter: &'static str,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    query_as(sqlx::AssertSqlSafe(format!(
        "SELECT kind, count(*) FROM outbox_messages {filter} GROUP BY kind"
    )))
    .fetch_all(pool)
    .await
}
