//! SQL for one message as an operator sees it: by id, or by recipient, with its timeline
//! (`timeline`). Every read goes through one column list, so the two agree.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{FromRow, PgPool};

use super::statements::{fetch_all_alone, fetch_optional_alone, query_as};
use super::timeline::{self, Event};

/// What an operator sees of a message, for a `FROM outbox_messages` to follow. Its times
/// are read through `outbox_on_the_calendar` (migration 12): a producer may have written
/// any time, and one the driver cannot read back must not take an operator's view of the
/// row down.
macro_rules! message_columns {
    () => {
        concat!(
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
           outbox_on_the_calendar(feedback_at) AS feedback_at, smtp_reply, sent_by, send_ms "
        )
    };
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
    /// The relay's reply accepting it (`250 2.0.0 Ok: queued as 4XyZ`), which replica sent
    /// it, and how long the send took.
    pub smtp_reply: Option<String>,
    pub sent_by: Option<String>,
    pub send_ms: Option<i32>,
    /// Its timeline, oldest first: enqueued, each attempt that did not succeed at once and
    /// its reply, releases, feedback, operators' actions, and the send.
    #[sqlx(skip)]
    pub events: Vec<Event>,
}

/// One message in any state, with its payload and its timeline.
pub async fn message(pool: &PgPool, id: i64) -> Result<Option<MessageDetail>, sqlx::Error> {
    let found: Option<MessageDetail> = fetch_optional_alone(
        query_as(concat!(
            message_columns!(),
            "FROM outbox_messages WHERE id = $1"
        ))
        .bind(id),
        pool,
    )
    .await?;
    let Some(mut message) = found else {
        return Ok(None);
    };
    message.events = timeline::events_of(pool, &[id])
        .await?
        .remove(&id)
        .unwrap_or_default();
    Ok(Some(message))
}

/// The lookup of [`by_recipient`]: `$1` the addresses, `$2` the id to page below, `$3`
/// how many. The matches are gathered first, whole (MATERIALIZED), and only then ordered
/// and cut: asked for the newest 50 at once, the planner walks the primary key backwards
/// and reads every row's payload (9.5 s on 2 million rows) instead of the index (under
/// 1 ms). Public for the test that reads its plan.
pub const BY_RECIPIENT: &str = concat!(
    "WITH ended AS MATERIALIZED ( \
             SELECT id FROM outbox_messages WHERE ",
    ended!(),
    " AND ",
    single_recipient!(),
    " AND outbox_single_recipient_key(payload) = ANY($1) \
               AND ($2::bigint IS NULL OR id < $2) \
             UNION ALL \
             SELECT id FROM outbox_messages WHERE ",
    ended!(),
    " AND NOT (",
    single_recipient!(),
    ") AND outbox_recipient_keys(payload) && $1 \
               AND ($2::bigint IS NULL OR id < $2) \
         ), waiting AS MATERIALIZED ( \
             SELECT id FROM outbox_messages WHERE ",
    pending!(),
    "      AND outbox_recipient_keys(payload) && $1 \
               AND ($2::bigint IS NULL OR id < $2) \
         ), chosen AS ( \
             SELECT id FROM ended UNION ALL SELECT id FROM waiting \
             ORDER BY id DESC LIMIT $3 \
         ) ",
    message_columns!(),
    "FROM outbox_messages WHERE id IN (SELECT id FROM chosen) ORDER BY id DESC"
);

/// The messages sent, or to be sent, to any of `addresses`, newest first, `limit` of them
/// below the id `after`, each with its timeline. `addresses` are in the lookup's form
/// (`outbox_recipient_keys`, migration 16): ended messages come from their indexes (a
/// B-tree for those with one recipient, a GIN index for the rest: migrations 19 and 20,
/// whose predicates these conditions repeat), pending ones from the pending rows
/// (O(pending), as the gauges).
pub async fn by_recipient(
    pool: &PgPool,
    addresses: &[String],
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<MessageDetail>, sqlx::Error> {
    let mut messages: Vec<MessageDetail> = fetch_all_alone(
        query_as(BY_RECIPIENT)
            .bind(addresses)
            .bind(after)
            .bind(limit),
        pool,
    )
    .await?;
    let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
    let mut events = timeline::events_of(pool, &ids).await?;
    for message in &mut messages {
        message.events = events.remove(&message.id).unwrap_or_default();
    }
    Ok(messages)
}
