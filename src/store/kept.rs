//! The dispatcher's statements on one connection kept out of the pool between them.
//!
//! sqlx checks every connection given back to its pool with a round trip, in a task of
//! its own (`PoolConnection`'s drop pings it). Under steady traffic each message pays a
//! claim, a suppression lookup and an outcome write, so those checks would add three
//! round trips and three wake-ups to every message (BENCHMARKS.md, *Steady traffic*).
//! Keeping one connection skips them; a statement that fails drops it, and it is
//! renewed every few minutes, so the pool's own upkeep (lifetime, reconnects) still
//! applies. Statements that overlap (a drain claims while it records) take others from
//! the pool as before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use uuid::Uuid;

use super::statements::Store;
use super::suppressions::suppressed_among;
use super::{ClaimRequest, Claimed, OutcomeRow, Recorded, RowLocks, claim, record_outcomes};
use crate::lock::lock;
use crate::suppression::Listing;

/// How long one connection is kept before it goes back to the pool.
const KEEP_FOR: Duration = Duration::from_secs(300);

/// A store, and one of its pool's connections kept between the dispatcher's statements.
pub struct KeptConnection {
    store: Store,
    kept: Mutex<Option<Kept>>,
}

struct Kept {
    connection: PoolConnection<Postgres>,
    since: Instant,
}

impl KeptConnection {
    /// Nothing is kept until the first statement.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            kept: Mutex::new(None),
        }
    }

    /// The store, for statements that do not need the kept connection.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// See [`claim`].
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claimed, sqlx::Error> {
        self.on_connection(async |connection| claim(&self.store, connection, request).await)
            .await
    }

    /// See [`suppressed_among`].
    pub async fn suppressed_among(
        &self,
        addresses: &[String],
    ) -> Result<Vec<(String, Listing)>, sqlx::Error> {
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        self.on_connection(async |connection| {
            suppressed_among(&self.store, connection, addresses).await
        })
        .await
    }

    /// See [`record_outcomes`].
    pub async fn record_outcomes(
        &self,
        token: Uuid,
        worker: &str,
        outcomes: &[OutcomeRow<'_>],
        locks: RowLocks,
    ) -> Result<Recorded, sqlx::Error> {
        if outcomes.is_empty() {
            return Ok(Recorded::default());
        }
        // Past a transaction pooler the statement runs in a transaction of its own, which a
        // lock timeout would abort: locked rows are skipped at once, and left to the write
        // that waits for their locks.
        let locks = match (!self.store.prepared(), locks) {
            (true, RowLocks::WaitBriefly) => RowLocks::Skip,
            (_, locks) => locks,
        };
        self.on_connection(async |connection| {
            record_outcomes(&self.store, connection, token, worker, outcomes, locks).await
        })
        .await
    }

    /// Runs one statement on the kept connection (or one from the pool), and keeps the
    /// connection if the statement worked; after an error it is dropped.
    /// Past a transaction pooler, in a transaction of its own (`Store::on_its_own`).
    async fn on_connection<T>(
        &self,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        let mut kept = self.take().await?;
        let result = self
            .store
            .on_its_own(&mut kept.connection, statement)
            .await?;
        self.give_back(kept);
        Ok(result)
    }

    /// Gives the kept connection back to the pool, which cannot close while one is out.
    pub fn release(&self) {
        let kept = lock(&self.kept).take();
        drop(kept);
    }

    /// The kept connection if it is free and young enough, else one from the pool.
    async fn take(&self) -> Result<Kept, sqlx::Error> {
        let free = lock(&self.kept).take();
        if let Some(kept) = free.filter(|kept| kept.since.elapsed() < KEEP_FOR) {
            return Ok(kept);
        }
        Ok(Kept {
            connection: self.store.pool().acquire().await?,
            since: Instant::now(),
        })
    }

    /// Keeps the connection after a statement that worked, unless another is kept already;
    /// otherwise it goes back to the pool, which checks it.
    /// Not kept when the pool has no other connection to give: others would wait for it (a
    /// small pool under a connection budget).
    fn give_back(&self, kept: Kept) {
        let pool = self.store.pool();
        let max = pool.options().get_max_connections();
        let others_can_connect = pool.num_idle() > 0 || pool.size() < max;
        let mut slot = lock(&self.kept);
        if slot.is_none() && others_can_connect {
            *slot = Some(kept);
        }
    }
}
