//! Up to `size` SMTP connections, each used by one send at a time; idle ones are kept for
//! reuse and checked before it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use tokio::sync::Semaphore;

use super::connection::{Connection, TransactionError};
use super::target::Target;
use super::{Accepted, SendError};
use crate::lock::lock;

/// Idle connections older than this are closed rather than reused: servers drop idle
/// clients after a while, and a dead connection would fail a send.
const MAX_IDLE: Duration = Duration::from_secs(30);

/// The SMTP connection pool.
pub struct Pool {
    target: Target,
    timeout: Duration,
    permits: Semaphore,
    idle: Mutex<Vec<(Connection, Instant)>>,
}

impl Pool {
    pub fn new(target: Target, size: u32, timeout: Duration) -> Self {
        Self {
            target,
            timeout,
            permits: Semaphore::new(size.max(1) as usize),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take_idle(&self) -> Option<Connection> {
        let mut idle = lock(&self.idle);
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE && !conn.has_broken() && !conn.closed_by_server() {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(&self, conn: Connection) {
        if !conn.has_broken() {
            lock(&self.idle).push((conn, Instant::now()));
        }
    }

    /// Sends one message by `deadline`, reusing an idle connection when there is one. A
    /// reused connection found dead before the message was handed over (closed by the
    /// server while idle) is replaced once. Connecting and the transaction each get the
    /// timeout, and the whole send, replacing included, ends by `deadline`, which the caller
    /// sets within two timeouts: the dispatcher counts on that to keep every send
    /// inside its lease.
    pub async fn send_by(
        &self,
        envelope: &Envelope,
        body: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<Accepted, Failure> {
        let _permit = self.permits.acquire().await.map_err(|_| {
            Failure::before_data(SendError::Unreachable("the SMTP pool is closed".to_owned()))
        })?;
        let (conn, reused) = match self.take_idle() {
            Some(conn) => (conn, true),
            None => (
                self.connect_by(deadline).await.map_err(Failure::before_data)?,
                false,
            ),
        };
        match self.send_on(conn, envelope, body, deadline).await {
            Err((SessionError::Stale(_), _)) if reused => {
                let conn = self.connect_by(deadline).await.map_err(Failure::before_data)?;
                self.send_on(conn, envelope, body, deadline)
                    .await
                    .map_err(Failure::of)
            }
            result => result.map_err(Failure::of),
        }
    }

    /// A new connection, within the timeout and the time left before `deadline`.
    async fn connect_by(&self, deadline: tokio::time::Instant) -> Result<Connection, SendError> {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(SendError::Unreachable(
                "no time left in this send to connect again".to_owned(),
            ));
        }
        Connection::connect(&self.target, left.min(self.timeout)).await
    }

    /// One transaction on `conn`; a failure says whether the message had been handed over.
    async fn send_on(
        &self,
        mut conn: Connection,
        envelope: &Envelope,
        body: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<Accepted, (SessionError, bool)> {
        let deadline = deadline.min(tokio::time::Instant::now() + self.timeout);
        let sent = tokio::time::timeout_at(deadline, conn.send(envelope, body)).await;
        let handed_over = conn.message_handed_over;
        self.outcome(conn, sent).map_err(|e| (e, handed_over))
    }

    fn outcome(
        &self,
        conn: Connection,
        sent: Result<Result<Accepted, TransactionError>, tokio::time::error::Elapsed>,
    ) -> Result<Accepted, SessionError> {
        let within = humantime::format_duration(self.timeout);
        match sent {
            Ok(Ok(accepted)) => {
                self.give_back(conn);
                Ok(accepted)
            }
            Ok(Err(TransactionError::Refused(e))) => Err(SessionError::Failed(e)),
            // No reply at all: the connection died under us, or was dead before we began.
            Ok(Err(TransactionError::Lost(e))) => {
                Err(SessionError::Stale(SendError::Unreachable(e.to_string())))
            }
            Ok(Err(TransactionError::Ambiguous(e))) => {
                Err(SessionError::Failed(SendError::Ambiguous(format!(
                    "the connection failed after the message was sent, before the server confirmed it: {e}"
                ))))
            }
            // Dropped, not returned: a half-finished exchange must never be reused.
            Err(_elapsed) if conn.message_handed_over => {
                Err(SessionError::Failed(SendError::Ambiguous(format!(
                    "no reply to the message within {within}; the server may have it"
                ))))
            }
            Err(_elapsed) if conn.mail_accepted => Err(SessionError::Failed(SendError::deferred(
                format!("no reply within {within} during the transaction"),
            ))),
            Err(_elapsed) => Err(SessionError::Failed(SendError::Unreachable(format!(
                "no reply within {within}"
            )))),
        }
    }

    /// Opens a connection and checks it with NOOP; kept for the next send.
    pub async fn probe(&self) -> Result<(), SendError> {
        let mut conn = Connection::connect(&self.target, self.timeout).await?;
        if tokio::time::timeout(self.timeout, conn.smtp.test_connected())
            .await
            .unwrap_or(false)
        {
            self.give_back(conn);
            Ok(())
        } else {
            Err(SendError::Unreachable("NOOP was not answered".to_owned()))
        }
    }

    /// Says QUIT on idle connections.
    pub async fn close(&self) {
        self.permits.close();
        let idle: Vec<_> = std::mem::take(&mut *lock(&self.idle));
        for (mut conn, _) in idle {
            // Best effort: the process is leaving, and the server times idle clients out anyway.
            if let Err(e) = tokio::time::timeout(Duration::from_secs(1), conn.smtp.quit()).await {
                tracing::debug!(error = %e, "QUIT timed out");
            }
        }
    }
}

/// How a send on one connection failed.
enum SessionError {
    /// The connection failed without a reply: worth one retry on a fresh connection.
    Stale(SendError),
    /// Anything else: the send's own error.
    Failed(SendError),
}

/// A failed send, and whether it failed before the message's data went: then no relay has
/// it, and it may go to another.
#[derive(Debug)]
pub struct Failure {
    pub error: SendError,
    pub before_data: bool,
}

impl Failure {
    fn before_data(error: SendError) -> Self {
        Self {
            error,
            before_data: true,
        }
    }

    fn of((session, handed_over): (SessionError, bool)) -> Self {
        let error = match session {
            SessionError::Stale(e) | SessionError::Failed(e) => e,
        };
        Self {
            before_data: !handed_over && !matches!(error, SendError::Ambiguous(_)),
            error,
        }
    }
}
