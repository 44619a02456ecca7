//! The state of the outbox at a glance, for `outboxd stats`, the API and the admin page.

use super::statements::{fetch_all_alone, fetch_rows_alone};
use super::statements::{query, query_as};
use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::message::actions::{action_expired, action_logged_only, action_suppressed};

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
    /// Ended unsent in the last hour because no SMTP server is configured: only logged.
    pub logged_only_last_hour: i64,
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
    pub logged_only_last_hour: i64,
    pub kinds: BTreeMap<String, KindStats>,
    /// The kinds paused now: their messages wait, pending, until resumed.
    pub paused: Vec<super::pauses::Pause>,
    /// The replicas whose SMTP circuit is open now: they claim nothing meanwhile.
    pub circuits_open: Vec<super::circuits::OpenCircuit>,
}

/// The counts [`KindStats`] and [`Stats`] both keep, each named once: `counts` lists them
/// in this order (the columns of `outboxd stats`), and `add_up_kinds` sums the kinds'
/// into the totals.
macro_rules! shared_counts {
    ($($count:ident),* $(,)?) => {
        impl KindStats {
            /// This kind's counts, in the order of the fields.
            pub fn counts(&self) -> impl Iterator<Item = i64> {
                [$(self.$count),*].into_iter()
            }
        }

        impl Stats {
            /// The whole outbox's counts, in the order of [`KindStats::counts`].
            pub fn counts(&self) -> impl Iterator<Item = i64> {
                [$(self.$count),*].into_iter()
            }

            /// Adds each kind's counts to the totals, which start at zero.
            fn add_up_kinds(&mut self) {
                for kind in self.kinds.values() {
                    $(self.$count += kind.$count;)*
                }
            }
        }
    };
}

shared_counts!(
    pending,
    due,
    in_flight,
    dead_letters,
    sent_last_hour,
    expired_last_hour,
    suppressed_last_hour,
    logged_only_last_hour,
);

/// The rows that ended unsent in the last hour for `reason` (their `end_reason`), from the
/// discarded rows' index.
macro_rules! ended_last_hour {
    ($reason:expr) => {
        concat!(
            "WHERE discarded_at > now() - interval '1 hour' AND end_reason = '",
            $reason,
            "'"
        )
    };
}

/// Counts per kind, each from a partial index: pending rows, dead letters, and the last
/// hour of sent rows, never the whole history.
pub async fn stats(pool: &PgPool) -> Result<Stats, sqlx::Error> {
    let mut stats = Stats::default();
    let pending = fetch_rows_alone(
query(concat!(
        "SELECT kind, count(*) AS pending, \
                count(*) FILTER (WHERE next_attempt_at <= now()) AS due, \
                count(*) FILTER (WHERE locked_until > now()) AS in_flight, \
                coalesce(extract(epoch FROM now() - outbox_on_the_calendar(min(greatest(created_at, not_before)) \
                    FILTER (WHERE greatest(created_at, not_before) <= now()))), 0)::float8 AS oldest \
         FROM outbox_messages WHERE ",
        pending!(),
        " GROUP BY kind",
    ))
    ,
 pool)
    .await?;
    for row in &pending {
        let entry = stats.kinds.entry(row.try_get("kind")?).or_default();
        entry.pending = row.try_get("pending")?;
        entry.due = row.try_get("due")?;
        entry.in_flight = row.try_get("in_flight")?;
        let oldest: f64 = row.try_get("oldest")?;
        stats.oldest_pending_age_seconds = stats.oldest_pending_age_seconds.max(oldest);
    }
    let per_kind: [(&str, CountOf); 5] = [
        (concat!("WHERE ", dead_letter!()), |k| &mut k.dead_letters),
        ("WHERE dispatched_at > now() - interval '1 hour'", |k| {
            &mut k.sent_last_hour
        }),
        (ended_last_hour!(action_expired!()), |k| {
            &mut k.expired_last_hour
        }),
        (ended_last_hour!(action_suppressed!()), |k| {
            &mut k.suppressed_last_hour
        }),
        (ended_last_hour!(action_logged_only!()), |k| {
            &mut k.logged_only_last_hour
        }),
    ];
    for (filter, field) in per_kind {
        for (kind, n) in count_per_kind(pool, filter).await? {
            *field(stats.kinds.entry(kind).or_default()) = n;
        }
    }
    stats.add_up_kinds();
    stats.paused = super::pauses::list(pool).await?;
    stats.circuits_open = super::circuits::open(pool).await?;
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
    fetch_all_alone(
        query_as(sqlx::AssertSqlSafe(format!(
            "SELECT kind, count(*) FROM outbox_messages {filter} GROUP BY kind"
        ))),
        pool,
    )
    .await
}
