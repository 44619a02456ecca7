//! Withdrawing messages for operators (`sql/cancel.sql`): one by id or key through the
//! producers' own functions (`outbox_cancel_id`, `outbox_cancel`), and pending messages by
//! filter, counted first, then cancelled a bounded batch a transaction, each audited.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::admin::{Operator, audit};
use super::statement::Sql;
use super::statements::Store;
use crate::message::{CancelAnswer, PendingFilter};

/// The timeline's event for a message withdrawn while a replica held it. The statements
/// and migration 30's function write it; the word test holds them equal.
#[cfg(test)]
pub(crate) const CANCEL_REQUESTED: &str = "cancel_requested";
/// The audit trail's action for a withdrawal.
pub(crate) const AUDIT_CANCEL: &str = "cancel";
/// The most rows one statement of a bulk cancel changes: about 50 ms of PostgreSQL, so that
/// no statement holds its locks long (BENCHMARKS.md, *Recall by filter*).
pub const CANCEL_BATCH: i64 = 1000;

/// Which message to withdraw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelTarget {
    Id(i64),
    /// The producer's idempotency key.
    Key(String),
}

impl CancelTarget {
    /// How the audit trail names it.
    fn audited(&self) -> String {
        match self {
            CancelTarget::Id(id) => format!("id:{id}"),
            CancelTarget::Key(key) => format!("key:{key}"),
        }
    }
}

/// Withdraws one message for `actor`, with the audit entry, in one transaction.
pub async fn cancel(
    store: &Store,
    target: &CancelTarget,
    actor: &Operator,
) -> Result<CancelAnswer, sqlx::Error> {
    let mut tx = store.pool().begin().await?;
    let answer: String = match target {
        CancelTarget::Id(id) => store.query_scalar(Sql::CancelById).bind(id),
        CancelTarget::Key(key) => store.query_scalar(Sql::CancelByKey).bind(key.as_str()),
    }
    .bind(actor.name.as_str())
    .fetch_one(&mut *tx)
    .await?;
    let answer = CancelAnswer::parse(&answer)
        .ok_or_else(|| sqlx::Error::Protocol(format!("outbox_cancel answered {answer:?}")))?;
    let changed = usize::from(matches!(answer, CancelAnswer::Cancelled | CancelAnswer::InFlight));
    let detail = Some(answer.as_str());
    audit(store, &mut tx, actor, AUDIT_CANCEL, &target.audited(), changed, detail).await?;
    tx.commit().await?;
    Ok(answer)
}

/// What a filter matches among pending messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, FromRow)]
pub struct PendingCount {
    pub matching: i64,
    /// Of them, held by a replica now: they may be sent.
    pub in_flight: i64,
}

/// What a bulk cancel changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BulkCancelled {
    /// Ended unsent.
    pub cancelled: i64,
    /// Held by a replica: marked, so that they end unsent unless that send succeeds.
    pub in_flight: i64,
}

/// One batch's result.
#[derive(FromRow)]
struct CancelledBatch {
    last_due: Option<DateTime<Utc>>,
    last_id: Option<i64>,
    scanned: i64,
    cancelled: i64,
    in_flight: i64,
}

/// Counts the pending messages `filter` matches.
pub async fn count_pending(store: &Store, filter: &PendingFilter) -> Result<PendingCount, sqlx::Error> {
    let query = store.query_as(Sql::CountPending);
    store.one(bind_filter(query, filter)).await
}

/// Cancels every pending message `filter` matches, [`CANCEL_BATCH`] a transaction with its
/// audit entry, walking the due index once from start to end: delivery goes on between
/// batches, and rows an application holds locked are left (counted by a second count).
pub async fn cancel_pending(
    store: &Store,
    filter: &PendingFilter,
    actor: &Operator,
) -> Result<BulkCancelled, sqlx::Error> {
    let mut total = BulkCancelled::default();
    let mut after: (Option<DateTime<Utc>>, Option<i64>) = (None, None);
    loop {
        let mut tx = store.pool().begin().await?;
        let query = bind_filter(store.query_as(Sql::CancelPending), filter);
        let batch: CancelledBatch = query
            .bind(CANCEL_BATCH)
            .bind(after.0)
            .bind(after.1)
            .bind(actor.name.as_str())
            .fetch_one(&mut *tx)
            .await?;
        let changed = usize::try_from(batch.cancelled + batch.in_flight).unwrap_or(usize::MAX);
        if changed > 0 {
            let detail = filter.describe();
            audit(store, &mut tx, actor, AUDIT_CANCEL, "filter", changed, Some(&detail)).await?;
        }
        tx.commit().await?;
        total.cancelled += batch.cancelled;
        total.in_flight += batch.in_flight;
        if batch.scanned < CANCEL_BATCH {
            return Ok(total);
        }
        after = (batch.last_due, batch.last_id);
    }
}

/// Binds `filter` as `$1`-`$5` of `pending_filter`.
fn bind_filter<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    filter: &'q PendingFilter,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    query
        .bind(filter.kind.as_ref().map(|kind| kind.as_str()))
        .bind(filter.tag.as_ref().map(|tag| tag.as_str()))
        .bind(filter.created_before)
        .bind(filter.created_after)
        .bind(filter.recipient_domain.as_deref())
}
