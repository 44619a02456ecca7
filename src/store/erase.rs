//! Erasure by recipient (`sql/erase.sql`): what outboxd keeps of an address, replaced by
//! its one-way mark, a bounded batch a transaction so that delivery goes on meanwhile.
//! Its pending messages are cancelled and erased; its ended ones erased; the audit trail
//! and the kinds' pauses rewritten; its suppression list entries kept as they are (an
//! address that opted out must stay opted out), or moved to its mark, which the claim
//! honours. docs/src/payloads.md says what is kept, and why.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::admin::{Operator, audit};
use super::statement::Sql;
use super::statements::{Bound, Store};
use crate::suppression::Address;

/// The audit trail's action for an erasure.
pub(crate) const AUDIT_ERASE: &str = "erase";
/// Pending rows walked, and ended messages erased, per statement.
const BATCH: i64 = 500;
/// Audit entries walked per statement.
const AUDIT_BATCH: i64 = 10_000;
/// The longest a batch waits for a row an application's transaction holds, or runs (so the
/// longest it holds its own row locks): past either it is tried again, smaller.
const LOCK_WAIT: Duration = Duration::from_secs(1);
const STATEMENT_WITHIN: Duration = Duration::from_secs(1);

/// What to do with the address's suppression list entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SuppressionChoice {
    /// As they are: the address stays opted out (the default).
    Keep,
    /// Moved to the address's mark, which the claim still honours.
    Mark,
}

/// What an erasure changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Erased {
    /// The mark that now stands for the address.
    pub mark: String,
    /// Pending messages cancelled (never to be sent).
    pub pending_cancelled: i64,
    /// Messages a replica was sending: cancelled unless the send succeeds; run the erasure
    /// again once they end (within the lease) to erase them too.
    pub in_flight: i64,
    /// Ended messages erased.
    pub messages_erased: i64,
    /// Audit entries and pauses that named the address.
    pub audit_entries: i64,
    /// Suppression list entries moved to the mark (0 when kept).
    pub suppressions_marked: i64,
    /// The longest of its transactions, from BEGIN to COMMIT: the longest any row lock of
    /// it was held, in milliseconds.
    pub longest_transaction_ms: u64,
}

#[derive(FromRow)]
struct PendingWalk {
    last_due: Option<DateTime<Utc>>,
    last_id: Option<i64>,
    walked: i64,
    cancelled: i64,
    in_flight: i64,
}

/// The text the erasure looks for: the key as a whole address (not the tail of a longer
/// local part, nor the head of a longer domain), every ASCII character of it that is not a
/// letter or a digit escaped, as PostgreSQL's regular expressions take it.
fn pattern(key: &str) -> String {
    let mut escaped = String::from(r"(?<![[:alnum:]._%+-])");
    for c in key.chars() {
        if c.is_ascii() && !c.is_ascii_alphanumeric() {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped.push_str(r"(?![[:alnum:]-])(?!\.[[:alnum:]])");
    escaped
}

/// Erases `address` for `actor`, audited under its mark (never the address): once before
/// it changes anything, so that an erasure stopped part-way is on the record, and once with
/// what it changed. Each form the address may be written in (its domain in ASCII and in
/// Unicode) is erased under the one mark.
pub async fn erase(
    store: &Store,
    address: &Address,
    suppressions: SuppressionChoice,
    actor: &Operator,
) -> Result<Erased, sqlx::Error> {
    let mark: String = store
        .scalar(store.query_scalar(Sql::ErasureMark).bind(address.as_str()))
        .await?;
    let mut erased = Erased {
        mark: mark.clone(),
        ..Erased::default()
    };
    record(store, actor, &erased, "started").await?;
    for form in forms(address) {
        let pattern = pattern(&form);
        let shared = (form.as_str(), mark.as_str(), pattern.as_str());
        erase_pending(store, shared, actor, &mut erased).await?;
        erase_ended(store, shared, &mut erased).await?;
        erased.audit_entries += erase_audit(store, shared, &mut erased).await?;
        if suppressions == SuppressionChoice::Mark {
            erased.suppressions_marked +=
                bounded_scalar(store, Sql::MarkSuppressions, shared, &mut erased, |q| q).await?;
        }
    }
    record(store, actor, &erased, "done").await?;
    Ok(erased)
}

/// The forms an address is written in: its key (the domain in ASCII, as IDNA gives it)
/// and, for an internationalized domain, the Unicode one.
fn forms(address: &Address) -> Vec<String> {
    let key = address.as_str().to_owned();
    let unicode = key.rsplit_once('@').map(|(local, domain)| {
        let (domain, _) = idna::domain_to_unicode(domain);
        format!("{local}@{}", domain.to_ascii_lowercase())
    });
    match unicode {
        Some(unicode) if unicode != key => vec![key, unicode],
        _ => vec![key],
    }
}

/// The erasure's audit entry: `started`, then `done` with its counts.
async fn record(
    store: &Store,
    actor: &Operator,
    erased: &Erased,
    stage: &str,
) -> Result<(), sqlx::Error> {
    let detail = format!(
        "{stage}: {} pending cancelled, {} in flight, {} ended erased, {} audit entries, suppression {}",
        erased.pending_cancelled,
        erased.in_flight,
        erased.messages_erased,
        erased.audit_entries,
        if erased.suppressions_marked > 0 { "marked" } else { "kept" }
    );
    let rows = usize::try_from(erased.pending_cancelled + erased.messages_erased).unwrap_or(usize::MAX);
    let mut tx = store.pool().begin().await?;
    audit(store, &mut tx, actor, AUDIT_ERASE, &erased.mark, rows, Some(&detail)).await?;
    tx.commit().await
}

/// Whether a batch gave up on its bounds (a lock it waited for, or its own time): it is
/// tried again, smaller.
fn over_its_bounds(error: &sqlx::Error) -> bool {
    let code = error.as_database_error().and_then(|e| e.code());
    matches!(code.as_deref(), Some("57014" | "55P03"))
}

/// The next smaller batch after one over its bounds, or the error when it was one row.
fn smaller(batch: i64, error: sqlx::Error) -> Result<i64, sqlx::Error> {
    if batch > 1 && over_its_bounds(&error) {
        Ok(batch / 2)
    } else {
        Err(error)
    }
}

/// Erases the ended messages to the address, a batch a transaction; a batch over its
/// bounds is tried again at half its size.
async fn erase_ended(
    store: &Store,
    shared: Shared<'_>,
    erased: &mut Erased,
) -> Result<(), sqlx::Error> {
    let mut batch = BATCH;
    loop {
        match bounded_scalar(store, Sql::EraseEnded, shared, erased, |q| q.bind(batch)).await {
            Ok(changed) => {
                erased.messages_erased += changed;
                if changed < batch {
                    return Ok(());
                }
            }
            Err(e) => batch = smaller(batch, e)?,
        }
    }
}

type Shared<'a> = (&'a str, &'a str, &'a str);
type Scalar<'q> = sqlx::query::QueryScalar<'q, sqlx::Postgres, i64, sqlx::postgres::PgArguments>;

/// One statement taking the shared parameters ($1 key, $2 mark, $3 pattern) and more, in a
/// transaction of its own whose waits are bounded.
async fn bounded_scalar<'q>(
    store: &Store,
    sql: Sql,
    (key, mark, pattern): Shared<'q>,
    erased: &mut Erased,
    more: impl FnOnce(Scalar<'q>) -> Scalar<'q>,
) -> Result<i64, sqlx::Error> {
    let began = Instant::now();
    let mut tx = bounded(store).await?;
    let query = store.query_scalar(sql).bind(key).bind(mark).bind(pattern);
    let value = more(query).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    erased.took(began);
    Ok(value)
}

impl Erased {
    /// Keeps the longest transaction's time.
    fn took(&mut self, began: Instant) {
        let ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.longest_transaction_ms = self.longest_transaction_ms.max(ms);
    }
}

async fn bounded(store: &Store) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    store
        .begin_bounded_many(&[Bound::Lock(LOCK_WAIT), Bound::Statement(STATEMENT_WITHIN)])
        .await
}

/// Cancels and erases the pending messages to the address, walking the due index once; a
/// batch over its bounds is tried again at half its size.
async fn erase_pending(
    store: &Store,
    (key, mark, pattern): Shared<'_>,
    actor: &Operator,
    erased: &mut Erased,
) -> Result<(), sqlx::Error> {
    let mut after: (Option<DateTime<Utc>>, Option<i64>) = (None, None);
    let mut batch = BATCH;
    loop {
        let began = Instant::now();
        let mut tx = bounded(store).await?;
        let walked: Result<PendingWalk, sqlx::Error> = store
            .query_as(Sql::ErasePending)
            .bind(key)
            .bind(mark)
            .bind(pattern)
            .bind(batch)
            .bind(after.0)
            .bind(after.1)
            .bind(actor.name.as_str())
            .fetch_one(&mut *tx)
            .await;
        let walk = match walked {
            Ok(walk) => walk,
            Err(e) => {
                batch = smaller(batch, e)?;
                continue;
            }
        };
        tx.commit().await?;
        erased.took(began);
        erased.pending_cancelled += walk.cancelled;
        erased.in_flight += walk.in_flight;
        if walk.walked < batch {
            return Ok(());
        }
        after = (walk.last_due, walk.last_id);
    }
}

/// Marks the address in the audit trail, a range of ids at a time, and in the pauses.
async fn erase_audit(
    store: &Store,
    shared: Shared<'_>,
    erased: &mut Erased,
) -> Result<i64, sqlx::Error> {
    let (first, last): (i64, i64) = store.one(store.query_as(Sql::AuditIds)).await?;
    let mut changed = 0;
    let mut from = first;
    while from <= last {
        let to = from.saturating_add(AUDIT_BATCH - 1);
        let rows = bounded_execute(store, Sql::EraseAudit, shared, Some((from, to)), erased).await?;
        changed += rows;
        from = to.saturating_add(1);
    }
    changed += bounded_execute(store, Sql::ErasePauses, shared, None, erased).await?;
    Ok(changed)
}

async fn bounded_execute(
    store: &Store,
    sql: Sql,
    (key, mark, pattern): Shared<'_>,
    range: Option<(i64, i64)>,
    erased: &mut Erased,
) -> Result<i64, sqlx::Error> {
    let began = Instant::now();
    let mut tx = bounded(store).await?;
    let query = store.query(sql).bind(key).bind(mark).bind(pattern);
    let query = match range {
        Some((from, to)) => query.bind(from).bind(to),
        None => query,
    };
    let done = query.execute(&mut *tx).await?;
    tx.commit().await?;
    erased.took(began);
    Ok(i64::try_from(done.rows_affected()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::{forms, pattern};
    use crate::suppression::Address;

    #[test]
    fn an_internationalized_address_is_erased_in_both_its_forms() {
        let address = Address::parse("Ada@Bücher.example").unwrap();
        assert_eq!(forms(&address), ["ada@xn--bcher-kva.example", "ada@bücher.example"]);
        let plain = Address::parse("ada@example.com").unwrap();
        assert_eq!(forms(&plain), ["ada@example.com"]);
    }

    #[test]
    fn the_pattern_escapes_punctuation_and_keeps_letters() {
        let around = |inner: &str| format!(r"(?<![[:alnum:]._%+-]){inner}(?![[:alnum:]-])(?!\.[[:alnum:]])");
        assert_eq!(pattern("a.b+c@ex-ample.com"), around(r"a\.b\+c\@ex\-ample\.com"));
        assert_eq!(pattern("jörg@example.com"), around(r"jörg\@example\.com"));
    }
}
