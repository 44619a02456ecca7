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

use sqlx::{FromRow, PgConnection};

use super::admin::{Operator, audit};
use crate::message::Tag;
use super::statement::Sql;
use super::statements::{Bound, Store, begin_bounded_on};
use super::timeline::{self, Event};

/// The audit log's `action` for a recipient lookup: written by the lookup, left out of the
/// admin page's list of recent actions.
pub(crate) const AUDIT_LOOKUP: &str = "lookup";

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
    /// Withdrawn by its producer or an operator (`end_reason = 'cancelled'`).
    Cancelled,
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
            MessageState::Cancelled => "cancelled",
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
            MessageState::Cancelled,
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
    /// Its secret fields (its kind's and its own): their values show as `"[secret]"`.
    pub secret_fields: Vec<String>,
    /// When its secret fields were scrubbed from the stored payload (it ended).
    pub secrets_scrubbed_at: Option<DateTime<Utc>>,
    /// When payload retention or an erasure removed the payload (its recipients are kept).
    pub payload_removed_at: Option<DateTime<Utc>>,
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
    /// Its producer's tags.
    pub tags: Vec<String>,
    /// The relay that took it (`host:port`), once sent.
    pub relay: Option<String>,
    /// Its timeline, oldest first: enqueued, each attempt that did not succeed at once and
    /// its reply, releases, feedback, operators' actions, and the send.
    #[sqlx(skip)]
    pub events: Vec<Event>,
}

/// One message in any state, with its payload and its timeline.
pub async fn message(store: &Store, id: i64) -> Result<Option<MessageDetail>, sqlx::Error> {
    let found: Option<MessageDetail> = store
        .optional(store.query_as(Sql::MessageById).bind(id))
        .await?;
    let Some(mut message) = found else {
        return Ok(None);
    };
    message.events = timeline::events_of(store, &[id])
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

/// A page of the messages a lookup found.
#[derive(Debug, Serialize)]
pub struct RecipientPage {
    pub messages: Vec<MessageDetail>,
    /// Every pending message was searched; `false`: a backlog longer than a lookup reads
    /// ([`PENDING_SCAN_ROWS`]), so a pending message may be missing.
    pub pending_searched_all: bool,
}

/// Why a lookup gave no answer.
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

/// What a lookup looks for: the messages to an address (its forms in the lookup's form,
/// `outbox_recipient_keys`, migration 16), or those a producer tagged.
#[derive(Debug, Clone)]
pub enum Search {
    Recipient(Vec<String>),
    Tag(Tag),
}

impl Search {
    /// What the admin audit records it as: the first address, or `tag:` and the tag.
    fn target(&self) -> String {
        match self {
            Search::Recipient(addresses) => addresses.first().cloned().unwrap_or_default(),
            Search::Tag(tag) => format!("tag:{tag}"),
        }
    }
}

/// The messages `search` finds, newest first, `limit` of them below the id `after`, each
/// with its timeline, within the lookup's bounds (the module's comment), recorded in the
/// admin audit as `actor`'s `lookup`.
pub async fn find(
    store: &Store,
    search: &Search,
    after: Option<i64>,
    limit: i64,
    actor: &Operator,
) -> Result<RecipientPage, LookupError> {
    let pool = store.pool();
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
        lookup(store, &mut connection.connection, search, after, limit, actor),
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
    store: &Store,
    connection: &mut PgConnection,
    search: &Search,
    after: Option<i64>,
    limit: i64,
    actor: &Operator,
) -> Result<RecipientPage, sqlx::Error> {
    let bounds = [
        Bound::Statement(LOOKUP_TIMEOUT),
        Bound::ClientGone(CLIENT_CHECK),
    ];
    let mut tx = begin_bounded_on(connection, &bounds).await?;
    let (mut messages, pending_searched_all): (Vec<MessageDetail>, bool) = match search {
        Search::Recipient(addresses) => {
            let messages = store
                .query_as(Sql::MessagesByRecipient)
                .bind(addresses)
                .bind(after)
                .bind(limit)
                .bind(PENDING_SCAN_ROWS)
                .fetch_all(&mut *tx)
                .await?;
            let more_pending: bool = store
                .query_scalar(Sql::MorePendingThan)
                .bind(PENDING_SCAN_ROWS)
                .fetch_one(&mut *tx)
                .await?;
            (messages, !more_pending)
        }
        // The tags' index holds pending rows too: nothing is left unsearched.
        Search::Tag(tag) => {
            let messages = store
                .query_as(Sql::MessagesByTag)
                .bind(tag.as_str())
                .bind(after)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
            (messages, true)
        }
    };
    let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
    let mut events = timeline::events_on(store, &mut tx, &ids).await?;
    let target = search.target();
    audit(store, &mut tx, actor, AUDIT_LOOKUP, &target, messages.len(), None).await?;
    tx.commit().await?;
    for message in &mut messages {
        message.events = events.remove(&message.id).unwrap_or_default();
    }
    Ok(RecipientPage {
        messages,
        pending_searched_all,
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
