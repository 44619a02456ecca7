//! The gauges' sample: the table's totals, the figures per kind that the lanes add up,
//! and the paused kinds.

use std::time::Duration;

use sqlx::{FromRow, PgPool};

use super::statements::{Bound, begin_bounded, query_as};

/// The gauges' values, sampled from the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub totals: Totals,
    /// Per kind with pending messages, paused or not.
    pub kinds: Vec<KindSample>,
    pub paused: Vec<PausedKind>,
}

/// The table's totals, for the gauges that cover every kind.
#[derive(Debug, Clone, Copy, PartialEq, FromRow)]
pub struct Totals {
    pub pending: i64,
    pub dead_letters: i64,
    /// The oldest of the kinds' (their walk of the pending rows finds it; an index of its
    /// own cost each message two entries).
    #[sqlx(skip)]
    pub oldest_pending_age: f64,
    pub oldest_ready_age: f64,
    /// The oldest transaction or snapshot open in this database, by any session but the
    /// sample's own: what keeps vacuum from removing what was sent. Sessions of other roles
    /// count only where the role may see them (`pg_read_all_stats`).
    pub oldest_transaction_age: f64,
    /// The outbox table's dead tuples, as the statistics collector last counted them.
    pub dead_tuples: i64,
}

/// Reads the gauges' values. Each subquery walks a partial index on pending or
/// dead-lettered rows, never the dispatched history; the oldest pending age is the oldest
/// of the kinds'. A time of `-infinity` (a row from
/// before migration 12) counts as year 1: the age is absurd and its alert fires, where the
/// query used to fail.
///
/// The server cancels the sample after `within` ([`begin_bounded`]): under a transaction
/// left open elsewhere the walk grows by the minute, and a sample given up on would go on
/// running, and keep its connection busy, until it ended.
pub async fn sample(pool: &PgPool, within: Duration) -> Result<Sample, sqlx::Error> {
    let mut transaction = begin_bounded(pool, Bound::Statement(within)).await?;
    let totals: Totals = query_as(TOTALS).fetch_one(&mut *transaction).await?;
    let kinds: Vec<KindSample> = query_as(KINDS).fetch_all(&mut *transaction).await?;
    let totals = Totals {
        oldest_pending_age: kinds
            .iter()
            .map(|kind| kind.oldest_pending_age)
            .fold(0.0, f64::max),
        ..totals
    };
    let paused = query_as(
        "SELECT kind, extract(epoch FROM now() - paused_at)::float8 AS paused_for, automatic \
         FROM outbox_kind_pauses ORDER BY kind",
    )
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    Ok(Sample {
        totals,
        kinds,
        paused,
    })
}

/// The totals of a [`Sample`] but the oldest pending age. bench/run.py reads it (and
/// [`KINDS`]) from here to time the sample as outboxd runs it.
const TOTALS: &str = concat!(
    "SELECT \
       (SELECT count(*) FROM outbox_messages \
         WHERE ",
    pending!(),
    ") AS pending, \
       (SELECT count(*) FROM outbox_messages \
         WHERE ",
    dead_letter!(),
    ") AS dead_letters, \
       (SELECT coalesce(extract(epoch FROM now() - outbox_on_the_calendar(min(next_attempt_at))), 0)::float8 \
          FROM outbox_messages \
         WHERE ",
    pending!(),
    " AND next_attempt_at <= now()) AS oldest_ready_age, \
       (SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8 \
          FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)) AS oldest_transaction_age, \
       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables \
                  WHERE relid = to_regclass('outbox_messages')), 0) AS dead_tuples"
);

/// Per kind: its messages due now (neither backing off nor leased), how long the oldest of
/// them has waited, and how long the oldest pending one has been due. One walk of the
/// pending rows, as the total's count is.
const KINDS: &str = concat!(
    "SELECT kind, count(*) FILTER (WHERE next_attempt_at <= now()) AS ready, \
            coalesce(extract(epoch FROM now() - outbox_on_the_calendar( \
                min(next_attempt_at) FILTER (WHERE next_attempt_at <= now()))), 0)::float8 \
                AS oldest_ready_age, \
            coalesce(extract(epoch FROM now() - outbox_on_the_calendar( \
                min(greatest(created_at, not_before)) \
                FILTER (WHERE greatest(created_at, not_before) <= now()))), 0)::float8 \
                AS oldest_pending_age \
     FROM outbox_messages WHERE ",
    pending!(),
    " GROUP BY kind ORDER BY kind"
);

/// One kind's figures in a [`Sample`].
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct KindSample {
    pub kind: String,
    pub ready: i64,
    pub oldest_ready_age: f64,
    pub oldest_pending_age: f64,
}

/// A kind an operator paused, and for how long so far.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct PausedKind {
    pub kind: String,
    pub paused_for: f64,
    /// Paused by outboxd on a bounce or complaint breach.
    pub automatic: bool,
}
