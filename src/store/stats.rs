//! The state of the outbox at a glance, for `outboxd stats`, the API and the admin page.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use super::statement::Sql;
use super::statements::Store;
use crate::message::actions;

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

/// Counts per kind, each from a partial index: pending rows, dead letters, and the last
/// hour of sent rows, never the whole history.
pub async fn stats(store: &Store) -> Result<Stats, sqlx::Error> {
    let mut stats = Stats::default();
    let pending = store.rows(store.query(Sql::StatsPending)).await?;
    for row in &pending {
        let entry = stats.kinds.entry(row.try_get("kind")?).or_default();
        entry.pending = row.try_get("pending")?;
        entry.due = row.try_get("due")?;
        entry.in_flight = row.try_get("in_flight")?;
        let oldest: f64 = row.try_get("oldest")?;
        stats.oldest_pending_age_seconds = stats.oldest_pending_age_seconds.max(oldest);
    }
    let per_kind: [(Sql, Option<&str>, CountOf); 5] = [
        (Sql::StatsDeadLetters, None, |k| &mut k.dead_letters),
        (Sql::StatsSentLastHour, None, |k| &mut k.sent_last_hour),
        (Sql::StatsEndedLastHour, Some(actions::EXPIRED), |k| {
            &mut k.expired_last_hour
        }),
        (Sql::StatsEndedLastHour, Some(actions::SUPPRESSED), |k| {
            &mut k.suppressed_last_hour
        }),
        (Sql::StatsEndedLastHour, Some(actions::LOGGED_ONLY), |k| {
            &mut k.logged_only_last_hour
        }),
    ];
    for (sql, reason, field) in per_kind {
        let query = store.query_as(sql);
        let counts: Vec<(String, i64)> = match reason {
            Some(reason) => store.all(query.bind(reason)).await?,
            None => store.all(query).await?,
        };
        for (kind, n) in counts {
            *field(stats.kinds.entry(kind).or_default()) = n;
        }
    }
    stats.add_up_kinds();
    stats.paused = super::pauses::list(store).await?;
    stats.circuits_open = super::circuits::open(store).await?;
    Ok(stats)
}

/// Which count of a kind's stats a query fills.
type CountOf = fn(&mut KindStats) -> &mut i64;
