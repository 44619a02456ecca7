//! SQL for operators: the dead-letter view, retry and discard, and the audit trail.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres, Transaction};

use super::statement::Sql;
use crate::message::Tag;
use super::statements::Store;

use super::NOTIFY_CHANNEL;
pub use super::messages::{MessageDetail, MessageState, message};
use super::timeline;

/// Who acts on outboxd's data: the name its audit trail and timelines keep, and, through
/// the admin surface, the name of the token used (`OUTBOXD_ADMIN_TOKEN_NAME`, with the
/// token's fingerprint: docs/src/admin.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub token: Option<String>,
}

impl Operator {
    /// One who used no admin token: the CLI's user, outboxd itself.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            token: None,
        }
    }
}

impl std::fmt::Display for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
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
    pub tags: Vec<String>,
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
    #[error(
        "message {0} cannot be retried: its secret fields were scrubbed (or its payload removed) when it ended, so it can no longer be sent as it was; its application must enqueue it anew"
    )]
    PayloadGone(i64),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// One operator action, as `outbox_admin_audit` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// The admin token's name, for a change made through the admin surface.
    pub token: Option<String>,
    pub action: String,
    pub target: String,
    pub rows: i32,
    /// What the action was for, where it says (a pause's reason).
    pub detail: Option<String>,
}

/// Dead letters, newest first; `after` is the last id of the previous page.
pub async fn list_dead_letters(
    store: &Store,
    kind: Option<&str>,
    tag: Option<&Tag>,
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    store
        .all(
            store
                .query_as(Sql::ListDeadLetters)
                .bind(kind)
                .bind(after)
                .bind(limit)
                .bind(tag.map(Tag::as_str)),
        )
        .await
}

/// Dead letters grouped by kind and failure, largest group first, each with its newest example.
pub async fn groups(store: &Store) -> Result<Vec<Group>, sqlx::Error> {
    store.all(store.query_as(Sql::DeadLetterGroups)).await
}

/// What a retry or a discard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub changed: Vec<i64>,
    /// Dead letters a retry left as they were: their payload is no longer what was to be
    /// sent (secret fields scrubbed, or removed), so their application must enqueue anew.
    pub not_retryable: Vec<i64>,
}

/// Retries or discards the selected dead letters in one transaction with its audit entry,
/// and wakes the dispatchers after a retry.
pub async fn apply(
    store: &Store,
    action: Action,
    selection: &Selection,
    actor: &Operator,
) -> Result<Applied, sqlx::Error> {
    let (ids, kind, class, all) = match selection {
        Selection::Ids(ids) => (Some(ids.as_slice()), None, None, false),
        Selection::Kind(kind) => (None, Some(kind.as_str()), None, false),
        Selection::Group { kind, error_class } => {
            (None, Some(kind.as_str()), Some(error_class.as_str()), false)
        }
        Selection::All => (None, None, None, true),
    };
    let mut tx = store.pool().begin().await?;
    let sql = match action {
        Action::Retry => Sql::RetryDeadLetters,
        Action::Discard => Sql::DiscardDeadLetters,
    };
    let update = store
        .query_as::<(i64, bool)>(sql)
        .bind(ids)
        .bind(kind)
        .bind(class)
        .bind(all);
    let update = match action {
        Action::Retry => update,
        Action::Discard => update.bind(actor.name.as_str()),
    };
    let rows: Vec<(i64, bool)> = update.fetch_all(&mut *tx).await?;
    let (changed, not_retryable): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(_, c)| *c);
    let changed: Vec<i64> = changed.into_iter().map(|(id, _)| id).collect();
    let not_retryable = not_retryable.into_iter().map(|(id, _)| id).collect();
    timeline::record_operator_action(store, &mut tx, &changed, action.past_tense(), &actor.name).await?;
    audit(
        store,
        &mut tx,
        actor,
        action.as_str(),
        &selection.to_string(),
        changed.len(),
        None,
    )
    .await?;
    if action == Action::Retry && !changed.is_empty() {
        wake_dispatchers(store, &mut tx).await?;
    }
    tx.commit().await?;
    Ok(Applied {
        changed,
        not_retryable,
    })
}

/// Retries or discards one dead letter, telling a missing row from one in another state.
pub async fn apply_one(
    store: &Store,
    action: Action,
    id: i64,
    actor: &Operator,
) -> Result<(), ActionError> {
    let applied = apply(store, action, &Selection::Ids(vec![id]), actor).await?;
    if !applied.changed.is_empty() {
        return Ok(());
    }
    if !applied.not_retryable.is_empty() {
        return Err(ActionError::PayloadGone(id));
    }
    match message(store, id).await? {
        None => Err(ActionError::NotFound(id)),
        Some(m) => Err(ActionError::NotDeadLettered { id, state: m.state }),
    }
}

/// What an action on the dead letters `ids` leaves undone: after a retry, their recipients
/// that are suppressed (the messages will end `suppressed`, not sent); nothing after a
/// discard.
pub async fn left_undone(
    store: &Store,
    action: Action,
    ids: &[i64],
) -> Result<Vec<super::suppressions::SuppressedRecipient>, sqlx::Error> {
    match action {
        Action::Retry => super::suppressions::suppressed_recipients_of(store, ids).await,
        Action::Discard => Ok(Vec::new()),
    }
}

pub(super) async fn audit(
    store: &Store,
    tx: &mut Transaction<'_, Postgres>,
    actor: &Operator,
    action: &str,
    target: &str,
    rows: usize,
    detail: Option<&str>,
) -> Result<(), sqlx::Error> {
    let rows = i32::try_from(rows).unwrap_or(i32::MAX);
    let entry = store.query(Sql::Audit).bind(actor.name.as_str()).bind(action);
    let entry = entry.bind(target).bind(rows).bind(detail).bind(actor.token.as_deref());
    write_in(tx, entry).await.map(drop)
}

/// At `tx`'s commit, tells every replica's claim to look, from the start of its due index:
/// rows it had passed are due again.
pub(super) async fn wake_dispatchers(
    store: &Store,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<(), sqlx::Error> {
    let wake = store.query(Sql::WakeDispatchers).bind(NOTIFY_CHANNEL);
    write_in(tx, wake).await.map(drop)
}

/// Runs `statement`, which removes what `key` names, in `tx`: how many rows went.
pub(super) async fn remove_by_key(
    store: &Store,
    tx: &mut Transaction<'_, Postgres>,
    statement: Sql,
    key: &str,
) -> Result<u64, sqlx::Error> {
    write_in(tx, store.query(statement).bind(key)).await
}

/// Runs `write` in `tx`: how many rows it changed.
async fn write_in(
    tx: &mut Transaction<'_, Postgres>,
    write: Query<'_, Postgres, PgArguments>,
) -> Result<u64, sqlx::Error> {
    Ok(write.execute(&mut **tx).await?.rows_affected())
}

/// The most recent admin actions that change something: lookups, which change nothing
/// and come by the dozen, are left out (they are in the table, for an audit of who looked
/// at whose messages).
pub async fn audit_log(store: &Store, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    store.all(store.query_as(Sql::AuditLog).bind(limit)).await
}
