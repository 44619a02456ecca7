//! SQL for the suppression list: the dispatcher's lookup, the operators' list, add and
//! remove (each audited), and the bounces and complaints that providers report.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgExecutor};

use super::admin::{Operator, audit, remove_by_key};
use super::statement::Sql;
use super::statements::{Bound, Store};
use super::claim::listing;
use crate::message::Lanes;
use crate::suppression::{
    Address, Feedback, FeedbackSource, Listing, NewSuppression, Scope, SuppressionReason,
};

/// One address on the list.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Suppression {
    pub address: String,
    /// The kinds it stops: `all`, `bulk` or `transactional`.
    #[sqlx(try_from = "String")]
    pub scope: Word<Scope>,
    #[sqlx(try_from = "String")]
    pub reason: Word<SuppressionReason>,
    pub source: String,
    pub detail: Option<String>,
    pub message_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
    pub suppressed_until: Option<DateTime<Utc>>,
    /// Whether it applies now (no `suppressed_until`, or one still ahead).
    pub active: bool,
}

/// A word column read back as the value it names (`reason`, `scope`); a word outside the
/// tables' CHECKs cannot occur.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Word<T>(pub T);

impl<T: std::str::FromStr<Err = String>> TryFrom<String> for Word<T> {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse().map(Word)
    }
}


/// Which of these (normalized) addresses are suppressed now, with each entry's reason and
/// scope.
pub async fn suppressed_among<'e>(
    store: &Store,
    executor: impl PgExecutor<'e>,
    addresses: &[String],
) -> Result<Vec<(String, Listing)>, sqlx::Error> {
    if addresses.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(String, String, String)> = store
        .query_as(Sql::SuppressedAmong)
        .bind(addresses)
        .fetch_all(executor)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(address, reason, scope)| Some((address, listing(&reason, &scope)?)))
        .collect())
}

/// A recipient of a message on the suppression list: a retry does not reach it, and the
/// message ends `suppressed` at its next claim when every one of its recipients is.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct SuppressedRecipient {
    pub message_id: i64,
    pub address: String,
    pub reason: String,
    /// `all`, or the lane whose kinds the entry stops.
    pub scope: String,
    /// Every recipient of the message is suppressed: it will not be sent at all.
    pub all_suppressed: bool,
}

impl SuppressedRecipient {
    /// What an operator who retried the message is told, with the command that lifts the
    /// suppression.
    pub fn warning(&self) -> String {
        let (entry, fate) = match self.scope.as_str() {
            "all" if self.all_suppressed => {
                (self.reason.clone(), "it will end suppressed, not sent")
            }
            "all" => (
                self.reason.clone(),
                "it will not reach them, only the message's other recipients",
            ),
            lane => (
                format!("{} {}, for the {lane} lane only", lane, self.reason),
                "if the message's kind is in that lane (and not essential), it will not reach them",
            ),
        };
        format!(
            "message {} goes to {}, who is suppressed ({entry}): {fate}; lift the suppression \
             first with `outboxd suppressions remove {}` (or the API's DELETE \
             /api/v1/suppressions/ADDRESS, or the admin page)",
            self.message_id,
            crate::text::printable(&self.address),
            crate::text::printable(&self.address)
        )
    }
}

/// The most suppressed recipients [`suppressed_recipients_of`] returns.
const MAX_SUPPRESSED_SHOWN: i64 = 20;

/// The recipients of the messages `ids` that are suppressed now, the first
/// [`MAX_SUPPRESSED_SHOWN`] by message: what a retry of them would not reach.
pub async fn suppressed_recipients_of(
    store: &Store,
    ids: &[i64],
) -> Result<Vec<SuppressedRecipient>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    store
        .all(
            store
                .query_as(Sql::SuppressedRecipientsOf)
                .bind(ids)
                .bind(MAX_SUPPRESSED_SHOWN),
        )
        .await
}

/// The list in address order; `search` matches any part of the address, its ASCII letters
/// in either case as the normal form has them, and `after` is the last address of the
/// previous page.
pub async fn list(
    store: &Store,
    search: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Suppression>, sqlx::Error> {
    store
        .all(
            store
                .query_as(Sql::ListSuppressions)
                .bind(search.map(str::to_ascii_lowercase))
                .bind(after)
                .bind(limit),
        )
        .await
}

/// The `after` of the page that follows `page` (a page of [`list`] holds `limit` whole
/// addresses): its last address when it is full.
pub fn next_address(page: &[Suppression], limit: i64) -> Option<String> {
    let mut addresses: Vec<&str> = page.iter().map(|s| s.address.as_str()).collect();
    addresses.dedup();
    let full = i64::try_from(addresses.len()).unwrap_or(i64::MAX) >= limit;
    addresses.last().filter(|_| full).map(|a| (*a).to_owned())
}

/// One address's entries, `all` first; none when it is not listed.
pub async fn get(store: &Store, address: &Address) -> Result<Vec<Suppression>, sqlx::Error> {
    store
        .all(store.query_as(Sql::GetSuppression).bind(address.as_str()))
        .await
}

/// Adds an address (or replaces its entry) for an operator, with the audit entry, in one
/// transaction.
pub async fn add(store: &Store, entry: &NewSuppression, actor: &Operator) -> Result<(), sqlx::Error> {
    let mut tx = store.pool().begin().await?;
    upsert(store, &mut *tx, entry, Some(&actor.name)).await?;
    let scope = Some(entry.scope.as_str());
    audit(store, &mut tx, actor, "suppress", entry.address.as_str(), 1, scope).await?;
    tx.commit().await
}

/// Removes an address's entry of `scope`, or every entry of it (`None`), for an operator,
/// with the audit entry; false when there was none.
pub async fn remove(
    store: &Store,
    address: &Address,
    scope: Option<Scope>,
    actor: &Operator,
) -> Result<bool, sqlx::Error> {
    let mut tx = store.pool().begin().await?;
    let mut removed = 0;
    if matches!(scope, None | Some(Scope::All)) {
        removed += remove_by_key(store, &mut tx, Sql::RemoveSuppression, address.as_str()).await?;
    }
    if scope != Some(Scope::All) {
        let lane = match scope {
            Some(Scope::Lane(lane)) => Some(lane.as_str()),
            _ => None,
        };
        removed += store
            .query(Sql::RemoveLaneSuppressions)
            .bind(address.as_str())
            .bind(lane)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    audit(
        store,
        &mut tx,
        actor,
        "unsuppress",
        address.as_str(),
        usize::try_from(removed).unwrap_or(0),
        Some(scope.map_or("every entry", Scope::as_str)),
    )
    .await?;
    tx.commit().await?;
    Ok(removed > 0)
}

/// What recording one notification changed, for the provider's answer and the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedbackRecorded {
    /// The provider's notification id was seen before: a retry or a replay, and nothing
    /// was changed again (an operator's removal since then stands).
    pub replay: bool,
    /// Addresses added to the list, or whose temporary entry was made permanent.
    pub suppressed: usize,
    /// Addresses already on the list for good: nothing to change.
    pub already_suppressed: usize,
    /// Rows marked with the bounce or complaint.
    pub marked: usize,
    /// Rows named that were not marked: gone (retention), already marked with as much, or
    /// never sent to the address reported.
    pub not_marked: usize,
}

/// Records a provider's notification: each recipient's suppression and the mark on the
/// message's row, all in one transaction (a notification is taken whole or not at all),
/// once per notification id (`outbox_webhook_receipts`, kept a day, longer than any
/// provider's retries and than the webhooks' freshness windows). A report for a row that
/// retention already deleted still suppresses; a row is marked only when the address
/// reported was one of its recipients.
pub async fn record_feedback(
    store: &Store,
    source: FeedbackSource,
    notification_id: Option<&str>,
    reports: &[Feedback],
    lanes: &Lanes,
) -> Result<FeedbackRecorded, sqlx::Error> {
    let mut recorded = FeedbackRecorded::default();
    if reports.is_empty() {
        // A delivery or an open: nothing to record, nor to tell a replay of.
        return Ok(recorded);
    }
    // A row or an entry another transaction holds is waited for a moment, then the
    // provider is asked to send the notification again: the surface's two connections are
    // never held for as long as an application's transaction stays open.
    let mut tx = store.begin_bounded(Bound::Lock(FEEDBACK_LOCK_WAIT)).await?;
    if let Some(id) = notification_id
        && !first_receipt(store, &mut tx, source, id).await?
    {
        recorded.replay = true;
        return Ok(recorded);
    }
    for feedback in reports {
        let row = match feedback.message_id {
            Some(id) => row_reported(store, &mut tx, id, &feedback.address).await?,
            None => None,
        };
        if row.is_none() && source.speaks_only_for_recipients() {
            recorded.not_marked += 1;
            continue;
        }
        // A report every recipient could have made (its return path is in each copy)
        // suppresses only when the message had no other recipient to speak of.
        let may_suppress = !source.speaks_only_for_recipients()
            || row.as_ref().is_some_and(|(_, recipients)| *recipients == 1);
        let row = row.map(|(kind, _)| kind);
        if let Some(entry) = feedback.suppression.as_ref().filter(|_| may_suppress) {
            // About a message sent to the address: that message's lane; else every kind.
            let entry = match &row {
                Some(kind) => entry.clone().about(lanes.of(kind)),
                None => entry.clone(),
            };
            if upsert(store, &mut *tx, &entry, None).await? {
                recorded.suppressed += 1;
            } else {
                recorded.already_suppressed += 1;
            }
        }
        if let (Some(id), Some(_)) = (feedback.message_id, &row) {
            let marked = mark(store, &mut tx, id, feedback, source).await?;
            match (feedback.mark, marked) {
                (Some(_), true) => recorded.marked += 1,
                (Some(_), false) => recorded.not_marked += 1,
                (None, _) => {}
            }
        } else if feedback.mark.is_some() && feedback.message_id.is_some() {
            recorded.not_marked += 1;
        }
    }
    tx.commit().await?;
    Ok(recorded)
}

/// Records a recipient's one-click unsubscribe; false when the address was already
/// suppressed for as much (a second click, or a provider's retry).
pub async fn record_unsubscribe(store: &Store, entry: &NewSuppression) -> Result<bool, sqlx::Error> {
    let mut tx = store.begin_bounded(Bound::Lock(FEEDBACK_LOCK_WAIT)).await?;
    let added = upsert(store, &mut *tx, entry, None).await?;
    tx.commit().await?;
    Ok(added)
}

/// How long a provider's report waits for a row or an entry another transaction locks.
const FEEDBACK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps a notification's id; false when it was kept before. Old receipts go in the same
/// statement, a few at a time, so the table stays about a day long without a task.
async fn first_receipt(
    store: &Store,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    source: FeedbackSource,
    id: &str,
) -> Result<bool, sqlx::Error> {
    let (first,): (bool,) = store
        .query_as(Sql::FirstReceipt)
        .bind(source.as_str())
        .bind(crate::text::cut(id, 200))
        .fetch_one(&mut **tx)
        .await?;
    Ok(first)
}

/// The kind of the row a report names and how many recipients it had, if the address
/// reported was among them (the row locked for its mark); `None` when the row is gone or
/// was not sent to it.
async fn row_reported(
    store: &Store,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: i64,
    address: &Address,
) -> Result<Option<(String, usize)>, sqlx::Error> {
    let row: Option<(String, Vec<String>)> = store
        .query_as(Sql::EnvelopeOf)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.and_then(|(kind, recipients)| {
        let sent_to = recipients
            .iter()
            .filter_map(|text| Address::parse(text).ok())
            .any(|recipient| recipient == *address);
        sent_to.then_some((kind, recipients.len()))
    }))
}

/// Notes a provider's report on the row it names: an event of its timeline, and its mark
/// (a complaint outranks a bounce, and a hard bounce a soft one), in one statement. True
/// when the row was marked.
async fn mark(
    store: &Store,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: i64,
    feedback: &Feedback,
    source: FeedbackSource,
) -> Result<bool, sqlx::Error> {
    let marked = store
        .query(Sql::MarkFeedback)
        .bind(id)
        .bind(feedback.mark)
        .bind(feedback.event())
        .bind(source.as_str())
        .bind(feedback.detail.as_deref())
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(marked > 0)
}

/// Inserts an entry, or replaces one that has lapsed or that an operator is replacing,
/// and a temporary one with a report that suppresses for good (a complaint or an
/// unsubscribe while an operator's pause is on must outlast the pause). An active entry
/// for good keeps its first reason: a complaint after a hard bounce changes nothing that
/// matters to sending. True when the list changed.
async fn upsert<'e, E: sqlx::PgExecutor<'e>>(
    store: &Store,
    executor: E,
    entry: &NewSuppression,
    actor: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let (statement, lane) = match entry.scope {
        Scope::All => (Sql::UpsertSuppression, None),
        Scope::Lane(lane) => (Sql::UpsertLaneSuppression, Some(lane.as_str())),
    };
    let detail = entry
        .detail
        .as_deref()
        .map(|d| crate::text::cut(d, crate::suppression::MAX_DETAIL_CHARS));
    let mut query = store
        .query(statement)
        .bind(entry.address.as_str())
        .bind(entry.reason.as_str())
        .bind(entry.source.as_str())
        .bind(detail)
        .bind(entry.message_id)
        .bind(actor)
        .bind(entry.until);
    if let Some(lane) = lane {
        query = query.bind(lane);
    }
    let changed = query.execute(executor).await?.rows_affected();
    Ok(changed > 0)
}
