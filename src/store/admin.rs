//! SQL for operators: the dead-letter view, retry and discard, and the audit trail.

use super::statements::{fetch_all_alone, fetch_optional_alone};
use super::statements::{query, query_as, query_scalar};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{FromRow, PgPool, Postgres, Transaction};

use super::NOTIFY_CHANNEL;

/// The addresses of a payload's `to`, `cc` and `bcc` (each a string or an array of
/// strings), in that order, as a `recipients` text array; anything else is left out.
macro_rules! recipients_column {
    () => {
        "ARRAY(SELECT r.address #>> '{}' \
               FROM unnest(ARRAY[payload->'to', payload->'cc', payload->'bcc']) \
                    WITH ORDINALITY AS f(field, i), \
                    jsonb_array_elements(CASE jsonb_typeof(f.field) WHEN 'array' THEN f.field \
                                         ELSE jsonb_build_array(f.field) END) \
                    WITH ORDINALITY AS r(address, j) \
               WHERE jsonb_typeof(r.address) = 'string' ORDER BY f.i, r.j) AS recipients"
    };
}

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

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageState {
    Pending,
    Dispatched,
    DeadLettered,
    Discarded,
    /// Ended unsent because its expiry passed (`end_reason = 'expired'`).
    Expired,
    /// Ended unsent because every recipient is suppressed (`end_reason = 'suppressed'`).
    Suppressed,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Dispatched => "dispatched",
            MessageState::DeadLettered => "dead_lettered",
            MessageState::Discarded => "discarded",
            MessageState::Expired => "expired",
            MessageState::Suppressed => "suppressed",
        }
    }
}

impl std::fmt::Display for MessageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for MessageState {
    type Error = String;

    fn try_from(state: String) -> Result<Self, String> {
        [
            MessageState::Pending,
            MessageState::Dispatched,
            MessageState::DeadLettered,
            MessageState::Discarded,
            MessageState::Expired,
            MessageState::Suppressed,
        ]
        .into_iter()
        .find(|s| s.as_str() == state)
        .ok_or_else(|| format!("unknown message state {state:?}"))
    }
}

/// A payload as an operator sees it: its JSON, or, where that cannot be read, its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct StoredPayload(pub Value);

impl From<String> for StoredPayload {
    fn from(text: String) -> Self {
        Self(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

/// One message with everything about it, payload included.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct MessageDetail {
    pub id: i64,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub state: MessageState,
    pub recipients: Vec<String>,
    /// The payload, or its text where outboxd cannot read it as JSON (see
    /// [`crate::message::ClaimedPayload`]), so that such a row can still be shown.
    #[sqlx(try_from = "String")]
    pub payload: StoredPayload,
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
    pub priority: i16,
    pub expires_at: Option<DateTime<Utc>>,
    pub idempotency_key: Option<String>,
    /// Why it ended unsent, when that was not a failure: `expired` or `suppressed`.
    pub end_reason: Option<String>,
    /// What a provider or the receiving server reported after the send: `hard_bounce`,
    /// `soft_bounce` or `complaint`, and when.
    pub feedback: Option<String>,
    pub feedback_at: Option<DateTime<Utc>>,
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

/// One message in any state, with its payload. Its times are read through
/// `outbox_on_the_calendar` (migration 12): a producer may have written any time, and one
/// the driver cannot read back must not take an operator's view of the row down.
pub async fn message(pool: &PgPool, id: i64) -> Result<Option<MessageDetail>, sqlx::Error> {
    fetch_optional_alone(
        query_as(concat!(
            "SELECT id, kind, payload::text AS payload, ",
            recipients_column!(),
            ", CASE WHEN dispatched_at IS NOT NULL THEN 'dispatched' \
                WHEN dead_lettered_at IS NULL THEN 'pending' \
                WHEN end_reason IS NOT NULL THEN end_reason \
                WHEN discarded_at IS NULL THEN 'dead_lettered' \
                ELSE 'discarded' END AS state, \
           attempts, last_error, error_class, outbox_on_the_calendar(created_at) AS created_at, \
           outbox_on_the_calendar(not_before) AS not_before, \
           outbox_on_the_calendar(next_attempt_at) AS next_attempt_at, \
           outbox_on_the_calendar(dispatched_at) AS dispatched_at, \
           outbox_on_the_calendar(dead_lettered_at) AS dead_lettered_at, \
           outbox_on_the_calendar(discarded_at) AS discarded_at, discarded_by, locked_by, \
           traceparent, priority, outbox_on_the_calendar(expires_at) AS expires_at, \
           idempotency_key, end_reason, feedback, \
           outbox_on_the_calendar(feedback_at) AS feedback_at \
         FROM outbox_messages WHERE id = $1"
        ))
        .bind(id),
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

/// The most recent admin actions.
pub async fn audit_log(pool: &PgPool, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    fetch_all_alone(
query_as(
        "SELECT id, at, actor, action, target, rows, detail FROM outbox_admin_audit ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    ,
 pool)
    .await
}
