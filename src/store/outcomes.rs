//! Writing outcomes: one statement for a claim's outcomes, guarded by its token, that
//! waits only a moment on a row another transaction has locked (`sql/outcomes.sql`).

use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use super::NOTIFY_CHANNEL;
use super::statement::Sql;
use super::statements::Store;
use crate::message::{Outcome, truncate_error};

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
/// transaction: inside one, the `lock_timeout` would stay set and a timeout abort it. The
/// caller ([`super::KeptConnection::record_outcomes`]) sends no empty write.
pub async fn record_outcomes(
    store: &Store,
    connection: &mut PgConnection,
    token: Uuid,
    worker: &str,
    outcomes: &[OutcomeRow<'_>],
    locks: RowLocks,
) -> Result<Recorded, sqlx::Error> {
    let columns = Columns::of(worker, outcomes);
    let rows = match columns.write(store, connection, token, locks).await {
        // The statement wrote nothing: the same outcomes again, skipping locked rows.
        Err(sqlx::Error::Database(e))
            if locks == RowLocks::WaitBriefly
                && e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
        {
            columns
                .write(store, connection, token, RowLocks::Skip)
                .await?
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
    store: &Store,
    token: Uuid,
    worker: &str,
    outcomes: &[OutcomeRow<'_>],
) -> impl Future<Output = Result<Recorded, sqlx::Error>> + Send + 'static {
    let columns = Columns::of(worker, outcomes);
    let options = store.pool().connect_options();
    let store = store.clone();
    async move {
        let mut connection = PgConnection::connect_with(&options).await?;
        // In a transaction, so that a transaction pooler keeps the statement's parse and
        // execution on one server session (no lock timeout is set: none can abort it).
        let mut transaction = connection.begin().await?;
        let written = columns
            .write(&store, &mut transaction, token, RowLocks::Wait)
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
    relays: Vec<Option<String>>,
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
            relays: outcomes
                .iter()
                .map(|row| match row.outcome {
                    Outcome::Sent { relay, .. } => relay.clone(),
                    _ => None,
                })
                .collect(),
            worker: worker.to_owned(),
        }
    }

    /// Each row written (`true`), or still this claim's but locked (`false`).
    async fn write(
        &self,
        store: &Store,
        connection: &mut PgConnection,
        token: Uuid,
        locks: RowLocks,
    ) -> Result<Vec<(i64, bool)>, sqlx::Error> {
        let statement = match locks {
            RowLocks::WaitBriefly => Sql::RecordOutcomes,
            RowLocks::Skip => Sql::RecordOutcomesSkippingLocked,
            RowLocks::Wait => Sql::RecordOutcomesWaiting,
        };
        store
            .query_as(statement)
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
            .bind(&self.relays)
            .fetch_all(connection)
            .await
    }
}

/// SQLSTATE `lock_not_available`: the `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
