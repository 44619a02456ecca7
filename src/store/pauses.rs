//! SQL for paused kinds: pause, resume and list, each change audited. The claim reads the
//! table itself (`sql/claim.sql`), so every replica obeys a pause at its next claim and a
//! pause outlives any restart.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::admin::{Operator, audit, remove_by_key, wake_dispatchers};
use super::statement::Sql;
use super::statements::{Bound, Store};
use crate::message::{AUTOMATIC_ACTOR, Kind, MAX_PAUSE_REASON_CHARS, RecentSends};
use crate::text::cut;

/// The audit log's `action` for a resume, which the automatic pause also reads: only sends
/// after a kind's last resume are judged.
pub(crate) const AUDIT_RESUME: &str = "resume";

/// A paused kind.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Pause {
    pub kind: String,
    pub reason: String,
    pub paused_by: String,
    pub paused_at: DateTime<Utc>,
    /// Paused by outboxd on a bounce or complaint breach, not by an operator.
    pub automatic: bool,
}

/// Pauses `kind` for an operator, or replaces the reason of a pause already on (keeping
/// when it began; an automatic pause becomes the operator's), with the audit entry, in one
/// transaction. Returns the pause as stored.
pub async fn pause(
    store: &Store,
    kind: &Kind,
    reason: &str,
    actor: &Operator,
) -> Result<Pause, sqlx::Error> {
    let mut tx = store.pool().begin().await?;
    let pause: Pause = store
        .query_as(Sql::PauseKind)
        .bind(kind.as_str())
        .bind(reason)
        .bind(actor.name.as_str())
        .fetch_one(&mut *tx)
        .await?;
    audit(store, &mut tx, actor, "pause", kind.as_str(), 1, Some(reason)).await?;
    tx.commit().await?;
    Ok(pause)
}

/// Resumes `kind` for an operator, with the audit entry; false when it was not paused.
/// The notification without a due time tells every replica's claim to scan its due index
/// from the start again: the kind's rows were skipped, and its floor may have passed them.
pub async fn resume(store: &Store, kind: &Kind, actor: &Operator) -> Result<bool, sqlx::Error> {
    let mut tx = store.pool().begin().await?;
    let resumed = remove_by_key(store, &mut tx, Sql::ResumeKind, kind.as_str()).await? > 0;
    if resumed {
        audit(store, &mut tx, actor, AUDIT_RESUME, kind.as_str(), 1, None).await?;
        wake_dispatchers(store, &mut tx).await?;
    }
    tx.commit().await?;
    Ok(resumed)
}

/// Every paused kind, by kind.
pub async fn list(store: &Store) -> Result<Vec<Pause>, sqlx::Error> {
    store.all(store.query_as(Sql::ListPauses)).await
}

/// Pauses `kind` on a bounce or complaint breach of the sends judged from `judged_since`,
/// unless it is paused already (by an operator, or by another replica a moment before),
/// with the audit entry. True when this call paused it.
///
/// An operator's resume can commit between the read of the sends and this write: the
/// insert then finds no pause in its way, and would pause the kind again on sends the
/// resume set aside. So once the row is in, a fresh snapshot looks for a resume after
/// `judged_since` and rolls the pause back if one is there. A resume that deleted the pause
/// this insert waited on has committed by then, so the look cannot miss it.
pub async fn pause_automatically(
    store: &Store,
    kind: &str,
    reason: &str,
    judged_since: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let reason = cut(reason, MAX_PAUSE_REASON_CHARS);
    let mut tx = store.pool().begin().await?;
    let inserted = store
        .query(Sql::PauseKindAutomatically)
        .bind(kind)
        .bind(reason)
        .bind(AUTOMATIC_ACTOR)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted == 0 {
        return Ok(false);
    }
    let resumed_since: bool = store
        .query_scalar(Sql::ResumedSince)
        .bind(kind)
        .bind(judged_since)
        .fetch_one(&mut *tx)
        .await?;
    if resumed_since {
        tx.rollback().await?;
        return Ok(false);
    }
    audit(
        store,
        &mut tx,
        &Operator::named(AUTOMATIC_ACTOR),
        "auto_pause",
        kind,
        1,
        Some(reason),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// `kind`'s latest `window` sends of the last day since it was last resumed (a resume
/// re-arms the check: what was sent before it is not judged again), and how many distinct
/// recipient addresses (`outbox_recipient_keys`) among them bounced hard
/// (reported by a provider, or answered at once by the relay, discarded since or not) or
/// complained. Reads the sent rows' index from now back, the dead
/// letters' and the discarded rows' (an operator's discard of the bounced dead letters
/// must not hide them); the server cancels it after `within`, since for a kind that is a
/// small share of a busy table the walk can reach back over most of a day's sends.
pub async fn recent_sends(
    store: &Store,
    kind: &str,
    window: u32,
    within: Duration,
) -> Result<RecentSends, sqlx::Error> {
    let mut transaction = store.begin_bounded(Bound::Statement(within)).await?;
    let recent = store
        .query_as(Sql::RecentSends)
        .bind(kind)
        .bind(i64::from(window))
        .fetch_one(&mut *transaction)
        .await?;
    transaction.commit().await?;
    Ok(recent)
}
