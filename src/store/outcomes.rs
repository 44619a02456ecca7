//! Writing outcomes: one statement for a claim's outcomes, guarded by its token, that
//! waits only a moment on a row another transaction has locked.

use super::statements::query_as;
use sqlx::{Connection as _, PgConnection, PgPool};
use uuid::Uuid;

use super::NOTIFY_CHANNEL;
use crate::message::actions::{
    action_dead, action_expired, action_logged_only, action_release, action_retry, action_sent,
    action_suppressed, class_throttled,
};
use crate::message::actor::automatic_actor;
use crate::message::{Outcome, truncate_error};
use crate::suppression::marks::mark_hard_bounce;
use crate::suppression::words::{reason_hard_bounce, source_smtp};

/// The statement that writes outcomes where the claim token still holds, returning
/// `(id, written)` rows; given `WITH` clauses before the update (ending in a comma), what
/// the outcomes `o` are joined to (ending in `JOIN`) and on what, further conditions, and
/// rows to return besides those written.
///
/// A release makes its row due now, which may be below another dispatcher's claim floor
/// (its claim began before this commit): the same statement tells them, as the insert
/// trigger does for new rows. A recipient the server said does not exist is suppressed by
/// the same statement, so the list and the outcome cannot disagree. Every outcome but a
/// send is also an event of its message's timeline (`outbox_message_events`), and a send
/// keeps the relay's reply, the replica (`$12`) and how long it took on its row: no round
/// trip of their own. `attempts` stops at
/// the integer's end: a producer may write any count, and an overflow would fail the
/// outcomes of the whole batch, again at every try. `throttled_releases` counts from zero: a
/// negative count written by a producer would buy its row that many more releases without
/// an attempt.
///
/// A row lock held by another transaction is waited for one second at most in the usual
/// statement (`lock_timeout`, set for the statement's transaction before its first row):
/// an application's `UPDATE` or `SELECT ... FOR UPDATE` left open on one row used to hold
/// every other outcome of the statement unwritten, and the dispatcher with it, until those
/// rows' leases ran out and another replica sent them again.
///
/// The outcomes are limited to as many as there are, which changes nothing but the plan
/// PostgreSQL keeps: it plans a prepared statement for its first five executions, then
/// keeps a generic plan only if that costs less than those did. Not knowing the arrays'
/// length, the generic plan counted ten outcomes, ten lookups by the primary key, and lost
/// to the plans of one to four outcomes on any table of more than a few hundred rows: every
/// write of steady traffic was planned again, 0.2 ms of the 0.5 that writing one outcome
/// costs PostgreSQL. A `LIMIT` it cannot read when planning (the length of `$2`) makes it
/// count a tenth.
macro_rules! record_outcomes_sql {
    ($with:literal, $join:literal, $on:literal, $also:literal, $besides:literal) => {
        concat!(
            "WITH ",
            $with,
            " updated AS ( \
         UPDATE outbox_messages AS m \
         SET attempts = m.attempts + CASE WHEN o.action IN ('", action_retry!(), "', '", action_dead!(), "') \
                                          AND m.attempts < 2147483647 THEN 1 ELSE 0 END, \
             throttled_releases = greatest(m.throttled_releases, 0) \
                 + CASE WHEN o.action = '", action_release!(), "' AND o.error_class = '", class_throttled!(), "' THEN 1 ELSE 0 END, \
             last_error = coalesce(o.error, m.last_error), \
             error_class = coalesce(o.error_class, m.error_class), \
             dispatched_at = CASE WHEN o.action = '", action_sent!(), "' THEN now() END, \
             dead_lettered_at = CASE WHEN o.action IN ('", action_dead!(), "', '", action_expired!(), "', '", action_suppressed!(), "', '", action_logged_only!(), "') THEN now() END, \
             discarded_at = CASE WHEN o.action IN ('", action_expired!(), "', '", action_suppressed!(), "', '", action_logged_only!(), "') THEN now() \
                                 ELSE m.discarded_at END, \
             discarded_by = CASE WHEN o.action IN ('", action_expired!(), "', '", action_suppressed!(), "', '", action_logged_only!(), "') THEN '", automatic_actor!(), "' \
                                 ELSE m.discarded_by END, \
             end_reason = CASE WHEN o.action IN ('", action_expired!(), "', '", action_suppressed!(), "', '", action_logged_only!(), "') THEN o.action \
                               ELSE m.end_reason END, \
             feedback = CASE WHEN o.bounced IS NOT NULL THEN '", mark_hard_bounce!(), "' ELSE m.feedback END, \
             feedback_at = CASE WHEN o.bounced IS NOT NULL THEN now() ELSE m.feedback_at END, \
             smtp_reply = CASE WHEN o.action = '", action_sent!(), "' THEN o.reply ELSE m.smtp_reply END, \
             sent_by = CASE WHEN o.action = '", action_sent!(), "' THEN $12 ELSE m.sent_by END, \
             send_ms = CASE WHEN o.action = '", action_sent!(), "' THEN o.took_ms ELSE m.send_ms END, \
             next_attempt_at = CASE WHEN o.action IN ('", action_retry!(), "', '", action_release!(), "') \
                                    THEN now() + make_interval(secs => o.delay_secs) \
                                    ELSE m.next_attempt_at END, \
             locked_until = NULL, locked_by = NULL, claim_token = NULL \
         FROM ",
            $join,
            " (SELECT * FROM unnest($2::bigint[], $3::text[], $4::text[], $5::float8[], $6::text[], \
                     $8::text[], $9::bool[], $10::text[], $11::int4[]) \
                 AS u(id, action, error, delay_secs, error_class, bounced, suppress, reply, took_ms) \
               LIMIT cardinality($2::bigint[])) AS o ",
            $on,
            " WHERE m.id = o.id AND m.claim_token = $1 ",
            $also,
            " RETURNING m.id, o.action, o.bounced, o.suppress, o.error, o.error_class, o.took_ms \
         ), events AS ( \
             INSERT INTO outbox_message_events \
                 (message_id, event, actor, error_class, detail, duration_ms) \
             SELECT id, action, $12, error_class, error, took_ms FROM updated \
             WHERE action <> '", action_sent!(), "' \
         ), notified AS ( \
             SELECT pg_notify($7, floor(extract(epoch FROM now()) * 1000)::bigint::text) \
             FROM updated WHERE action = '", action_release!(), "' LIMIT 1 \
         ), suppressed AS ( \
             INSERT INTO outbox_suppressions (address, reason, source, detail, message_id) \
             SELECT DISTINCT ON (bounced) bounced, '", reason_hard_bounce!(), "', '", source_smtp!(), "', \
                    left(error, 1000), id \
             FROM updated WHERE bounced IS NOT NULL AND suppress \
             ON CONFLICT (address) DO UPDATE SET \
                 reason = excluded.reason, source = excluded.source, detail = excluded.detail, \
                 message_id = excluded.message_id, created_at = now(), created_by = NULL, \
                 suppressed_until = NULL \
             WHERE ",
            replaced_for_good!(),
            " ) \
         SELECT id, true FROM updated WHERE (SELECT count(*) FROM notified) >= 0 ",
            $besides
        )
    };
}

/// Outcomes as they come: a row lock is rare, so the statement waits a moment for one
/// rather than lock every row first. When it did not time out, no row was locked, and
/// those it did not write are no longer this claim's.
const RECORD_OUTCOMES: &str = record_outcomes_sql!(
    "",
    "",
    "",
    "AND (SELECT set_config('lock_timeout', '1s', true)) IS NOT NULL",
    ""
);

/// Outcomes where a row lock was met: each row is locked first, skipping those another
/// transaction holds (in the mode an `UPDATE` that keeps the key takes, so that a foreign
/// key's `KEY SHARE` does not count), which it returns as not written. Locking every row
/// costs PostgreSQL about an eighth more in a drain, so it is not the usual statement. No
/// `lock_timeout`: a lock on a suppression row the statement updates is waited out, as any
/// other lock on a table outboxd writes to.
const RECORD_OUTCOMES_SKIPPING_LOCKED: &str = record_outcomes_sql!(
    "mine AS MATERIALIZED ( \
         SELECT id FROM outbox_messages WHERE id = ANY($2) AND claim_token = $1 \
         FOR NO KEY UPDATE SKIP LOCKED),",
    "mine JOIN",
    "ON o.id = mine.id",
    "",
    "UNION ALL \
     SELECT id, false FROM outbox_messages \
     WHERE id = ANY($2) AND claim_token = $1 AND id NOT IN (SELECT id FROM mine)"
);

/// Outcomes whose rows were locked, written by a connection that waits for the locks as
/// long as they last: the moment a lock goes, the row is this write's, before another
/// replica's claim (which skips locked rows) can take it once its lease has run out.
const RECORD_OUTCOMES_WAITING: &str = record_outcomes_sql!("", "", "", "", "");

/// One outcome to record, and the recipient a server said does not exist, if any.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeRow<'a> {
    pub id: i64,
    pub outcome: &'a Outcome,
    /// How long the send took, when one was made.
    pub took: Option<std::time::Duration>,
    /// Marked on the row as a hard bounce, and, with `suppress`, added to the suppression
    /// list in the same statement.
    pub bounced: Option<&'a str>,
    pub suppress: bool,
}

/// What writing a claim's outcomes came to. An outcome in neither list was not written
/// because the row is no longer this claim's: another claimer took it over after the lease
/// ran out, and its outcome is that claimer's to record.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub written: Vec<i64>,
    /// Rows this claim still holds that another transaction has locked: not written, to be
    /// written again once the lock is gone.
    pub locked: Vec<i64>,
}

/// How an outcome write treats rows another transaction has locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLocks {
    /// Wait a moment for a lock, then write again skipping the locked rows: the usual case.
    WaitBriefly,
    /// Skip locked rows at once: for outcomes whose rows were locked at the last try.
    Skip,
    /// Wait for locks as long as they last, on a connection of its own
    /// ([`record_outcomes_when_unlocked`]).
    Wait,
}

/// Records a claim's outcomes, only for rows this claim still holds and no other
/// transaction has locked, in one round trip unless a row lock is met. Runs outside a
/// transaction: inside one, the `lock_timeout` would stay set and a timeout abort it.
pub async fn record_outcomes(
    connection: &mut PgConnection,
    token: Uuid,
    worker: &str,
    outcomes: &[OutcomeRow<'_>],
    locks: RowLocks,
) -> Result<Recorded, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(Recorded::default());
    }
    let columns = Columns::of(worker, outcomes);
    let rows = match columns.write(connection, token, locks).await {
        // The statement wrote nothing: the same outcomes again, skipping locked rows.
        Err(sqlx::Error::Database(e))
            if locks == RowLocks::WaitBriefly
                && e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
        {
            columns.write(connection, token, RowLocks::Skip).await?
        }
        rows => rows?,
    };
    let (written, locked): (Vec<_>, Vec<_>) = rows.into_iter().partition(|&(_, written)| written);
    Ok(Recorded {
        written: written.into_iter().map(|(id, _)| id).collect(),
        locked: locked.into_iter().map(|(id, _)| id).collect(),
    })
}

/// Records outcomes whose rows another transaction has locked, on a connection of its own
/// that waits for the locks however long they last, so that the write takes each row the
/// moment its lock goes. What it returns owns everything, to run as a task of its own.
pub fn record_outcomes_when_unlocked(
    pool: &PgPool,
    token: Uuid,
    worker: &str,
    outcomes: &[OutcomeRow<'_>],
) -> impl Future<Output = Result<Recorded, sqlx::Error>> + Send + 'static {
    let columns = Columns::of(worker, outcomes);
    let options = pool.connect_options();
    async move {
        let mut connection = PgConnection::connect_with(&options).await?;
        // In a transaction, so that a transaction pooler keeps the statement's parse and
        // execution on one server session (no lock timeout is set: none can abort it).
        let mut transaction = connection.begin().await?;
        let written = columns
            .write(&mut transaction, token, RowLocks::Wait)
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        transaction.commit().await?;
        connection.close().await?;
        Ok(Recorded {
            written,
            locked: Vec::new(),
        })
    }
}

/// The outcomes as the statement's arrays, one element per row.
struct Columns {
    ids: Vec<i64>,
    actions: Vec<&'static str>,
    errors: Vec<Option<String>>,
    delays: Vec<f64>,
    error_classes: Vec<Option<String>>,
    bounced: Vec<Option<String>>,
    suppress: Vec<bool>,
    replies: Vec<Option<String>>,
    took_ms: Vec<Option<i32>>,
    worker: String,
}

impl Columns {
    fn of(worker: &str, outcomes: &[OutcomeRow<'_>]) -> Self {
        let took_ms = |took: std::time::Duration| i32::try_from(took.as_millis()).ok();
        Self {
            ids: outcomes.iter().map(|row| row.id).collect(),
            actions: outcomes.iter().map(|row| row.outcome.action()).collect(),
            errors: outcomes
                .iter()
                .map(|row| row.outcome.error().map(truncate_error))
                .collect(),
            delays: outcomes
                .iter()
                .map(|row| row.outcome.delay().as_secs_f64())
                .collect(),
            error_classes: outcomes
                .iter()
                .map(|row| row.outcome.error_class().map(str::to_owned))
                .collect(),
            bounced: outcomes
                .iter()
                .map(|row| row.bounced.map(str::to_owned))
                .collect(),
            suppress: outcomes.iter().map(|row| row.suppress).collect(),
            replies: outcomes
                .iter()
                .map(|row| match row.outcome {
                    Outcome::Sent { reply, .. } => reply.clone(),
                    _ => None,
                })
                .collect(),
            took_ms: outcomes
                .iter()
                .map(|row| row.took.and_then(took_ms))
                .collect(),
            worker: worker.to_owned(),
        }
    }

    /// Each row written (`true`), or still this claim's but locked (`false`).
    async fn write(
        &self,
        connection: &mut PgConnection,
        token: Uuid,
        locks: RowLocks,
    ) -> Result<Vec<(i64, bool)>, sqlx::Error> {
        let statement = match locks {
            RowLocks::WaitBriefly => RECORD_OUTCOMES,
            RowLocks::Skip => RECORD_OUTCOMES_SKIPPING_LOCKED,
            RowLocks::Wait => RECORD_OUTCOMES_WAITING,
        };
        query_as(statement)
            .bind(token)
            .bind(&self.ids)
            .bind(&self.actions)
            .bind(&self.errors)
            .bind(&self.delays)
            .bind(&self.error_classes)
            .bind(NOTIFY_CHANNEL)
            .bind(&self.bounced)
            .bind(&self.suppress)
            .bind(&self.replies)
            .bind(&self.took_ms)
            .bind(&self.worker)
            .fetch_all(connection)
            .await
    }
}

/// SQLSTATE `lock_not_available`: the `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
