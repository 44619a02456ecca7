//! The arrange most tests share, in one line: a fresh database, an SMTP server that replies
//! by recipient, and outboxd built in process with the test's flags.

use std::time::Duration;

use outboxd::app::App;
use outboxd::dispatch::{Dispatcher, Shutdown, Step};
use outboxd::store::suppressions::{self, Suppression};

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{SmtpServer, TestDb, app};

/// A test's world.
pub struct Scenario {
    pub db: TestDb,
    pub smtp: SmtpServer,
    pub app: App,
}

impl Scenario {
    /// A fresh database, an aiosmtpd server, and outboxd run with `flags`.
    pub async fn new(flags: &[&str]) -> Self {
        let db = TestDb::new().await;
        let smtp = SmtpServer::start();
        let app = app(&db, Some(&smtp.url()), flags).await;
        Self { db, smtp, app }
    }
}

/// An app's dispatcher running on a task of its own, as `outboxd run` runs it.
pub struct Dispatching {
    shutdown: Shutdown,
    task: JoinHandle<()>,
}

impl Dispatching {
    /// Runs `dispatcher` until [`Self::stop`]; `shutdown` is the app's.
    pub fn start(dispatcher: Dispatcher, shutdown: &Shutdown) -> Self {
        Self {
            shutdown: shutdown.clone(),
            task: tokio::spawn(dispatcher.run()),
        }
    }

    /// Whether the dispatcher's loop has ended (it should not before [`Self::stop`]).
    pub fn has_ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Asks the dispatcher to stop, and waits until it has.
    pub async fn stop(self) {
        self.shutdown.stop.cancel();
        self.task.await.expect("the dispatcher ran to its end");
    }
}

impl TestDb {
    /// The first of `address`'s entries on the suppression list (`all` first), if any.
    pub async fn suppression_of(&self, address: &str) -> Option<Suppression> {
        let address = outboxd::suppression::Address::parse(address).expect("an address");
        suppressions::get(&self.store, &address)
            .await
            .expect("the list is read")
            .into_iter()
            .next()
    }

    /// An `account_verification` to `to`, enqueued; its id.
    pub async fn verification_to(&self, to: &str) -> i64 {
        self.enqueue("account_verification", super::verification(to))
            .await
    }
}

/// One step of the dispatcher: claim a batch, send it, record its outcomes.
pub async fn one_step(app: &mut App) -> Step {
    app.dispatcher
        .dispatch_once()
        .await
        .expect("a dispatch step")
}

/// Steps the dispatcher until `wanted` finds what it waits for in a step, and returns it;
/// panics after `within`.
pub async fn step_until<T>(
    app: &mut App,
    within: Duration,
    what: &str,
    mut wanted: impl FnMut(Step) -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = wanted(one_step(app).await) {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One count of a batch's report, for [`batch`].
#[derive(Debug, Clone, Copy)]
pub enum Count {
    Claimed(usize),
    Sent(usize),
    LoggedOnly(usize),
    Retried(usize),
    DeadLettered(usize),
    Released(usize),
    Expired(usize),
}

/// The step of a batch that did exactly `counts`, every other count zero:
/// `batch(&[Count::Claimed(1), Count::Retried(1)])`.
pub fn batch(counts: &[Count]) -> Step {
    let mut report = outboxd::dispatch::BatchReport::default();
    for count in counts {
        match *count {
            Count::Claimed(n) => report.claimed = n,
            Count::Sent(n) => report.sent = n,
            Count::LoggedOnly(n) => report.logged_only = n,
            Count::Retried(n) => report.retried = n,
            Count::DeadLettered(n) => report.dead_lettered = n,
            Count::Released(n) => report.released = n,
            Count::Expired(n) => report.expired = n,
        }
    }
    Step::Batch(report)
}
