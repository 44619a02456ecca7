//! SQL for operators: the dead-letter view, retry and discard, and the audit trail.

use super::statements::fetch_all_alone;
use super::statements::{query, query_as, query_scalar};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, PgPool, Postgres, Transaction};

use super::NOTIFY_CHANNEL;
pub use super::messages::{MessageDetail, MessageState, StoredPayload, message};
use super::timeline;

/// A dead letter as listed: no payload.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
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

/// Dead letters of one kind that failed the same way.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Group {
    pub kind: String,
    pub error_class: String,
    pub count: i64,
    #[sqlx(flatten)]
    pub newest: GroupExample,
}

/// The newest dead letter of a [`Group`].
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct GroupExample {
    #[sqlx(rename = "newest_id")]
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

    /// What the action did to a message, as the CLI and the API say it.
    pub fn past_tense(self) -> &'static str {
        match self {
            Action::Retry => "requeued",
            Action::Discard => "discarded",
        }
    }
}

/// Why an action on one message did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no message {0}")]
    NotFound(i64),
    #[error("message {id} is {state}, not dead-lettered")]
    NotDeadLettered { id: i64, state: MessageState },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// One operator action, as `outbox_admin_audit` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub rows: i32,
    /// What the action was for, where it says (a pause's reason).
    pub detail: Option<String>,
}

/// Dead letters, newest first; `after` is the last id of the previous page.
pub async fn list_dead_letters(
    pool: &PgPool,
    kind: Option<&str>,
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    fetch_all_alone(
        query_as(concat!(
            "SELECT id, kind, ",
            recipients_column!(),
            ", attempts, last_error, coalesce(error_class, 'unknown') AS error_class, \
                outbox_on_the_calendar(created_at) AS created_at, \
                outbox_on_the_calendar(dead_lettered_at) AS dead_lettered_at \
         FROM outbox_messages WHERE ",
            dead_letter!(),
            " AND ($1::text IS NULL OR kind = $1) AND ($2::bigint IS NULL OR id < $2) \
         ORDER BY id DESC LIMIT $3"
        ))
        .bind(kind)
        .bind(after)
        .bind(limit),
        pool,
    )
    .await
}

/// Dead letters grouped by kind and failure, largest group first, each with its newest example.
pub async fn groups(pool: &PgPool) -> Result<Vec<Group>, sqlx::Error> {
    fetch_all_alone(
        query_as(concat!(
            "WITH g AS ( \
             SELECT kind, coalesce(error_class, 'unknown') AS error_class, count(*) AS count, \
                    max(id) AS newest_id \
             FROM outbox_messages WHERE ",
            dead_letter!(),
            " GROUP BY 1, 2) \
         SELECT g.kind, g.error_class, g.count, g.newest_id, m.last_error, \
                outbox_on_the_calendar(m.dead_lettered_at) AS dead_lettered_at \
         FROM g JOIN outbox_messages m ON m.id = g.newest_id \
         ORDER BY g.count DESC, g.kind, g.error_class",
        )),
        pool,
    )
    .await
}

/// Of an `UPDATE` by [`apply`]: the dead letters a [`Selection`] names (`$1` ids, `$2`
/// kind, `$3` error class, `$4` all of them), and their ids returned.
macro_rules! selected_dead_letters {
    () => {
        concat!(
            " WHERE ",
            dead_letter!(),
            " AND ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR kind = $2) \
               AND ($3::text IS NULL OR coalesce(error_class, 'unknown') = $3) \
               AND ($1::bigint[] IS NOT NULL OR $2::text IS NOT NULL OR $4) \
             RETURNING id"
        )
    };
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
        Action::Retry => concat!(
            "UPDATE outbox_messages \
             SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now(), \
                 locked_until = NULL, locked_by = NULL, claim_token = NULL, end_reason = NULL, ",
            times_on_the_calendar!(),
            selected_dead_letters!()
        ),
        Action::Discard => concat!(
            "UPDATE outbox_messages SET discarded_at = now(), discarded_by = $5, \
                 next_attempt_at = outbox_on_the_calendar(next_attempt_at), ",
            times_on_the_calendar!(),
            selected_dead_letters!()
        ),
    };
    let update = query_scalar(sql).bind(ids).bind(kind).bind(class).bind(all);
    let update = match action {
        Action::Retry => update,
        Action::Discard => update.bind(actor),
    };
    let changed: Vec<i64> = update.fetch_all(&mut *tx).await?;
    timeline::record_operator_action(&mut tx, &changed, action.past_tense(), actor).await?;
    audit(
        &mut tx,
        actor,
        action.as_str(),
        &selection.to_string(),
        changed.len(),
        None,
    )
    .await?;
    if action == Action::Retry && !changed.is_empty() {
        query("SELECT pg_notify($1, '')")
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

/// What an action on the dead letters `ids` leaves undone: after a retry, their recipients
/// that are suppressed (the messages will end `suppressed`, not sent); nothing after a
/// discard.
pub async fn left_undone(
    pool: &PgPool,
    action: Action,
    ids: &[i64],
) -> Result<Vec<super::suppressions::SuppressedRecipient>, sqlx::Error> {
    match action {
        Action::Retry => super::suppressions::suppressed_recipients_of(pool, ids).await,
        Action::Discard => Ok(Vec::new()),
    }
}

pub(super) async fn audit(
    tx: &mut Transaction<'_, Postgres>,
    actor: &str,
    action: &str,
    target: &str,
    rows: usize,
    detail: Option<&str>,
) -> Result<(), sqlx::Error> {
    query(
        "INSERT INTO outbox_admin_audit (actor, action, target, rows, detail) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(actor)
    .bind(action)
    .bind(target)
    .bind(i32::try_from(rows).unwrap_or(i32::MAX))
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The most recent admin actions that change something: lookups, which change nothing
/// and come by the dozen, are left out (they are in the table, for an audit of who looked
/// at whose messages).
pub async fn audit_log(pool: &PgPool, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    fetch_all_alone(
        query_as(concat!(
            "SELECT id, at, actor, action, target, rows, detail FROM outbox_admin_audit \
             WHERE action <> '",
            audit_lookup!(),
            "' ORDER BY id DESC LIMIT $1"
        ))
        .bind(limit),
        pool,
    )
    .await
}
