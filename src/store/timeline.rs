//! SQL for each message's timeline: the events kept in `outbox_message_events` (written by
//! the statements that record outcomes, providers' reports and operators' actions), with
//! the two every message has on its row, its enqueueing and its send.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgConnection, Postgres, Transaction};

use super::statement::Sql;
use super::statements::Store;

/// The event of a message's enqueueing, read from its row.
/// The timeline statement writes it (`sql/timeline.sql`); the word test holds the two equal.
#[cfg(test)]
pub(crate) const ENQUEUED: &str = "enqueued";

/// One thing that happened to a message.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Event {
    #[serde(skip)]
    pub message_id: i64,
    /// `enqueued`; an outcome (`retry`, `dead`, `release`, `expired`, `suppressed`,
    /// `sent`); a provider's report (`hard_bounce`, `soft_bounce`, `complaint`,
    /// `unsubscribe`); an operator's action (`requeued`, `discarded`).
    #[serde(rename = "type")]
    pub event: String,
    pub at: DateTime<Utc>,
    /// The replica's worker id, the provider, or the operator.
    pub actor: Option<String>,
    /// The relay's reply code, and its reply, when the event is one.
    pub smtp_code: Option<i32>,
    pub smtp_reply: Option<String>,
    /// The failure's short name (`smtp_451`, `unreachable`, `throttled`, ...).
    pub error_class: Option<String>,
    pub duration_ms: Option<i32>,
    /// What else was said: an error that is not a reply, a provider's diagnostic, or, on a
    /// `sent` event, the relay that took it (`relay host:port`).
    pub detail: Option<String>,
}

impl Event {
    /// What was said, in one text for a reader: the relay's reply and the detail (a send:
    /// `250 ... (relay host:port)`), or either alone, else the failure's class.
    pub fn said(&self) -> String {
        match (&self.smtp_reply, &self.detail) {
            // A send: the relay's reply, and which relay.
            (Some(reply), Some(detail)) => format!("{reply} ({detail})"),
            (Some(text), None) | (None, Some(text)) => text.clone(),
            (None, None) => self.error_class.clone().unwrap_or_default(),
        }
    }
}

/// The timelines of the messages `ids`, each oldest first.
pub async fn events_of(
    store: &Store,
    ids: &[i64],
) -> Result<HashMap<i64, Vec<Event>>, sqlx::Error> {
    store.alone(async |c| events_on(store, c, ids).await).await
}

/// [`events_of`], on `connection` (a transaction's, for the recipient lookup's bounds).
pub async fn events_on(
    store: &Store,
    connection: &mut PgConnection,
    ids: &[i64],
) -> Result<HashMap<i64, Vec<Event>>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let events: Vec<Event> = store
        .query_as(Sql::Timelines)
        .bind(ids)
        .fetch_all(connection)
        .await?;
    let mut timelines: HashMap<i64, Vec<Event>> = HashMap::new();
    for event in events {
        timelines.entry(event.message_id).or_default().push(event);
    }
    Ok(timelines)
}

/// An operator's action on the messages `ids`, in each one's timeline, in the action's
/// transaction.
pub async fn record_operator_action(
    store: &Store,
    tx: &mut Transaction<'_, Postgres>,
    ids: &[i64],
    event: &str,
    actor: &str,
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    store
        .query(Sql::OperatorActionEvents)
        .bind(ids)
        .bind(event)
        .bind(actor)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
