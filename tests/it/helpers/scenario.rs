//! The arrange most tests share, in one line: a fresh database, an SMTP server that replies
//! by recipient, and outboxd built in process with the test's flags.

use outboxd::app::App;
use outboxd::dispatch::Step;

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

impl TestDb {
    /// An `account_verification` to `to`, enqueued; its id.
    pub async fn verification_to(&self, to: &str) -> i64 {
        self.enqueue("account_verification", super::verification(to))
            .await
    }
}

/// One step of the dispatcher: claim a batch, send it, record its outcomes.
pub async fn one_step(app: &App) -> Step {
    app.dispatcher
        .dispatch_once()
        .await
        .expect("a dispatch step")
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
