//! SQL for operators: the dead-letter view, retry and discard, statistics, the audit
//! trail, and retention.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::NOTIFY_CHANNEL;

/// A dead letter as listed: no payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    pub id: i64,
    pub kind: String,
    pub recipients: Vec<String>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub error_class: String,
    pub created_at: DateTime<Utc>,
    pub dead_lettered_at: DateTime<Utc>,
}

/// One message with everything about it, payload included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageDetail {
    pub id: i64,
    pub kind: String,
    pub state: &'static str,
    pub recipients: Vec<String>,
    pub payload: Value,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub error_class: Option<String>,
    pub created_at: DateTime<Utc>,
    pub not_before: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub discarded_at: Option<DateTime<Utc>>,
    pub discarded_by: Option<String>,
    pub locked_by: Option<String>,
    pub traceparent: Option<String>,
}

/// Dead letters of one kind that failed the same way.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub kind: String,
    pub error_class: String,
    pub count: i64,
    pub newest: GroupExample,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupExample {
    pub id: i64,
    pub last_error: Option<String>,
    pub dead_lettered_at: DateTime<Utc>,
}

/// Which dead letters a bulk action applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    Ids(Vec<i64>),
    Kind(String),
    Group { kind: String, error_class: String },
    All,
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Ids(ids) if ids.len() == 1 => write!(f, "id {}", ids[0]),
            Selection::Ids(ids) => write!(f, "{} ids", ids.len()),
            Selection::Kind(kind) => write!(f, "kind {kind}"),
            Selection::Group { kind, error_class } => write!(f, "group {kind}/{error_class}"),
            Selection::All => f.write_str("all"),
        }
    }
}

/// The bulk actions on dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back to pending, attempts reset, due now.
    Retry,
    /// Kept, marked discarded, out of the dead-letter view.
    Discard,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Discard => "discard",
        }
    }
}

/// Why an action on one message did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no message {0}")]
    NotFound(i64),
    #[error("message {id} is {state}, not dead-lettered")]
    NotDeadLettered { id: i64, state: &'static str },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KindStats {
    pub pending: i64,
    pub due: i64,
    pub in_flight: i64,
    pub dead_letters: i64,
    pub sent_last_hour: i64,
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
    pub kinds: BTreeMap<String, KindStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub rows: i32,
}

fn recipients(row: &sqlx::postgres::PgRow) -> Result<Vec<String>, sqlx::Error> {
    let mut out = Vec::new();
    for field in ["to_", "cc", "bcc"] {
        match row.try_get::<Option<Value>, _>(field)? {
            Some(Value::String(s)) => out.push(s),
            Some(Value::Array(items)) => {
                out.extend(
                    items
                        .into_iter()
                        .filter_map(|v| v.as_str().map(str::to_owned)),
                );
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Dead letters, newest first; `after` is the last id of the previous page.
pub async fn list_dead_letters(
    pool: &PgPool,
    kind: Option<&str>,
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, kind, payload->'to' AS to_, payload->'cc' AS cc, payload->'bcc' AS bcc, \
                attempts, last_error, coalesce(error_class, 'unknown') AS error_class, \
                created_at, dead_lettered_at \
         FROM outbox_messages \
         WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL \
           AND ($1::text IS NULL OR kind = $1) AND ($2::bigint IS NULL OR id < $2) \
         ORDER BY id DESC LIMIT $3",
    )
    .bind(kind)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(DeadLetter {
                id: row.try_get("id")?,
                kind: row.try_get("kind")?,
                recipients: recipients(row)?,
                attempts: row.try_get("attempts")?,
                last_error: row.try_get("last_error")?,
                error_class: row.try_get("error_class")?,
                created_at: row.try_get("created_at")?,
                dead_lettered_at: row.try_get("dead_lettered_at")?,
            })
        })
        .collect()
}

/// One message in any state, with its payload.
pub async fn message(pool: &PgPool, id: i64) -> Result<Option<MessageDetail>, sqlx::Error> {
    let Some(row) = sqlx::query(
        "SELECT id, kind, payload, payload->'to' AS to_, payload->'cc' AS cc, payload->'bcc' AS bcc, \
                attempts, last_error, error_class, created_at, not_before, next_attempt_at, \
                dispatched_at, dead_lettered_at, discarded_at, discarded_by, locked_by, traceparent \
         FROM outbox_messages WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let dispatched_at: Option<DateTime<Utc>> = row.try_get("dispatched_at")?;
    let dead_lettered_at: Option<DateTime<Utc>> = row.try_get("dead_lettered_at")?;
    let discarded_at: Option<DateTime<Utc>> = row.try_get("discarded_at")?;
    Ok(Some(MessageDetail {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        state: state(dispatched_at, dead_lettered_at, discarded_at),
        recipients: recipients(&row)?,
        payload: row.try_get("payload")?,
        attempts: row.try_get("attempts")?,
        last_error: row.try_get("last_error")?,
        error_class: row.try_get("error_class")?,
        created_at: row.try_get("created_at")?,
        not_before: row.try_get("not_before")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        dispatched_at,
        dead_lettered_at,
        discarded_at,
        discarded_by: row.try_get("discarded_by")?,
        locked_by: row.try_get("locked_by")?,
        traceparent: row.try_get("traceparent")?,
    }))
}

fn state(
    dispatched_at: Option<DateTime<Utc>>,
    dead_lettered_at: Option<DateTime<Utc>>,
    discarded_at: Option<DateTime<Utc>>,
) -> &'static str {
    match (dispatched_at, dead_lettered_at, discarded_at) {
        (Some(_), _, _) => "dispatched",
        (None, Some(_), Some(_)) => "discarded",
        (None, Some(_), None) => "dead_lettered",
        (None, None, _) => "pending",
    }
}

/// Dead letters grouped by kind and failure, largest group first, each with its newest example.
pub async fn groups(pool: &PgPool) -> Result<Vec<Group>, sqlx::Error> {
    let rows = sqlx::query(
        "WITH g AS ( \
             SELECT kind, coalesce(error_class, 'unknown') AS error_class, count(*) AS count, \
                    max(id) AS newest_id \
             FROM outbox_messages \
             WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL \
             GROUP BY 1, 2) \
         SELECT g.kind, g.error_class, g.count, g.newest_id, m.last_error, m.dead_lettered_at \
         FROM g JOIN outbox_messages m ON m.id = g.newest_id \
         ORDER BY g.count DESC, g.kind, g.error_class",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(Group {
                kind: row.try_get("kind")?,
                error_class: row.try_get("error_class")?,
                count: row.try_get("count")?,
                newest: GroupExample {
                    id: row.try_get("newest_id")?,
                    last_error: row.try_get("last_error")?,
                    dead_lettered_at: row.try_get("dead_lettered_at")?,
                },
            })
        })
        .collect()
}

/// Retries or discards the selected dead letters in one transaction with its audit entry,
/// and wakes the dispatchers after a retry. Returns the ids it changed.
pub async fn apply(
    pool: &PgPool,
    action: Action,
    selection: &Selection,
    actor: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    let (ids, kind, class, all) = match selection {
        Selection::Ids(ids) => (Some(ids.as_slice()), None, None, false),
        Selection::Kind(kind) => (None, Some(kind.as_str()), None, false),
        Selection::Group { kind, error_class } => {
            (None, Some(kind.as_str()), Some(error_class.as_str()), false)
        }
        Selection::All => (None, None, None, true),
    };
    let mut tx = pool.begin().await?;
    let sql = match action {
        Action::Retry => {
            "UPDATE outbox_messages \
             SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now(), \
                 locked_until = NULL, locked_by = NULL, claim_token = NULL \
             WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL \
               AND ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR kind = $2) \
               AND ($3::text IS NULL OR coalesce(error_class, 'unknown') = $3) \
               AND ($1::bigint[] IS NOT NULL OR $2::text IS NOT NULL OR $4) \
             RETURNING id"
        }
        Action::Discard => {
            "UPDATE outbox_messages SET discarded_at = now(), discarded_by = $5 \
             WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL \
               AND ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR kind = $2) \
               AND ($3::text IS NULL OR coalesce(error_class, 'unknown') = $3) \
               AND ($1::bigint[] IS NOT NULL OR $2::text IS NOT NULL OR $4) \
             RETURNING id"
        }
    };
    let query = sqlx::query_scalar(sql)
        .bind(ids)
        .bind(kind)
        .bind(class)
        .bind(all);
    let query = match action {
        Action::Retry => query,
        Action::Discard => query.bind(actor),
    };
    let changed: Vec<i64> = query.fetch_all(&mut *tx).await?;
    audit(
        &mut tx,
        actor,
        action.as_str(),
        &selection.to_string(),
        changed.len(),
    )
    .await?;
    if action == Action::Retry && !changed.is_empty() {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(NOTIFY_CHANNEL)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Retries or discards one dead letter, telling a missing row from one in another state.
pub async fn apply_one(
    pool: &PgPool,
    action: Action,
    id: i64,
    actor: &str,
) -> Result<(), ActionError> {
    let changed = apply(pool, action, &Selection::Ids(vec![id]), actor).await?;
    if !changed.is_empty() {
        return Ok(());
    }
    match message(pool, id).await? {
        None => Err(ActionError::NotFound(id)),
        Some(m) => Err(ActionError::NotDeadLettered { id, state: m.state }),
    }
}

async fn audit(
    tx: &mut Transaction<'_, Postgres>,
    actor: &str,
    action: &str,
    target: &str,
    rows: usize,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO outbox_admin_audit (actor, action, target, rows) VALUES ($1, $2, $3, $4)",
    )
    .bind(actor)
    .bind(action)
    .bind(target)
    .bind(i32::try_from(rows).unwrap_or(i32::MAX))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The most recent admin actions.
pub async fn audit_log(pool: &PgPool, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, at, actor, action, target, rows FROM outbox_admin_audit ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(AuditEntry {
                id: row.try_get("id")?,
                at: row.try_get("at")?,
                actor: row.try_get("actor")?,
                action: row.try_get("action")?,
                target: row.try_get("target")?,
                rows: row.try_get("rows")?,
            })
        })
        .collect()
}

/// Counts per kind, each from a partial index: pending rows, dead letters, and the last
/// hour of sent rows, never the whole history.
pub async fn stats(pool: &PgPool) -> Result<Stats, sqlx::Error> {
    let mut stats = Stats::default();
    let pending = sqlx::query(
        "SELECT kind, count(*) AS pending, \
                count(*) FILTER (WHERE next_attempt_at <= now()) AS due, \
                count(*) FILTER (WHERE locked_until > now()) AS in_flight, \
                coalesce(extract(epoch FROM now() - min(greatest(created_at, not_before)) \
                    FILTER (WHERE greatest(created_at, not_before) <= now())), 0)::float8 AS oldest \
         FROM outbox_messages WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL \
         GROUP BY kind",
    )
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
    let dead = sqlx::query(
        "SELECT kind, count(*) AS n FROM outbox_messages \
         WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL GROUP BY kind",
    )
    .fetch_all(pool)
    .await?;
    for row in &dead {
        stats
            .kinds
            .entry(row.try_get("kind")?)
            .or_default()
            .dead_letters = row.try_get("n")?;
    }
    let sent = sqlx::query(
        "SELECT kind, count(*) AS n FROM outbox_messages \
         WHERE dispatched_at > now() - interval '1 hour' GROUP BY kind",
    )
    .fetch_all(pool)
    .await?;
    for row in &sent {
        stats
            .kinds
            .entry(row.try_get("kind")?)
            .or_default()
            .sent_last_hour = row.try_get("n")?;
    }
    for kind in stats.kinds.values() {
        stats.pending += kind.pending;
        stats.due += kind.due;
        stats.in_flight += kind.in_flight;
        stats.dead_letters += kind.dead_letters;
        stats.sent_last_hour += kind.sent_last_hour;
    }
    Ok(stats)
}

/// Which rows retention removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prunable {
    Dispatched,
    Discarded,
}

impl Prunable {
    pub fn as_str(self) -> &'static str {
        match self {
            Prunable::Dispatched => "dispatched",
            Prunable::Discarded => "discarded",
        }
    }
}

/// Deletes up to `limit` rows dispatched (or discarded) before `cutoff`, oldest first. Rows
/// another transaction holds are skipped, so the pruner never waits on the dispatcher.
pub async fn prune(
    pool: &PgPool,
    which: Prunable,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let sql = match which {
        Prunable::Dispatched => {
            "WITH doomed AS ( \
                 SELECT id FROM outbox_messages WHERE dispatched_at < $1 \
                 ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM outbox_messages AS m USING doomed WHERE m.id = doomed.id"
        }
        Prunable::Discarded => {
            "WITH doomed AS ( \
                 SELECT id FROM outbox_messages WHERE discarded_at < $1 \
                 ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM outbox_messages AS m USING doomed WHERE m.id = doomed.id"
        }
    };
    Ok(sqlx::query(sql)
        .bind(cutoff)
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected())
}
