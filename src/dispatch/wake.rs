//! What ends the dispatcher's wait between drains: a notification from the insert trigger
//! (LISTEN/NOTIFY), the poll interval, or the end of a back-off; and shutdown, always.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::message::RetryPolicy;
use crate::store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// How quickly the dispatcher comes back after the SMTP server or the database failed.
pub(super) const OUTAGE_BACKOFF: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    base: Duration::from_secs(1),
    max: Duration::from_secs(60),
};

/// The dedicated LISTEN connection, reconnected whenever it is lost.
pub(super) struct Wakeups {
    pool: PgPool,
    metrics: Arc<Metrics>,
    listener: Option<PgListener>,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// Something may be due: look.
    Look,
    /// Shutting down.
    Stopped,
}

impl Wakeups {
    pub fn new(pool: PgPool, metrics: Arc<Metrics>) -> Self {
        Self {
            pool,
            metrics,
            listener: None,
        }
    }

    /// Listens, if not listening yet. Call before looking for due rows, so that nothing
    /// committed meanwhile goes unnoticed; when it fails, the poll interval stands in.
    pub async fn listen(&mut self) {
        if self.listener.is_some() {
            return;
        }
        match store::listen(&self.pool).await {
            Ok(listener) => self.listener = Some(listener),
            Err(e) => {
                self.metrics.database_error(DatabaseOperation::Listen);
                warn!(error = %e, "cannot LISTEN for new messages; polling meanwhile");
            }
        }
    }

    /// Waits for `wait`, for shutdown, or, when `notified` is set, for a notification.
    pub async fn wait(
        &mut self,
        wait: Duration,
        notified: bool,
        stop: &CancellationToken,
    ) -> Woken {
        tokio::select! {
            biased;
            () = stop.cancelled() => return Woken::Stopped,
            woke = next_notification(&mut self.listener), if notified && self.listener.is_some() => {
                if let Err(e) = woke {
                    self.metrics.database_error(DatabaseOperation::Listen);
                    warn!(error = %e, "lost the LISTEN connection; reconnecting");
                    self.listener = None;
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
        Woken::Look
    }
}

/// Waits for a notification, then swallows any others already buffered: one drain
/// serves them all.
async fn next_notification(listener: &mut Option<PgListener>) -> Result<(), sqlx::Error> {
    let Some(listener) = listener.as_mut() else {
        return std::future::pending().await;
    };
    // `None` means the connection dropped and notifications may have been missed: wake.
    if listener.try_recv().await?.is_some() {
        while listener.next_buffered().is_some() {}
    }
    Ok(())
}
