//! The dispatcher: it owns the order of operations between the store and the mailer.
//! Three stages, each owning its state, and the loop that runs them:
//! - the claimer ([`claimer`]): where a claim starts ([`floor`]), how many rows it may take
//!   ([`pace`]), the claim, each payload read once, and the suppression list at claim;
//! - the sender ([`sender`], [`message_sender`]): the per-connection sends, the start
//!   deadline, one panic catch per message, the decision from an attempt to an outcome
//!   ([`attempt`], [`expiry`], [`recipients`]) and the SMTP circuit ([`breaker`]);
//! - the recorder ([`recorder`]): the one place outcomes are written, logged
//!   ([`outcome_log`]) and counted, as they come ([`queue`]), and held when the database
//!   does not take them yet ([`held`]);
//! - the loop ([`cycle`], [`steps`]): claim, send and record, batch after batch
//!   ([`batch`]), and what ends a wait ([`wake`]).

mod attempt;
mod batch;
mod breaker;
mod claimer;
mod cycle;
mod expiry;
mod floor;
mod held;
mod message_sender;
mod notification_check;
mod outcome_log;
mod pace;
mod queue;
mod recipients;
mod recorder;
mod sender;
mod steps;
mod wake;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tokio_util::sync::CancellationToken;

use crate::mailer::Mailer;
use crate::message::{Kind, Lane, Lanes, RetryPolicy};
use crate::render::Renderer;
use crate::store::KeptConnection;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

pub use batch::BatchReport;
use claimer::Claimer;
pub use expiry::ExpireAfter;
use message_sender::MessageSender;
use pace::Paces;
pub use pace::RateLimit;
use recorder::Recorder;
use sender::Sender;
use steps::Delivery;

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
    /// The bulk lane's own relays' limit (`OUTBOXD_BULK_RATE_LIMIT`); `None`: no limit.
    pub bulk_rate_limit: Option<RateLimit>,
    /// Default lifetimes per kind, for messages without their own `expires_at`.
    pub expire_after: ExpireAfter,
    /// Add a recipient to the suppression list when its server says it does not exist.
    pub suppress_hard_bounces: bool,
    /// Which kinds are bulk work, claimed after the transactional kinds' due rows.
    pub lanes: Lanes,
    /// The kinds sent to an address that unsubscribed or complained (never to one that
    /// bounced): `essential` in their kind.toml.
    pub essential: BTreeSet<Kind>,
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
    /// Sent what the pace allowed (`report`); the pace allows the next send after
    /// `resume_in`, and the loop claims again then, not at the next poll.
    Paced {
        report: BatchReport,
        resume_in: Duration,
    },
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

/// Claims, renders, sends and records, over and over: orchestration only, over the
/// stages that own their state.
/// The loop owns its stages: the claimer's state (floor, pace, claim size) is its alone;
/// the stages after the claim share what they must by reference ([`Delivery`]).
pub struct Dispatcher {
    claimer: Claimer,
    delivery: Delivery,
    settings: DispatchSettings,
}

impl Dispatcher {
    pub fn new(
        pool: Store,
        renderer: Arc<Renderer>,
        mailer: Arc<Mailer>,
        settings: DispatchSettings,
        shutdown: Shutdown,
        metrics: Arc<Metrics>,
    ) -> Self {
        // One connection kept for the cycle's statements, shared by the claimer and the
        // recorder (see `store::KeptConnection`).
        let database = Arc::new(KeptConnection::new(pool));
        let paces = Paces::new(
            settings.rate_limit,
            settings.bulk_rate_limit,
            mailer.routes().contains(&Lane::Bulk),
        );
        let messages = MessageSender {
            renderer: Arc::clone(&renderer),
            mailer,
            metrics: Arc::clone(&metrics),
            retry: settings.retry.clone(),
            stop: shutdown.stop.clone(),
            replies: paces.reply_counts(),
            expire_after: settings.expire_after.clone(),
            suppress_hard_bounces: settings.suppress_hard_bounces,
            lanes: settings.lanes.clone(),
            essential: settings.essential.clone(),
        };
        Self {
            claimer: Claimer::new(
                Arc::clone(&database),
                renderer,
                Arc::clone(&metrics),
                paces,
                settings.clone(),
            ),
            delivery: Delivery {
                sender: Sender::new(messages, shutdown.abort.clone(), settings.clone()),
                recorder: Recorder::new(
                    database,
                    Arc::clone(&metrics),
                    settings.suppress_hard_bounces,
                    settings.worker_id.clone(),
                ),
                shutdown,
                metrics,
            },
            settings,
        }
    }

    /// Listens for notifications on `pool` (a direct connection past a transaction
    /// pooler), or, with `None`, nowhere: it polls every 2 s instead.
    #[must_use]
    pub fn listening_on(mut self, pool: Option<Store>) -> Self {
        self.claimer.listen_on(pool);
        self
    }

    /// Tells `backlog` whenever a claim comes back full (a drain), for the work that yields
    /// to one.
    #[must_use]
    pub fn reporting_backlog_to(mut self, backlog: Arc<crate::backlog::Backlog>) -> Self {
        self.claimer.report_backlog_to(backlog);
        self
    }
}
