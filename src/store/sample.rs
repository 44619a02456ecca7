//! The gauges' sample: the table's totals, the figures per kind that the lanes add up,
//! and the paused kinds.

use std::time::Duration;

use sqlx::FromRow;

use super::callbacks::CallbackBacklog;
use super::statement::Sql;
use super::statements::{Bound, Store};

/// The gauges' values, sampled from the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub totals: Totals,
    /// Per kind with pending messages, paused or not.
    pub kinds: Vec<KindSample>,
    pub paused: Vec<PausedKind>,
    /// The timeline's events since the last sample.
    pub events: EventTail,
    /// The delivery callbacks still to send.
    pub callbacks: CallbackBacklog,
}

/// What the timeline gained since the event a sample read last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct EventTail {
    /// The newest event read: the next sample reads after it.
    pub last_id: i64,
    /// Cancellations among the events after the one the sample was given (none at the
    /// first sample, which only finds where the events end).
    pub cancelled: i64,
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
pub async fn sample(
    store: &Store,
    within: Duration,
    events_after: Option<i64>,
) -> Result<Sample, sqlx::Error> {
    let mut transaction = store.begin_bounded(Bound::Statement(within)).await?;
    let totals: Totals = store
        .query_as(Sql::SampleTotals)
        .fetch_one(&mut *transaction)
        .await?;
    let kinds: Vec<KindSample> = store
        .query_as(Sql::SampleKinds)
        .fetch_all(&mut *transaction)
        .await?;
    let totals = Totals {
        oldest_pending_age: kinds
            .iter()
            .map(|kind| kind.oldest_pending_age)
            .fold(0.0, f64::max),
        ..totals
    };
    let paused = store
        .query_as(Sql::SamplePaused)
        .fetch_all(&mut *transaction)
        .await?;
    let events = store
        .query_as(Sql::SampleEvents)
        .bind(events_after)
        .fetch_one(&mut *transaction)
        .await?;
    let callbacks = store
        .query_as(Sql::SampleCallbacks)
        .fetch_one(&mut *transaction)
        .await?;
    transaction.commit().await?;
    Ok(Sample {
        totals,
        kinds,
        paused,
        events,
        callbacks,
    })
}

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
