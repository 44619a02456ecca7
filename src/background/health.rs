//! Liveness and readiness, as the probes and the `outbox_ready` gauge report them.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store::{self, SchemaError};
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// How long a readiness check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One readiness check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub result: Result<(), String>,
}

/// What the probes read: the dispatch loop's heartbeat, the database, the shutdown flag.
pub struct Health {
    pool: PgPool,
    metrics: Arc<Metrics>,
    stopping: CancellationToken,
    liveness_bound: Duration,
}

impl Health {
    pub fn new(
        pool: PgPool,
        metrics: Arc<Metrics>,
        stopping: CancellationToken,
        liveness_bound: Duration,
    ) -> Self {
        Self {
            pool,
            metrics,
            stopping,
            liveness_bound,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
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

    /// Database reachable, schema migrated, not shutting down. Also sets `outbox_ready`.
    pub async fn readiness(&self) -> Vec<Check> {
        // One query answers both: whether the database is there, and the schema migrated.
        let (database, schema) =
            match tokio::time::timeout(CHECK_TIMEOUT, store::check_schema(&self.pool)).await {
                Ok(Ok(())) => (Ok(()), Ok(())),
                Ok(Err(SchemaError::Database(e))) => (
                    Err(format!("database unreachable: {e}")),
                    Err("not checked: database unreachable".to_owned()),
                ),
                Ok(Err(e)) => (Ok(()), Err(e.to_string())),
                Err(_) => (
                    Err(format!(
                        "database did not answer within {}s",
                        CHECK_TIMEOUT.as_secs()
                    )),
                    Err("not checked: database unreachable".to_owned()),
                ),
            };
        if database.is_err() {
            self.metrics.database_error(DatabaseOperation::Readiness);
        }
        let shutdown = if self.stopping.is_cancelled() {
            Err("shutting down".to_owned())
        } else {
            Ok(())
        };
        let checks = vec![
            Check {
                name: "database",
                result: database,
            },
            Check {
                name: "schema",
                result: schema,
            },
            Check {
                name: "shutdown",
                result: shutdown,
            },
        ];
        self.metrics.ready(checks.iter().all(|c| c.result.is_ok()));
        checks
    }
}
