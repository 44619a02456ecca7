//! The dispatcher: it owns the order of operations between the store and the mailer.
//!
//! One cycle, stage by stage, one file each:
//! - [`cycle`]: the loop ([`Dispatcher::run`]) and its public single steps
//!   ([`Dispatcher::dispatch_once`], [`Dispatcher::drain`]);
//! - [`batch`]: what a batch is at each stage: leased, its outcomes decided, what comes
//!   next;
//! - [`send`]: the per-connection sends and the start deadline;
//! - [`attempt`]: the decision from an attempt to an outcome, made as each send ends (a
//!   panic caught and counted);
//! - [`record`]: the one place outcomes are written (as they come), logged and counted,
//!   and held across a database failure;
//! - [`breaker`]: the SMTP circuit breaker;
//! - [`wake`]: what ends a wait: LISTEN/NOTIFY, the poll interval, back-off;
//! - [`pace`]: the send-rate limit replicas share, and throttling;
//! - [`suppress`]: the suppression list at send time;
//! - [`floor`]: where a claim starts scanning, so that a transaction left open elsewhere
//!   does not make claims walk every row sent since it began.

mod attempt;
mod batch;
mod breaker;
mod cycle;
mod expiry;
mod floor;
mod held;
mod pace;
mod recipients;
mod record;
mod send;
mod suppress;
mod wake;

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::mailer::Mailer;
use crate::message::RetryPolicy;
use crate::render::Renderer;
use crate::store::KeptConnection;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

pub use batch::BatchReport;
use batch::Unrecorded;
use breaker::CircuitBreaker;
pub use expiry::ExpireAfter;
use floor::ClaimFloor;
use pace::Pace;
pub use pace::RateLimit;
use send::MessageSender;

/// How the dispatcher behaves; validated by the configuration before it is built.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// Rows claimed per batch at first; a drain continues while batches come back full,
    /// doubling the claim up to `max_batch_size`.
    pub batch_size: u32,
    pub max_batch_size: u32,
    pub retry: RetryPolicy,
    /// How long a claim is this dispatcher's; after it, another may take the rows.
    pub lease: Duration,
    /// Sends in flight at once.
    pub concurrency: usize,
    /// The fallback wake-up when no notification arrives.
    pub poll_interval: Duration,
    /// After a notification, how long to let others arrive before claiming; zero: none.
    pub linger: Duration,
    /// The longest one send may take; no send starts later than this before the lease ends.
    pub send_timeout: Duration,
    /// Written to `locked_by`, so an operator can tell which replica holds a row.
    pub worker_id: String,
    /// Payloads longer than this are left in the database and dead-lettered.
    pub max_payload_bytes: usize,
    /// Messages per second that all replicas on the table send together; `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Default lifetimes per kind, for messages without their own `expires_at`.
    pub expire_after: ExpireAfter,
    /// Add a recipient to the suppression list when its server says it does not exist.
    pub suppress_hard_bounces: bool,
}

/// Two-stage shutdown: `stop` ends claiming and starting sends, `abort` gives up on
/// sends still in flight (their rows are released, not lost).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub stop: CancellationToken,
    pub abort: CancellationToken,
}

/// What one step of the dispatcher did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Batch(BatchReport),
    /// The SMTP server is unreachable; nothing was claimed. Try again after `retry_in`.
    CircuitOpen {
        retry_in: Duration,
    },
    /// Shutting down; nothing was claimed.
    Stopped,
}

/// A dispatcher failure that is not any single message's: the database.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("database error while trying to {} rows: {source}", operation.as_str())]
    Database {
        operation: DatabaseOperation,
        source: sqlx::Error,
    },
}

impl DispatchError {
    fn database(operation: DatabaseOperation) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| DispatchError::Database { operation, source }
    }
}

/// Claims, renders, sends and records, over and over.
pub struct Dispatcher {
    /// The pool, and the connection kept for the claim-send-record cycle's statements.
    database: KeptConnection,
    sender: Arc<MessageSender>,
    mailer: Arc<Mailer>,
    settings: DispatchSettings,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    breaker: CircuitBreaker,
    floor: ClaimFloor,
    pace: Arc<Pace>,
    /// The claim size now: grows while batches come back full, back to `batch_size` after
    /// a short one.
    claim_size: AtomicU32,
    /// Outcomes the database did not take (it was down or the connection dropped). They
    /// are recorded before anything else is claimed, so a database blip does not make
    /// their messages go out again when their lease ends.
    unrecorded: Mutex<Vec<Unrecorded>>,
    /// The one write, at most, waiting on another transaction's row locks.
    lock_waiter: Mutex<Option<held::LockWaiter>>,
}

impl Dispatcher {
    pub fn new(
        pool: PgPool,
        renderer: Arc<Renderer>,
        mailer: Arc<Mailer>,
        settings: DispatchSettings,
        shutdown: Shutdown,
        metrics: Arc<Metrics>,
    ) -> Self {
        let pace = Arc::new(Pace::new(settings.rate_limit));
        let batch_size = settings.batch_size;
        let sender = Arc::new(MessageSender {
            renderer,
            mailer: Arc::clone(&mailer),
            metrics: Arc::clone(&metrics),
            retry: settings.retry.clone(),
            stop: shutdown.stop.clone(),
            pace: Arc::clone(&pace),
            expire_after: settings.expire_after.clone(),
            suppress_hard_bounces: settings.suppress_hard_bounces,
        });
        Self {
            database: KeptConnection::new(pool),
            sender,
            mailer,
            settings,
            shutdown,
            metrics,
            breaker: CircuitBreaker::default(),
            floor: ClaimFloor::new(),
            pace,
            claim_size: AtomicU32::new(batch_size),
            unrecorded: Mutex::new(Vec::new()),
            lock_waiter: Mutex::new(None),
        }
    }
}
