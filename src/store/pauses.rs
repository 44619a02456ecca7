//! SQL for paused kinds: pause, resume and list, each change audited. The claim reads the
//! table itself (`claim::CLAIM`), so every replica obeys a pause at its next claim and a
//! pause outlives any restart.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgPool};

use super::NOTIFY_CHANNEL;
use super::admin::audit;
use super::statements::{fetch_all_alone, query, query_as};

/// A paused kind.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Pause {
    pub kind: String,
    pub reason: String,
    pub paused_by: String,
    pub paused_at: DateTime<Utc>,
}

/// Pauses `kind` for an operator, or replaces the reason of a pause already on (keeping
/// when it began), with the audit entry, in one transaction. Returns the pause as stored.
pub async fn pause(
    pool: &PgPool,
    kind: &str,
    reason: &str,
    actor: &str,
) -> Result<Pause, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let pause: Pause = query_as(
        "INSERT INTO outbox_kind_pauses (kind, reason, paused_by) VALUES ($1, $2, $3) \
         ON CONFLICT (kind) DO UPDATE SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by \
         RETURNING kind, reason, paused_by, paused_at",
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
        audit(&mut tx, actor, "resume", kind, 1, None).await?;
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
        query_as("SELECT kind, reason, paused_by, paused_at FROM outbox_kind_pauses ORDER BY kind"),
        pool,
    )
    .await
}
