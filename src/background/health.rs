//! Liveness and readiness, as the probes and the `outbox_ready` gauge report them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::Store;
use tokio_util::sync::CancellationToken;

use crate::store::{self, Rights, SchemaError};
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// How long a readiness check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the database's answer to readiness is reused.
pub const DATABASE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// One readiness check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub result: Result<(), String>,
}

/// What the probes read: the dispatch loop's heartbeat, the database, the shutdown flag.
pub struct Health {
    pool: Store,
    /// What readiness checks the role may do.
    rights: Rights,
    metrics: Arc<Metrics>,
    stopping: CancellationToken,
    liveness_bound: Duration,
    /// The last answer of the database checks, and when it came.
    last_database_check: tokio::sync::Mutex<Option<(Instant, Vec<Check>)>>,
}

impl Health {
    pub fn new(
        pool: Store,
        rights: Rights,
        metrics: Arc<Metrics>,
        stopping: CancellationToken,
        liveness_bound: Duration,
    ) -> Self {
        Self {
            pool,
            rights,
            metrics,
            stopping,
            liveness_bound,
            last_database_check: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether the dispatch loop is making progress. Never looks at the database: an
    /// outage there must not make Kubernetes restart every replica.
    pub fn liveness(&self) -> Result<(), String> {
        let since = self.metrics.since_last_cycle();
        if since > self.liveness_bound {
            Err(format!(
                "dispatch loop has made no progress for {}s (bound {}s)",
                since.as_secs(),
                self.liveness_bound.as_secs()
            ))
        } else {
            Ok(())
        }
    }

    /// Database reachable, schema migrated, table writable, not shutting down. Also sets
    /// `outbox_ready`. The database is asked at most once per [`DATABASE_CHECK_EVERY`],
    /// however often this is called: an unauthenticated `/readyz` flood must not take
    /// the database's time. Shutdown is always current.
    pub async fn readiness(&self) -> Vec<Check> {
        let mut checks = self.database_checks().await;
        checks.push(Check {
            name: "shutdown",
            result: if self.stopping.is_cancelled() {
                Err("shutting down".to_owned())
            } else {
                Ok(())
            },
        });
        self.metrics.ready(checks.iter().all(|c| c.result.is_ok()));
        checks
    }

    async fn database_checks(&self) -> Vec<Check> {
        let mut last = self.last_database_check.lock().await;
        if let Some((at, checks)) = last.as_ref()
            && at.elapsed() < DATABASE_CHECK_EVERY
        {
            return checks.clone();
        }
        let checks = self.ask_database().await;
        *last = Some((Instant::now(), checks.clone()));
        checks
    }

    async fn ask_database(&self) -> Vec<Check> {
        let unchecked = || Err("not checked: database unreachable".to_owned());
        let (database, schema, writable) =
            match tokio::time::timeout(CHECK_TIMEOUT, store::check_ready(&self.pool, self.rights))
                .await
            {
                Ok(Ok(())) => (Ok(()), Ok(()), Ok(())),
                Ok(Err(SchemaError::Database(e))) => (
                    Err(format!("database unreachable: {e}")),
                    unchecked(),
                    unchecked(),
                ),
                Ok(Err(SchemaError::NotWritable(reason))) => (Ok(()), Ok(()), Err(reason)),
                Ok(Err(e)) => (
                    Ok(()),
                    Err(e.to_string()),
                    Err("not checked: schema".to_owned()),
                ),
                Err(_) => (
                    Err(format!(
                        "database did not answer within {}s",
                        CHECK_TIMEOUT.as_secs()
                    )),
                    unchecked(),
                    unchecked(),
                ),
            };
        if database.is_err() {
            self.metrics.database_error(DatabaseOperation::Readiness);
        }
        vec![
            Check {
                name: "database",
                result: database,
            },
            Check {
                name: "schema",
                result: schema,
            },
            Check {
                name: "writable",
                result: writable,
            },
        ]
    }
}
