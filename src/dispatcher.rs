//! The loop: wake-ups, claiming, concurrent sends, the retry policy, the SMTP circuit
//! breaker and graceful shutdown. It owns the order of operations between the store and
//! the mailer; [`Dispatcher::dispatch_once`] is one step of it, so tests can drive it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, error, field, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::mailer::{Mailer, SendError};
use crate::message::{
    Claim, ClaimedMessage, Delivery, FailureClass, Outcome, ReleaseReason, RetryPolicy,
};
use crate::render::{RenderError, Renderer};
use crate::store::{self, ClaimRequest};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::parse_traceparent;

/// How quickly the dispatcher comes back after the SMTP server or the database failed.
const OUTAGE_BACKOFF: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    base: Duration::from_secs(1),
    max: Duration::from_secs(60),
};

/// How the dispatcher behaves; validated by the configuration before it is built.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// Rows claimed per batch; a drain continues while batches come back full.
    pub batch_size: u32,
    pub retry: RetryPolicy,
    /// How long a claim is this dispatcher's; after it, another may take the rows.
    pub lease: Duration,
    /// Sends in flight at once.
    pub concurrency: usize,
    /// The fallback wake-up when no notification arrives.
    pub poll_interval: Duration,
    /// The longest one send may take; no send starts later than this before the lease ends.
    pub send_timeout: Duration,
    /// Written to `locked_by`, so an operator can tell which replica holds a row.
    pub worker_id: String,
}

/// Two-stage shutdown: `stop` ends claiming and starting sends, `abort` gives up on
/// sends still in flight (their rows are released, not lost).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub stop: CancellationToken,
    pub abort: CancellationToken,
}

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub released: usize,
    /// Outcomes not recorded because another claimer took the rows over.
    pub lost: usize,
    /// Rows whose previous claimer's lease ran out without an outcome.
    pub reclaimed: usize,
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
    #[error("database error while trying to {operation} rows: {source}")]
    Database {
        operation: &'static str,
        source: sqlx::Error,
    },
}

impl DispatchError {
    fn database(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| DispatchError::Database { operation, source }
    }
}

/// What an attempt at one message came to, before it is turned into an outcome.
#[derive(Debug)]
enum Attempt {
    Delivered(Delivery),
    RenderFailed(RenderError),
    SendFailed(SendError),
    /// Not started: shutting down, or too close to the end of the lease.
    NotStarted,
    /// Started, then given up at the shutdown bound; it may or may not have been delivered.
    Abandoned,
}

/// A claimed batch, with the local time of the claim (its lease counts from there).
struct Claimed {
    claim: Claim,
    at: Instant,
}

/// A batch that was sent and whose outcomes wait to be recorded.
struct Sent {
    claim: Claim,
    /// In the order of `claim.messages`.
    outcomes: Vec<Outcome>,
    outage: bool,
    /// From the claim to the end of the sends.
    since_claim: chrono::Duration,
    span: tracing::Span,
}

/// What a claim came to.
enum Next {
    Batch(Claimed),
    /// Nothing due; the database's clock at the time.
    Empty(DateTime<Utc>),
    /// Not claimed at all: shutting down, or the circuit is open.
    Halt(Step),
}

#[derive(Debug)]
enum Breaker {
    Closed,
    Open { until: Instant, failures: u32 },
}

/// Claims, renders, sends and records, over and over.
pub struct Dispatcher {
    pool: PgPool,
    sender: Arc<Sender>,
    mailer: Arc<Mailer>,
    settings: DispatchSettings,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    breaker: Mutex<Breaker>,
    /// Sent batches whose outcomes the database did not take (it was down or the
    /// connection dropped). They are recorded before anything else is claimed, so a
    /// database blip does not make their messages go out again when their lease ends.
    unrecorded: Mutex<Vec<Sent>>,
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
        let sender = Arc::new(Sender {
            renderer,
            mailer: Arc::clone(&mailer),
            metrics: Arc::clone(&metrics),
            stop: shutdown.stop.clone(),
        });
        Self {
            pool,
            sender,
            mailer,
            settings,
            shutdown,
            metrics,
            breaker: Mutex::new(Breaker::Closed),
            unrecorded: Mutex::new(Vec::new()),
        }
    }

    /// Claims one batch of due rows and delivers it: the single step of the loop.
    pub async fn dispatch_once(&self) -> Result<Step, DispatchError> {
        self.step(None).await.map(|(step, _)| step)
    }

    /// Dispatches batches until one comes back short, as the original design did. Rows
    /// that fall due during the drain (new ones, or retries with no delay) wait for the
    /// next cycle, so a failing message is not retried in a tight loop.
    pub async fn drain(&self) -> Result<Step, DispatchError> {
        let mut total = BatchReport::default();
        let mut due_by = None;
        let mut unrecorded: Option<Sent> = None;
        let mut next = self.claim_next(None).await?;
        loop {
            let claimed = match next {
                Next::Batch(claimed) => claimed,
                stop => {
                    if let Some(sent) = unrecorded.take() {
                        total.add(&self.finish(sent).await?);
                    }
                    return Ok(match stop {
                        Next::Halt(step) if total.claimed == 0 => step,
                        _ => Step::Batch(total),
                    });
                }
            };
            due_by = due_by.or(Some(claimed.claim.claimed_at));
            let full = claimed.claim.messages.len() >= self.settings.batch_size as usize;
            // Three things at once, so that no connection waits on the database: this batch
            // is sent, the previous one's outcomes are recorded (a few milliseconds, well
            // inside its lease), and, after a full batch, the next one is claimed.
            let previous = unrecorded.take();
            let (sent, recorded, following) = tokio::join!(
                self.send(claimed),
                async {
                    match previous {
                        Some(sent) => self.finish(sent).await.map(Some),
                        None => Ok(None),
                    }
                },
                async {
                    if full {
                        self.claim_next(due_by).await.map(Some)
                    } else {
                        Ok(None)
                    }
                },
            );
            match recorded {
                Ok(Some(report)) => total.add(&report),
                Ok(None) => {}
                Err(e) => {
                    // This batch was sent too: keep its outcomes for the next attempt. The
                    // batch claimed meanwhile, if any, comes back when its lease ends.
                    self.hold(sent);
                    return Err(e);
                }
            }
            let following = match following {
                Ok(following) => following,
                Err(e) => {
                    self.hold(sent);
                    return Err(e);
                }
            };
            match following {
                Some(following) => {
                    unrecorded = Some(sent);
                    next = following;
                }
                None => {
                    total.add(&self.finish(sent).await?);
                    return Ok(Step::Batch(total));
                }
            }
        }
    }

    /// Runs until shutdown: drain, then wait for a notification, the poll interval, the
    /// circuit breaker's next probe, or a database back-off. Never returns an error:
    /// database and SMTP outages are waited out.
    pub async fn run(&self) {
        let mut listener: Option<PgListener> = None;
        let mut database_failures = 0_u32;
        info!(
            worker_id = %self.settings.worker_id,
            poll_interval = %humantime::format_duration(self.settings.poll_interval),
            batch_size = self.settings.batch_size,
            concurrency = self.settings.concurrency,
            "dispatcher started"
        );
        while !self.shutdown.stop.is_cancelled() {
            // Listen before looking, so that nothing committed meanwhile goes unnoticed.
            if listener.is_none() {
                match store::listen(&self.pool).await {
                    Ok(l) => listener = Some(l),
                    Err(e) => {
                        self.metrics.database_error("listen");
                        warn!(error = %e, "cannot LISTEN for new messages; polling meanwhile");
                    }
                }
            }
            let (wait, listen) = match self.drain().await {
                Ok(Step::Stopped) => break,
                Ok(Step::CircuitOpen { retry_in }) => (retry_in, false),
                Ok(Step::Batch(report)) => {
                    database_failures = 0;
                    if report.claimed > 0 {
                        debug!(?report, "drained");
                    }
                    (self.settings.poll_interval, true)
                }
                Err(e) => {
                    let DispatchError::Database { operation, .. } = &e;
                    self.metrics.database_error(operation);
                    database_failures = database_failures.saturating_add(1);
                    let retry_in = OUTAGE_BACKOFF.delay_after(database_failures);
                    error!(
                        error = %e,
                        retry_in = %humantime::format_duration(retry_in),
                        "dispatch cycle failed; retrying"
                    );
                    (retry_in, false)
                }
            };
            // Every wait ends within a poll interval, so the heartbeat the liveness probe
            // reads keeps beating through SMTP and database outages.
            self.metrics.cycle_completed();
            let wait = wait.min(self.settings.poll_interval);
            tokio::select! {
                biased;
                () = self.shutdown.stop.cancelled() => break,
                woke = wait_for_notification(&mut listener), if listen && listener.is_some() => {
                    if let Err(e) = woke {
                        self.metrics.database_error("listen");
                        warn!(error = %e, "lost the LISTEN connection; reconnecting");
                        listener = None;
                    }
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
        if let Err(e) = self.record_held().await {
            error!(
                error = %e,
                messages = self.held_outcomes(),
                "could not record the outcomes of sent messages; they will be sent again when their lease ends"
            );
        }
        info!("dispatcher stopped");
    }

    /// One batch. Also returns the database's clock at claim time.
    async fn step(
        &self,
        due_by: Option<DateTime<Utc>>,
    ) -> Result<(Step, Option<DateTime<Utc>>), DispatchError> {
        Ok(match self.claim_next(due_by).await? {
            Next::Halt(step) => (step, None),
            Next::Empty(claimed_at) => (Step::Batch(BatchReport::default()), Some(claimed_at)),
            Next::Batch(claimed) => {
                let claimed_at = claimed.claim.claimed_at;
                (Step::Batch(self.process(claimed).await?), Some(claimed_at))
            }
        })
    }

    /// Claims the next batch, unless shutting down or the SMTP circuit is open.
    async fn claim_next(&self, due_by: Option<DateTime<Utc>>) -> Result<Next, DispatchError> {
        if self.shutdown.stop.is_cancelled() {
            return Ok(Next::Halt(Step::Stopped));
        }
        self.record_held().await?;
        if let Some(retry_in) = self.circuit_closed_or_wait().await {
            return Ok(Next::Halt(Step::CircuitOpen { retry_in }));
        }
        let claim = store::claim(
            &self.pool,
            &ClaimRequest {
                limit: i64::from(self.settings.batch_size),
                lease: self.settings.lease,
                worker_id: &self.settings.worker_id,
                due_by,
            },
        )
        .await
        .map_err(DispatchError::database("claim"))?;
        Ok(if claim.messages.is_empty() {
            Next::Empty(claim.claimed_at)
        } else {
            Next::Batch(Claimed {
                claim,
                at: Instant::now(),
            })
        })
    }

    /// Sends a claimed batch and records every outcome.
    async fn process(&self, claimed: Claimed) -> Result<BatchReport, DispatchError> {
        let sent = self.send(claimed).await;
        self.finish(sent).await
    }

    /// Sends a claimed batch and decides each message's outcome; records nothing yet.
    async fn send(&self, claimed: Claimed) -> Sent {
        let Claimed { claim, at: claimed } = claimed;
        let span = info_span!(
            "process outbox_messages",
            otel.kind = "consumer",
            messaging.system = "outboxd",
            messaging.operation.type = "process",
            messaging.destination.name = store::TABLE,
            messaging.batch.message_count = claim.messages.len(),
            outbox.worker_id = %self.settings.worker_id,
        );
        let (outcomes, outage) = async {
            // A send may run for up to send_timeout, so none starts after this point: the
            // row is given back rather than sent after another replica could have taken it.
            let start_deadline = claimed
                + self
                    .settings
                    .lease
                    .saturating_sub(self.settings.send_timeout * 2);
            let attempts = self.attempt_all(&claim.messages, start_deadline).await;
            let outage = attempts
                .iter()
                .any(|(_, a)| matches!(a, Attempt::SendFailed(e) if !e.reached_server()))
                && !attempts.iter().any(|(_, a)| match a {
                    Attempt::Delivered(_) => true,
                    Attempt::SendFailed(e) => e.reached_server(),
                    _ => false,
                });
            let outcomes: Vec<Outcome> = attempts
                .into_iter()
                .map(|(message, attempt)| self.decide(message, attempt, outage))
                .collect();
            (outcomes, outage)
        }
        .instrument(span.clone())
        .await;
        Sent {
            since_claim: chrono::Duration::from_std(claimed.elapsed()).unwrap_or_default(),
            claim,
            outcomes,
            outage,
            span,
        }
    }

    /// Records a sent batch's outcomes, and opens the circuit if the batch met an outage.
    /// Outcomes the database did not take are held for [`Self::record_held`].
    async fn finish(&self, sent: Sent) -> Result<BatchReport, DispatchError> {
        let pairs: Vec<(&ClaimedMessage, &Outcome)> =
            sent.claim.messages.iter().zip(&sent.outcomes).collect();
        // Due-to-accepted latency on the database's clock, plus the time the sends took.
        let latency = |message: &ClaimedMessage| {
            (sent.claim.claimed_at + sent.since_claim - message.due_at)
                .to_std()
                .unwrap_or_default()
        };
        let recorded = self
            .record(sent.claim.token, &pairs, latency)
            .instrument(sent.span.clone())
            .await;
        drop(pairs);
        let report = match recorded {
            Ok(report) => report,
            Err(e) => {
                self.hold(sent);
                return Err(e);
            }
        };
        if sent.outage {
            self.open_circuit();
        }
        self.metrics.cycle_completed();
        Ok(report)
    }

    fn hold(&self, sent: Sent) {
        warn!(
            messages = sent.claim.messages.len(),
            "could not record the outcomes of a sent batch; holding them to record before the next claim"
        );
        lock(&self.unrecorded).push(sent);
    }

    /// Records outcomes held after a database failure, oldest first; stops at the first
    /// failure, which keeps the rest held. Also used at shutdown.
    pub async fn record_held(&self) -> Result<BatchReport, DispatchError> {
        let mut total = BatchReport::default();
        loop {
            let next = {
                let mut held = lock(&self.unrecorded);
                if held.is_empty() {
                    return Ok(total);
                }
                held.remove(0)
            };
            total.add(&self.finish(next).await?);
        }
    }

    /// Messages sent whose outcomes are not recorded yet.
    pub fn held_outcomes(&self) -> usize {
        lock(&self.unrecorded)
            .iter()
            .map(|sent| sent.claim.messages.len())
            .sum()
    }

    /// Renders and sends a batch over `concurrency` tasks that each take the next unsent
    /// message until none is left, so that rendering and SMTP spread over the runtime's
    /// threads without a task per message; until done or aborted.
    async fn attempt_all<'m>(
        &self,
        messages: &'m Arc<[ClaimedMessage]>,
        start_deadline: Instant,
    ) -> Vec<(&'m ClaimedMessage, Attempt)> {
        let slots = Arc::new(Mutex::new(
            (0..messages.len())
                .map(|_| Slot::Waiting)
                .collect::<Vec<_>>(),
        ));
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        for _ in 0..self.settings.concurrency.clamp(1, messages.len().max(1)) {
            let (sender, batch, slots, next) = (
                Arc::clone(&self.sender),
                Arc::clone(messages),
                Arc::clone(&slots),
                Arc::clone(&next),
            );
            tasks.spawn(
                async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(message) = batch.get(i) else { break };
                        lock(&slots)[i] = Slot::Started;
                        let attempt = sender.attempt(message, start_deadline).await;
                        lock(&slots)[i] = Slot::Done(attempt);
                    }
                }
                .in_current_span(),
            );
        }
        tokio::select! {
            biased;
            () = self.shutdown.abort.cancelled() => {}
            () = async {
                while let Some(joined) = tasks.join_next().await {
                    if let Err(e) = joined {
                        error!(error = %e, "a send task failed");
                    }
                }
            } => {}
        }
        // Sends still running are given up; those that finished just as the bound ran out
        // keep what they were.
        tasks.abort_all();
        // An aborted task may still be finishing a poll on another thread: read the slots
        // in place rather than taking the vector from under it.
        let mut slots = lock(&slots);
        messages
            .iter()
            .zip(slots.iter_mut())
            .map(|(m, slot)| {
                let attempt = match std::mem::replace(slot, Slot::Waiting) {
                    Slot::Done(attempt) => attempt,
                    Slot::Started => Attempt::Abandoned,
                    Slot::Waiting => Attempt::NotStarted,
                };
                (m, attempt)
            })
            .collect()
    }
}

/// Where one message of a batch being sent stands.
enum Slot {
    Waiting,
    Started,
    Done(Attempt),
}

/// A poisoned lock only means a send task panicked; the data is still whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a send needs, shared with the tasks that send.
struct Sender {
    renderer: Arc<Renderer>,
    mailer: Arc<Mailer>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Sender {
    /// One message: render and send, in a span that links to the request that enqueued it.
    async fn attempt(&self, message: &ClaimedMessage, start_deadline: Instant) -> Attempt {
        if self.stop.is_cancelled() || Instant::now() >= start_deadline {
            return Attempt::NotStarted;
        }
        let span = info_span!(
            "send",
            otel.name = format!("send {}", message.kind),
            otel.kind = "producer",
            otel.status_code = field::Empty,
            messaging.system = "outboxd",
            messaging.operation.type = "send",
            messaging.operation.name = "send",
            messaging.destination.name = %message.kind,
            messaging.message.id = message.id,
            outbox.id = message.id,
            outbox.attempt = message.attempts + 1,
            error.type = field::Empty,
        );
        if let Some(producer) = message.traceparent.as_deref().and_then(parse_traceparent) {
            span.add_link(producer);
        }
        let attempt = async {
            let email = match self
                .renderer
                .render(message.id, &message.kind, &message.payload)
            {
                Ok(email) => email,
                Err(e) => return Attempt::RenderFailed(e),
            };
            let started = Instant::now();
            let sent = self.mailer.send(email).await;
            if self.mailer.is_enabled() {
                self.metrics.smtp_send(started.elapsed());
            }
            match sent {
                Ok(delivery) => Attempt::Delivered(delivery),
                Err(e) => Attempt::SendFailed(e),
            }
        }
        .instrument(span.clone())
        .await;
        match &attempt {
            Attempt::RenderFailed(_) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", "render");
            }
            Attempt::SendFailed(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", e.class().as_str());
            }
            _ => {}
        }
        attempt
    }
}

impl Dispatcher {
    fn decide(&self, message: &ClaimedMessage, attempt: Attempt, outage: bool) -> Outcome {
        match attempt {
            Attempt::Delivered(via) => Outcome::Sent { via },
            Attempt::RenderFailed(e) => Outcome::DeadLetter {
                error: e.to_string(),
                code: e.code().to_owned(),
                class: FailureClass::Permanent,
            },
            Attempt::SendFailed(e) if outage => Outcome::Release {
                reason: ReleaseReason::SmtpUnavailable(e.to_string()),
            },
            Attempt::SendFailed(e) => match e.class() {
                FailureClass::Permanent => Outcome::DeadLetter {
                    error: e.to_string(),
                    code: e.code(),
                    class: FailureClass::Permanent,
                },
                FailureClass::Transient => Outcome::after_transient_failure(
                    e.to_string(),
                    e.code(),
                    message.attempts,
                    &self.settings.retry,
                ),
            },
            Attempt::NotStarted => Outcome::Release {
                reason: ReleaseReason::NotStarted,
            },
            Attempt::Abandoned => Outcome::Release {
                reason: ReleaseReason::Abandoned,
            },
        }
    }

    /// The one place where outcomes are written and reported: the rows, the logs and the
    /// metrics change together, so counters can never drift from the table.
    async fn record(
        &self,
        token: uuid::Uuid,
        outcomes: &[(&ClaimedMessage, &Outcome)],
        latency: impl Fn(&ClaimedMessage) -> Duration,
    ) -> Result<BatchReport, DispatchError> {
        let rows: Vec<(i64, &Outcome)> = outcomes
            .iter()
            .map(|(m, outcome)| (m.id, *outcome))
            .collect();
        let recorded: HashSet<i64> = store::record_outcomes(&self.pool, token, &rows)
            .await
            .map_err(DispatchError::database("record"))?
            .into_iter()
            .collect();
        let mut report = BatchReport {
            claimed: outcomes.len(),
            ..BatchReport::default()
        };
        for (message, outcome) in outcomes {
            let id = message.id;
            let kind = message.kind.as_str();
            if message.reclaimed {
                report.reclaimed += 1;
                self.metrics.reclaimed();
                warn!(outbox.id = id, outbox.kind = %kind, "took over a row whose previous lease ran out");
            }
            if !recorded.contains(&id) {
                report.lost += 1;
                self.metrics.lease_lost();
                warn!(
                    outbox.id = id,
                    outbox.kind = %kind,
                    outcome = outcome.action(),
                    "outcome not recorded: the lease was lost to another claimer"
                );
                continue;
            }
            let sent_latency = matches!(
                outcome,
                Outcome::Sent {
                    via: Delivery::Smtp
                }
            )
            .then(|| latency(message));
            self.metrics.outcome(kind, outcome, sent_latency);
            match outcome {
                Outcome::Sent {
                    via: Delivery::Smtp,
                } => {
                    report.sent += 1;
                    info!(
                        outbox.id = id,
                        outbox.kind = %kind,
                        attempts = message.attempts + 1,
                        latency_seconds = sent_latency.unwrap_or_default().as_secs_f64(),
                        "sent"
                    );
                }
                Outcome::Sent {
                    via: Delivery::LoggedOnly,
                } => {
                    report.sent += 1;
                    warn!(
                        outbox.id = id,
                        outbox.kind = %kind,
                        "NOT SENT: no SMTP server is configured; marked dispatched"
                    );
                }
                Outcome::Retry { error, delay, .. } => {
                    report.retried += 1;
                    warn!(
                        outbox.id = id,
                        outbox.kind = %kind,
                        attempts = message.attempts + 1,
                        retry_in = %humantime::format_duration(*delay),
                        error = %error,
                        "send failed; will retry"
                    );
                }
                Outcome::DeadLetter { error, class, .. } => {
                    report.dead_lettered += 1;
                    error!(
                        outbox.id = id,
                        outbox.kind = %kind,
                        attempts = message.attempts + 1,
                        class = class.as_str(),
                        error = %error,
                        "dead-lettered"
                    );
                }
                Outcome::Release { reason } => {
                    report.released += 1;
                    debug!(outbox.id = id, outbox.kind = %kind, reason = reason.as_str(), "released unsent");
                }
            }
        }
        Ok(report)
    }

    /// `None` when sends may go ahead; otherwise how long until the next probe. When the
    /// breaker's wait is over, probes the server once and closes or re-opens it.
    async fn circuit_closed_or_wait(&self) -> Option<Duration> {
        let failures = match *self.breaker() {
            Breaker::Closed => return None,
            Breaker::Open { until, failures } => {
                let now = Instant::now();
                if now < until {
                    return Some(until - now);
                }
                failures
            }
        };
        match self.mailer.probe().await {
            Ok(()) => {
                *self.breaker() = Breaker::Closed;
                self.metrics.circuit_open(false);
                info!("SMTP server reachable again; circuit closed, resuming delivery");
                None
            }
            Err(e) => {
                let failures = failures.saturating_add(1);
                let retry_in = OUTAGE_BACKOFF.delay_after(failures);
                *self.breaker() = Breaker::Open {
                    until: Instant::now() + retry_in,
                    failures,
                };
                warn!(error = %e, retry_in = %humantime::format_duration(retry_in), "SMTP server still unreachable");
                Some(retry_in)
            }
        }
    }

    fn open_circuit(&self) {
        let retry_in = OUTAGE_BACKOFF.delay_after(1);
        self.metrics.circuit_open(true);
        *self.breaker() = Breaker::Open {
            until: Instant::now() + retry_in,
            failures: 1,
        };
        error!(
            retry_in = %humantime::format_duration(retry_in),
            "SMTP server unreachable: circuit open, claiming paused; messages keep their attempts"
        );
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        lock(&self.breaker)
    }
}

impl BatchReport {
    fn add(&mut self, other: &BatchReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.lost += other.lost;
        self.reclaimed += other.reclaimed;
    }
}

/// Waits for a notification, then swallows any others already buffered: one drain
/// serves them all.
async fn wait_for_notification(listener: &mut Option<PgListener>) -> Result<(), sqlx::Error> {
    let Some(listener) = listener.as_mut() else {
        return std::future::pending().await;
    };
    // `None` means the connection dropped and notifications may have been missed: wake.
    if listener.try_recv().await?.is_some() {
        while listener.next_buffered().is_some() {}
    }
    Ok(())
}
