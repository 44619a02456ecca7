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
