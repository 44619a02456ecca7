//! The admin page in a real headless Chromium, driven over WebDriver by chromedriver
//! (Debian's `chromium` and `chromium-driver`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::helpers::{TestDb, app, eventually, free_port, http_full, poll_until};

const TOKEN: &str = "browser-admin-token-0123456789";

/// A chromedriver process and one headless Chromium session.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Self {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian package `chromium-driver`)");
        let addr = format!("127.0.0.1:{port}");
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Self {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        eventually(Duration::from_secs(10), "chromedriver ready", || async {
            browser
                .call("GET", "/status", None)
                .await
                .is_some_and(|v| v["value"]["ready"] == true)
        })
        .await;
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--disable-quic", "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync", "--window-size=1300,900",
                         format!("--user-data-dir={}", browser._profile.path().display())]
            }
        }}});
        let created = browser
            .call("POST", "/session", Some(capabilities))
            .await
            .expect("new session");
        browser.session = created["value"]["sessionId"]
            .as_str()
            .expect("session id")
            .to_owned();
        browser
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Option<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let response = http_full(
            &self.addr,
            method,
            path,
            &[("Content-Type", "application/json")],
            &body,
        )
        .await
        .ok()?;
        serde_json::from_str(&response.body).ok()
    }

    async fn session(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.call(method, &path, body).await.unwrap_or(Value::Null)
    }

    async fn open(&self, url: &str) {
        self.session("POST", "/url", Some(json!({"url": url})))
            .await;
    }

    async fn source(&self) -> String {
        self.session("GET", "/source", None).await["value"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    async fn click(&self, css: &str) {
        let found = self
            .session(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        let element = found["value"]
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned();
        self.session(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn screenshot(&self) -> Vec<u8> {
        let shot = self.session("GET", "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD
            .decode(shot["value"].as_str().unwrap_or(""))
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_real_browser_the_page_lists_a_dead_letter_and_retry_moves_it_back_to_pending() {
    let db = TestDb::new().await;
    let mut app = app(&db, None, &["--admin-token", TOKEN]).await;
    let addr = app.admin_addr().unwrap();
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, attempts, last_error, error_class, dead_lettered_at) \
         VALUES ('invoice_notice', '{\"to\": \"billing@example.com\"}', 5, \
                 'gave up after 5 attempts: SMTP server deferred the message: transient error (451): 4.3.0 try again later', \
                 'smtp_451', now() - interval '3 minutes') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();

    let browser = Browser::start().await;
    browser
        .open(&format!("http://ops:{TOKEN}@{addr}/admin"))
        .await;
    let page = browser.source().await;
    assert!(page.contains(&format!("id=\"dead-letter-{id}\"")), "{page}");
    assert!(
        page.contains("billing@example.com") && page.contains("3 min ago"),
        "{page}"
    );
    assert!(page.contains("signed in as ops"));
    let screenshot = browser.screenshot().await;
    assert!(screenshot.starts_with(b"\x89PNG"), "no screenshot");
    std::fs::write(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/admin-page.png"),
        &screenshot,
    )
    .unwrap();

    browser.click(&format!("#retry-{id}")).await;
    let after = poll_until(Duration::from_secs(10), "the page after Retry", || async {
        let source = browser.source().await;
        source.contains("Retried message").then_some(source)
    })
    .await;
    assert!(after.contains(&format!("Retried message {id}.")), "{after}");
    assert!(
        !after.contains(&format!("id=\"dead-letter-{id}\"")),
        "still listed"
    );
    let row = db.row(id).await;
    assert!(!row.dead && row.attempts == 0 && !row.dispatched, "{row:?}");
    let actor: String =
        sqlx::query_scalar("SELECT actor FROM outbox_admin_audit ORDER BY id DESC LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(actor, "ops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_real_browser_an_unsubscribe_link_asks_first_and_its_button_unsubscribes() {
    use crate::unsubscribe::{BulkSending, lane_entries};
    let sending = BulkSending::start().await;
    let (db, outboxd) = (&sending.db, &sending.outboxd);
    let path = sending.a_link_to("ada@example.com").await;

    let browser = Browser::start().await;
    browser
        .open(&format!("http://{}{path}", outboxd.http))
        .await;
    let page = browser.source().await;
    assert!(page.contains("Unsubscribe?"), "{page}");
    assert_eq!(
        lane_entries(db, "ada@example.com").await,
        0,
        "opening the page changes nothing"
    );

    browser.click("button[type=submit]").await;
    poll_until(
        Duration::from_secs(10),
        "the page after the button",
        || async {
            browser
                .source()
                .await
                .contains("Unsubscribed")
                .then_some(())
        },
    )
    .await;
    assert_eq!(lane_entries(db, "ada@example.com").await, 1);
}
