//! SQL for paused kinds: pause, resume and list, each change audited. The claim reads the
//! table itself (`claim::CLAIM`), so every replica obeys a pause at its next claim and a
//! pause outlives any restart.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgPool};

use super::NOTIFY_CHANNEL;
use super::admin::audit;
use super::statements::{Bound, begin_bounded, fetch_all_alone, query, query_as, query_scalar};
use crate::message::{AUTOMATIC_ACTOR, MAX_PAUSE_REASON_CHARS, RecentSends};
use crate::suppression::marks::{mark_complaint, mark_hard_bounce};
use crate::text::cut;

/// The audit log's `action` for a resume, which the automatic pause also reads: only sends
/// after a kind's last resume are judged.
macro_rules! audit_resume {
    () => {
        "resume"
    };
}

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
    pool: &PgPool,
    kind: &str,
    reason: &str,
    actor: &str,
) -> Result<Pause, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let pause: Pause = query_as(
        "INSERT INTO outbox_kind_pauses (kind, reason, paused_by) VALUES ($1, $2, $3) \
         ON CONFLICT (kind) DO UPDATE \
             SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by, automatic = false \
         RETURNING kind, reason, paused_by, paused_at, automatic",
    )
    .bind(kind)
    .bind(reason)
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    audit(&mut tx, actor, "pause", kind, 1, Some(reason)).await?;
    tx.commit().await?;
    Ok(pause)
}

/// Resumes `kind` for an operator, with the audit entry; false when it was not paused.
/// The notification without a due time tells every replica's claim to scan its due index
/// from the start again: the kind's rows were skipped, and its floor may have passed them.
pub async fn resume(pool: &PgPool, kind: &str, actor: &str) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let removed = query("DELETE FROM outbox_kind_pauses WHERE kind = $1")
        .bind(kind)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if removed > 0 {
        audit(&mut tx, actor, audit_resume!(), kind, 1, None).await?;
        query("SELECT pg_notify($1, '')")
            .bind(NOTIFY_CHANNEL)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(removed > 0)
}

/// Every paused kind, by kind.
pub async fn list(pool: &PgPool) -> Result<Vec<Pause>, sqlx::Error> {
    fetch_all_alone(
        query_as("SELECT kind, reason, paused_by, paused_at, automatic FROM outbox_kind_pauses ORDER BY kind"),
        pool,
    )
    .await
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
    pool: &PgPool,
    kind: &str,
    reason: &str,
    judged_since: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let reason = cut(reason, MAX_PAUSE_REASON_CHARS);
    let mut tx = pool.begin().await?;
    let inserted = query(
        "INSERT INTO outbox_kind_pauses (kind, reason, paused_by, automatic) \
         VALUES ($1, $2, $3, true) ON CONFLICT (kind) DO NOTHING",
    )
    .bind(kind)
    .bind(reason)
    .bind(AUTOMATIC_ACTOR)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(false);
    }
    let resumed_since: bool = query_scalar(concat!(
        "SELECT EXISTS (SELECT FROM outbox_admin_audit WHERE action = '",
        audit_resume!(),
        "' AND target = $1 AND at > $2)"
    ))
    .bind(kind)
    .bind(judged_since)
    .fetch_one(&mut *tx)
    .await?;
    if resumed_since {
        tx.rollback().await?;
        return Ok(false);
    }
    audit(
        &mut tx,
        AUTOMATIC_ACTOR,
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
    pool: &PgPool,
    kind: &str,
    window: u32,
    within: Duration,
) -> Result<RecentSends, sqlx::Error> {
    let mut transaction = begin_bounded(pool, Bound::Statement(within)).await?;
    let recent = query_as(concat!(
        "WITH armed AS ( \
             SELECT greatest(now() - interval '1 day', coalesce(max(at), '-infinity')) AS since \
             FROM outbox_admin_audit WHERE action = '",
        audit_resume!(),
        "' AND target = $1 \
         ), latest AS ( \
             (SELECT feedback, dispatched_at AS at, CASE WHEN feedback IS NOT NULL THEN outbox_recipient_keys(payload) END AS recipients \
              FROM outbox_messages \
              WHERE dispatched_at IS NOT NULL AND dispatched_at > (SELECT since FROM armed) \
                AND kind = $1 \
              ORDER BY dispatched_at DESC LIMIT $2) \
             UNION ALL \
             (SELECT feedback, dead_lettered_at, CASE WHEN feedback IS NOT NULL THEN outbox_recipient_keys(payload) END AS recipients \
              FROM outbox_messages WHERE ",
        dead_letter!(),
        " AND dead_lettered_at > (SELECT since FROM armed) \
                AND feedback = '",
        mark_hard_bounce!(),
        "' AND kind = $1) \
             UNION ALL \
             (SELECT feedback, dead_lettered_at, CASE WHEN feedback IS NOT NULL THEN outbox_recipient_keys(payload) END AS recipients \
              FROM outbox_messages WHERE discarded_at IS NOT NULL AND discarded_at > (SELECT since FROM armed) \
                AND dead_lettered_at > (SELECT since FROM armed) AND feedback = '",
        mark_hard_bounce!(),
        "' AND kind = $1) \
             ORDER BY at DESC LIMIT $2 \
         ) \
         SELECT count(*) AS sends, \
                (SELECT count(DISTINCT k) FROM latest AS l, unnest(l.recipients) AS k \
                 WHERE l.feedback = '",
        mark_hard_bounce!(),
        "') AS bounced_recipients, \
                (SELECT count(DISTINCT k) FROM latest AS l, unnest(l.recipients) AS k \
                 WHERE l.feedback = '",
        mark_complaint!(),
        "') AS complainers, \
                (SELECT since FROM armed) AS since \
         FROM latest"
    ))
    .bind(kind)
    .bind(i64::from(window))
    .fetch_one(&mut *transaction)
    .await?;
    transaction.commit().await?;
    Ok(recent)
}
