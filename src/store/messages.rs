//! SQL for one message as an operator sees it: by id, or by recipient, with its timeline
//! (`timeline`). Every read goes through one column list, so the two agree.
//!
//! The recipient lookup ("did this user get their email?", from the API, the admin page
//! or the CLI) is bounded: it waits a second at most for a connection (every one busy:
//! try again), it is stopped past [`LOOKUP_TIMEOUT`] or once its client has gone, and it
//! reads a bounded share of the pending rows ([`PENDING_SCAN_ROWS`]). A replica runs it on a
//! pool of its own (`app::pools`), so that the webhooks and the dispatcher never wait
//! behind it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

use sqlx::{FromRow, PgConnection, PgPool};

use super::admin::audit;
use super::statements::{Bound, begin_bounded_on, fetch_optional_alone, query_as, query_scalar};
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
    /// Ended unsent because no SMTP server was configured: only logged
    /// (`end_reason = 'logged_only'`).
    LoggedOnly,
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
            MessageState::LoggedOnly => "logged_only",
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
            MessageState::LoggedOnly,
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

/// How long a recipient lookup may take, all its statements together.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How many pending rows a lookup reads, twice over: the first this many due, and those
/// among this many newest ids (the message just enqueued, which a question is usually
/// about). Ended rows come from indexes; pending ones have none of their own (it would
/// cost every enqueue), and a lookup of them all over 300 000 pending rows took 3 to 4 s.
/// The answer says whether it read them all.
pub const PENDING_SCAN_ROWS: i64 = 10_000;
/// How long a lookup waits for a connection (one may have to be opened) before it is
/// refused as busy.
const CONNECTION_WAIT: Duration = Duration::from_secs(1);
/// How often the server checks, while a lookup runs, that its client is still there: a
/// lookup whose HTTP client left is dropped, its connection closed, and the server ends
/// the statement within this.
const CLIENT_CHECK: Duration = Duration::from_millis(250);

/// The lookup of [`by_recipient`]: `$1` the addresses, `$2` the id to page below, `$3`
/// how many, `$4` how many pending rows to read ([`PENDING_SCAN_ROWS`]). The matches are
/// gathered first, whole (MATERIALIZED), and only then ordered and cut: asked for the
/// newest 50 at once, the planner walks the primary key backwards and reads every row's
/// payload (9.5 s on 2 million rows) instead of the index (under 1 ms). Ended rows: the
/// indexes of migrations 19 and 20, whose predicates these conditions repeat. Pending
/// rows: the first `$4` of `outbox_messages_due_idx`, and those among the newest `$4` ids
/// (a range of the primary key). Public for the test that reads its plan.
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
         ), scanned AS MATERIALIZED ( \
             (SELECT id, payload FROM outbox_messages WHERE ",
    pending!(),
    "       ORDER BY next_attempt_at, id LIMIT $4) \
             UNION ALL \
             (SELECT id, payload FROM outbox_messages WHERE ",
    pending!(),
    "       AND id > (SELECT max(id) FROM outbox_messages) - $4) \
         ), waiting AS ( \
             SELECT DISTINCT id FROM scanned \
             WHERE outbox_recipient_keys(payload) && $1 AND ($2::bigint IS NULL OR id < $2) \
         ), chosen AS ( \
             SELECT id FROM ended UNION ALL SELECT id FROM waiting \
             ORDER BY id DESC LIMIT $3 \
         ) ",
    message_columns!(),
    "FROM outbox_messages WHERE id IN (SELECT id FROM chosen) ORDER BY id DESC"
);

/// Whether more than `$1` rows are pending, read from the due index as the lookup reads
/// them: then the lookup did not read them all.
const MORE_PENDING_THAN: &str = concat!(
    "SELECT count(*) > $1 FROM (SELECT FROM outbox_messages WHERE ",
    pending!(),
    " ORDER BY next_attempt_at, id LIMIT $1 + 1) AS p"
);

/// A page of the messages to an address.
#[derive(Debug, Serialize)]
pub struct RecipientPage {
    pub messages: Vec<MessageDetail>,
    /// Every pending message was searched; `false`: a backlog longer than a lookup reads
    /// ([`PENDING_SCAN_ROWS`]), so a pending message may be missing.
    pub pending_searched_all: bool,
}

/// Why a recipient lookup gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("every connection for lookups is busy ({0} at once): try again in a moment")]
    Busy(u32),
    #[error(
        "the lookup took longer than {}, and was stopped",
        humantime::format_duration(LOOKUP_TIMEOUT)
    )]
    TimedOut,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The messages sent, or to be sent, to any of `addresses`, newest first, `limit` of them
/// below the id `after`, each with its timeline, within the lookup's bounds (the module's
/// comment), recorded in the admin audit as `actor`'s `lookup` of the first address.
/// `addresses` are in the lookup's form (`outbox_recipient_keys`, migration 16).
pub async fn by_recipient(
    pool: &PgPool,
    addresses: &[String],
    after: Option<i64>,
    limit: i64,
    actor: &str,
) -> Result<RecipientPage, LookupError> {
    let busy = || LookupError::Busy(pool.options().get_max_connections());
    let connection = tokio::time::timeout(CONNECTION_WAIT, pool.acquire())
        .await
        .map_err(|_| busy())??;
    let mut connection = CloseIfAbandoned {
        connection,
        finished: false,
    };
    // The server's timeout bounds each statement; this, all of them together. Past it the
    // lookup is dropped, its connection closed, and the server ends the statement.
    let page = tokio::time::timeout(
        LOOKUP_TIMEOUT,
        lookup(&mut connection.connection, addresses, after, limit, actor),
    )
    .await;
    connection.finished = page.is_ok();
    match page {
        Err(_elapsed) => Err(LookupError::TimedOut),
        Ok(Ok(page)) => Ok(page),
        // query_canceled: the server's statement timeout.
        Ok(Err(e)) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("57014") => {
            Err(LookupError::TimedOut)
        }
        Ok(Err(e)) => Err(LookupError::Database(e)),
    }
}

async fn lookup(
    connection: &mut PgConnection,
    addresses: &[String],
    after: Option<i64>,
    limit: i64,
    actor: &str,
) -> Result<RecipientPage, sqlx::Error> {
    let bounds = [
        Bound::Statement(LOOKUP_TIMEOUT),
        Bound::ClientGone(CLIENT_CHECK),
    ];
    let mut tx = begin_bounded_on(connection, &bounds).await?;
    let mut messages: Vec<MessageDetail> = query_as(BY_RECIPIENT)
        .bind(addresses)
        .bind(after)
        .bind(limit)
        .bind(PENDING_SCAN_ROWS)
        .fetch_all(&mut *tx)
        .await?;
    let more_pending: bool = query_scalar(MORE_PENDING_THAN)
        .bind(PENDING_SCAN_ROWS)
        .fetch_one(&mut *tx)
        .await?;
    let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
    let mut events = timeline::events_on(&mut tx, &ids).await?;
    let target = addresses.first().map_or("", String::as_str);
    audit(
        &mut tx,
        actor,
        audit_lookup!(),
        target,
        messages.len(),
        None,
    )
    .await?;
    tx.commit().await?;
    for message in &mut messages {
        message.events = events.remove(&message.id).unwrap_or_default();
    }
    Ok(RecipientPage {
        messages,
        pending_searched_all: !more_pending,
    })
}

/// A pooled connection that is closed, not returned to its pool, if the lookup on it did
/// not finish (its HTTP client left, or its time ran out): returned, sqlx would wait for
/// the statement to end before its next use; closed, the server notices within
/// [`CLIENT_CHECK`] and cancels the statement.
struct CloseIfAbandoned {
    connection: sqlx::pool::PoolConnection<sqlx::Postgres>,
    finished: bool,
}

impl Drop for CloseIfAbandoned {
    fn drop(&mut self) {
        if !self.finished {
            self.connection.close_on_drop();
        }
    }
}
