use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::Count::{Claimed, DeadLettered, LoggedOnly, Released, Retried, Sent};
use crate::helpers::{
    Dispatching, Scenario, SmtpServer, TestCa, TestDb, app, batch, eventually, one_step,
};

fn verification(to: &str) -> serde_json::Value {
    json!({"to": to, "name": "Ada", "verify_url": "https://app.example/verify?t=abc"})
}

#[tokio::test]
pub(crate) async fn all_three_kinds_are_delivered_with_their_headers_and_bodies() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;

    let verify = db
        .enqueue(
            "account_verification",
            verification("Ada <ada@example.com>"),
        )
        .await;
    let invite = db
        .enqueue(
            "workspace_invite",
            json!({"to": ["grace@example.com", "linus@example.com"], "inviter_name": "Ada",
                   "workspace_name": "Engines & Co", "accept_url": "https://app.example/i/1"}),
        )
        .await;
    let invoice = db
        .enqueue(
            "invoice_notice",
            json!({"to": "billing@example.com", "customer_name": "Engines Ltd",
                   "invoice_number": "INV-7", "amount": "120.00", "currency": "EUR",
                   "due_date": "2026-12-31", "invoice_url": "https://app.example/inv/7"}),
        )
        .await;

    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(3), Sent(3)]));
    let received = smtp.messages();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|m| m.pipelined), "{received:?}");
    let by_id = |id: i64| {
        received
            .iter()
            .find(|m| m.outbox_id == id.to_string())
            .unwrap_or_else(|| panic!("no email for row {id}"))
    };

    let m = by_id(verify);
    assert_eq!(m.subject, "Confirm your email address");
    assert_eq!(m.rcpt_tos, ["ada@example.com"]);
    assert_eq!(m.mail_from, "outbox@example.test");
    assert_eq!(m.header("From"), Some("Outbox Test <outbox@example.test>"));
    let tag = db.installation_tag().await;
    assert_eq!(
        m.message_id,
        format!("<outbox-{verify}.{tag}@example.test>")
    );
    assert!(m.text.as_deref().unwrap().contains("Hello Ada,"));
    assert!(
        m.text
            .as_deref()
            .unwrap()
            .contains("https://app.example/verify?t=abc")
    );
    // minijinja escapes '/' in HTML too, which browsers and mail clients read back as '/'.
    let html = m.html.as_deref().unwrap().replace("&#x2f;", "/");
    assert!(
        html.contains(r#"href="https://app.example/verify?t=abc""#),
        "{html}"
    );

    let m = by_id(invite);
    assert_eq!(m.subject, "Ada invited you to Engines & Co");
    assert_eq!(m.rcpt_tos, ["grace@example.com", "linus@example.com"]);
    assert!(
        m.html
            .as_deref()
            .unwrap()
            .contains("<strong>Engines &amp; Co</strong>")
    );

    let m = by_id(invoice);
    assert_eq!(m.subject, "Invoice INV-7: 120.00 EUR due 2026-12-31");
    assert!(m.text.as_deref().unwrap().contains("Hello Engines Ltd,"));

    for id in [verify, invite, invoice] {
        let row = db.row(id).await;
        assert!(
            row.dispatched && !row.dead && row.attempts == 0 && row.locked_by.is_none(),
            "{row:?}"
        );
    }
}

#[tokio::test]
async fn cc_bcc_and_reply_to_reach_the_envelope_and_bcc_stays_hidden() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    db.enqueue(
        "account_verification",
        json!({"to": "ada@example.com", "cc": ["cc@example.com"], "bcc": "hidden@example.com",
               "reply_to": "Support <support@example.com>", "name": "Ada", "verify_url": "u"}),
    )
    .await;
    one_step(&mut app).await;
    let m = &smtp.messages()[0];
    assert_eq!(
        m.rcpt_tos,
        ["ada@example.com", "cc@example.com", "hidden@example.com"]
    );
    assert_eq!(m.header("Cc"), Some("cc@example.com"));
    assert_eq!(m.header("Reply-To"), Some("Support <support@example.com>"));
    assert_eq!(m.header("Bcc"), None);
}

/// One connection carries accepted, rejected and deferred messages in turn: a failed
/// pipelined transaction must not leave its unread replies to be taken for the next one's.
async fn mixed_outcomes_over_one_connection(smtp: &SmtpServer, pipelined: bool) {
    let db = TestDb::new().await;
    let mut app = app(&db, Some(&smtp.url()), &["--smtp-concurrency", "1"]).await;
    let mut ids = Vec::new();
    for to in [
        "a@example.com",
        "reject1@example.com",
        "b@example.com",
        "defer1@example.com",
        "c@example.com",
    ] {
        ids.push(db.verification_to(to).await);
    }
    ids.push(
        db.enqueue(
            "workspace_invite",
            json!({"to": ["d@example.com", "reject2@example.com"], "inviter_name": "Ada",
                   "workspace_name": "W", "accept_url": "u"}),
        )
        .await,
    );
    ids.push(db.verification_to("e@example.com").await);
    let step = one_step(&mut app).await;
    assert_eq!(
        step,
        batch(&[Claimed(7), Sent(4), Retried(1), DeadLettered(2)])
    );
    let received = smtp.messages();
    let mut to: Vec<_> = received.iter().map(|m| m.rcpt_tos.join(",")).collect();
    to.sort();
    assert_eq!(
        to,
        [
            "a@example.com",
            "b@example.com",
            "c@example.com",
            "e@example.com"
        ]
    );
    assert!(
        received.iter().all(|m| m.pipelined == pipelined),
        "{received:?}"
    );
    let row = db.row(ids[1]).await;
    assert!(
        row.dead && row.last_error.as_deref().unwrap().contains("550"),
        "{row:?}"
    );
    let row = db.row(ids[3]).await;
    assert!(
        !row.dead && row.attempts == 1 && row.last_error.as_deref().unwrap().contains("451"),
        "{row:?}"
    );
    assert!(db.row(ids[5]).await.dead);
}

#[tokio::test]
async fn a_pipelining_server_gets_accepted_rejected_and_deferred_messages_in_turn() {
    mixed_outcomes_over_one_connection(&SmtpServer::start(), true).await;
}

#[tokio::test]
async fn a_server_without_pipelining_gets_one_command_at_a_time() {
    mixed_outcomes_over_one_connection(&SmtpServer::start_without_pipelining(), false).await;
}

#[tokio::test]
async fn starttls_and_auth_carry_pipelined_mail_to_a_server_with_a_private_ca() {
    let ca = TestCa::new();
    let smtp = ca.smtp_server(&["--auth", "mailer:s3cr%t"]);
    let url = format!(
        "smtp://mailer:s3cr%25t@127.0.0.1:{}?tls=required",
        smtp.port
    );
    let db = TestDb::new().await;
    let mut app = app(
        &db,
        Some(&url),
        &[
            "--smtp-ca-file",
            &ca.path("ca.pem"),
            "--smtp-concurrency",
            "1",
        ],
    )
    .await;
    for to in ["a@example.com", "reject@example.com", "b@example.com"] {
        db.verification_to(to).await;
    }
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(3), Sent(2), DeadLettered(1)]));
    let received = smtp.messages();
    assert_eq!(received.len(), 2);
    for m in &received {
        assert!(m.tls && m.pipelined, "{m:?}");
        assert_eq!(m.auth_user.as_deref(), Some("mailer"));
    }
}

#[tokio::test]
async fn smtps_speaks_tls_from_the_first_byte() {
    let ca = TestCa::new();
    let smtp = ca.smtp_server(&["--smtps"]);
    let db = TestDb::new().await;
    let url = format!("smtps://127.0.0.1:{}", smtp.port);
    let mut app = app(&db, Some(&url), &["--smtp-ca-file", &ca.path("ca.pem")]).await;
    db.verification_to("a@example.com").await;
    one_step(&mut app).await;
    let received = smtp.messages();
    assert_eq!(received.len(), 1);
    assert!(received[0].tls, "{received:?}");
}

#[tokio::test]
async fn a_certificate_from_an_untrusted_ca_is_an_outage_that_keeps_the_message() {
    let ca = TestCa::new();
    let smtp = ca.smtp_server(&[]);
    let db = TestDb::new().await;
    let url = format!("smtp://127.0.0.1:{}?tls=required", smtp.port);
    let mut app = app(&db, Some(&url), &[]).await;
    let id = db.verification_to("a@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Released(1)]));
    let row = db.row(id).await;
    assert!(!row.dead && !row.dispatched && row.attempts == 0, "{row:?}");
    assert!(smtp.messages().is_empty());
}

#[tokio::test]
async fn a_rolled_back_transaction_sends_nothing_and_a_committed_one_is_delivered() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;

    db.exec("CREATE TABLE accounts (email text PRIMARY KEY)")
        .await;

    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO accounts VALUES ('rolled@example.com')")
        .execute(&mut *tx)
        .await
        .unwrap();
    outboxd_producer::enqueue(
        &mut *tx,
        outboxd::NewMessage::new("account_verification", verification("rolled@example.com"))
            .unwrap(),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = db
        .transaction_after("INSERT INTO accounts VALUES ('committed@example.com')")
        .await;
    let committed = outboxd_producer::enqueue(
        &mut *tx,
        outboxd::NewMessage::new(
            "account_verification",
            verification("committed@example.com"),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    one_step(&mut app).await;
    assert_eq!(db.count("all").await, 1);
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(accounts, 1);
    let received = smtp.messages();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].rcpt_tos, ["committed@example.com"]);
    assert_eq!(received[0].outbox_id, committed.to_string());
}

#[tokio::test]
async fn without_smtp_rows_are_only_logged_and_never_counted_as_sent() {
    let db = TestDb::new().await;
    let mut app = app(&db, None, &[]).await;
    assert!(!app.mailer.is_enabled());
    for i in 0..3 {
        db.enqueue(
            "account_verification",
            verification(&format!("dev{i}@example.com")),
        )
        .await;
    }
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(3), LoggedOnly(3)]));
    assert_eq!(db.count("dispatched").await, 0);
    let logged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_messages WHERE end_reason = 'logged_only' \
         AND dead_lettered_at IS NOT NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(logged, 3);
    assert_eq!(db.count("dead").await, 0, "not dead letters either");
}

#[tokio::test]
pub(crate) async fn a_notification_wakes_the_dispatcher_long_before_the_poll_interval() {
    let Scenario { db, smtp, app } = Scenario::new(&["--poll-interval", "10m"]).await;
    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    // Let the loop finish its first (empty) drain and go to sleep on LISTEN.
    db.wait_for_listener().await;

    let committed = Instant::now();
    db.verification_to("fast@example.com").await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    let waited = committed.elapsed();
    running.stop().await;
    // The poll interval is ten minutes: only the notification can explain a delivery now.
    assert!(
        waited < Duration::from_secs(30),
        "delivered after {waited:?}"
    );
}

/// A running dispatcher that lingers 1 s and that only notifications wake (the poll
/// interval is ten minutes).
async fn lingering_dispatcher(db: &TestDb, smtp: &SmtpServer) -> Dispatching {
    let app = app(
        db,
        Some(&smtp.url()),
        &["--poll-interval", "10m", "--linger", "1s"],
    )
    .await;
    Dispatching::start(app.dispatcher, &app.shutdown)
}

#[tokio::test]
pub(crate) async fn after_a_notification_the_dispatcher_lingers_for_more_commits_before_claiming() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let running = lingering_dispatcher(&db, &smtp).await;
    // The first (empty) claim is over, so the next one can only follow a notification.
    eventually(Duration::from_secs(30), "the first claim", || async {
        db.sessions("state = 'idle' AND query LIKE '%regular_head%'")
            .await
            > 0
    })
    .await;

    let committed = Instant::now();
    db.verification_to("first@example.com").await;
    db.verification_to("second@example.com").await;
    smtp.wait_for(2, Duration::from_secs(30)).await;
    let waited = committed.elapsed();
    running.stop().await;
    // A lower bound, which no load on the machine can break: the claim waited out the linger.
    assert!(
        waited >= Duration::from_secs(1),
        "delivered after {waited:?}"
    );
    assert_eq!(db.count("dispatched").await, 2);
}

#[tokio::test]
async fn a_statement_timeout_shorter_than_the_linger_costs_neither_the_listener_nor_a_message() {
    let db = TestDb::new().await;
    db.set_default("statement_timeout", Some("'300ms'")).await;
    let smtp = SmtpServer::start();
    let running = lingering_dispatcher(&db, &smtp).await;
    db.wait_for_listener().await;
    let listening = |pattern: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                 AND query LIKE $1",
            )
            .bind(pattern)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let listener = listening("LISTEN%").await;

    // The poll interval is ten minutes: each delivery needs a notification, so the
    // listener must outlive each linger that the timeout cuts short.
    for (i, to) in ["one@example.com", "two@example.com"]
        .into_iter()
        .enumerate()
    {
        db.verification_to(to).await;
        smtp.wait_for(i + 1, Duration::from_secs(30)).await;
    }
    let lingering = listening("SELECT pg_sleep%").await;
    running.stop().await;
    assert_eq!(lingering, listener, "the LISTEN connection was replaced");
}

#[tokio::test]
async fn a_message_is_not_sent_before_its_not_before_time() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    let later = outboxd::NewMessage::new("account_verification", verification("later@example.com"))
        .unwrap()
        .with_not_before(chrono::Utc::now() + chrono::Duration::hours(1))
        .unwrap();
    let later = db.store.enqueue(&db.pool, later).await.unwrap();
    let now = db.verification_to("now@example.com").await;

    one_step(&mut app).await;
    assert!(db.row(now).await.dispatched);
    let row = db.row(later).await;
    assert!(!row.dispatched && row.waiting, "{row:?}");
    assert_eq!(smtp.messages().len(), 1);
}

#[tokio::test]
async fn custom_templates_add_kinds_and_override_builtin_ones() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("password_reset")).unwrap();
    std::fs::write(
        dir.path().join("password_reset/subject.txt"),
        "Reset for {{ name }}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("password_reset/body.txt"),
        "Go to {{ reset_url }}\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("account_verification")).unwrap();
    std::fs::write(
        dir.path().join("account_verification/subject.txt"),
        "Welcome, {{ name }}!",
    )
    .unwrap();
    let templates = dir.path().to_str().unwrap();
    let mut app = app(&db, Some(&smtp.url()), &["--templates", templates]).await;

    db.enqueue(
        "password_reset",
        json!({"to": "a@example.com", "name": "Ada", "reset_url": "https://r"}),
    )
    .await;
    db.verification_to("b@example.com").await;
    one_step(&mut app).await;

    let mut received = smtp.messages();
    received.sort_by(|a, b| a.outbox_id.cmp(&b.outbox_id));
    assert_eq!(received[0].subject, "Reset for Ada");
    assert_eq!(
        received[0].text.as_deref().map(str::trim),
        Some("Go to https://r")
    );
    assert_eq!(received[0].html, None);
    assert_eq!(received[1].subject, "Welcome, Ada!");
    assert!(received[1].text.as_deref().unwrap().contains("Hello Ada,"));
}

#[tokio::test]
async fn a_drain_continues_while_batches_come_back_full() {
    let Scenario { db, smtp, mut app } =
        Scenario::new(&["--batch-size", "4", "--smtp-concurrency", "3"]).await;
    for i in 0..10 {
        db.enqueue(
            "account_verification",
            verification(&format!("d{i}@example.com")),
        )
        .await;
    }
    let step = app.dispatcher.drain().await.unwrap();
    assert_eq!(step, batch(&[Claimed(10), Sent(10)]));
    assert_eq!(smtp.messages().len(), 10);
}

#[tokio::test]
async fn a_pooled_connection_the_server_dropped_is_replaced_without_costing_an_attempt() {
    let db = TestDb::new().await;
    let port = crate::helpers::free_port();
    let first = SmtpServer::start_on(port);
    let mut app = app(&db, Some(&first.url()), &["--smtp-concurrency", "1"]).await;
    db.verification_to("a@example.com").await;
    one_step(&mut app).await;
    assert_eq!(first.messages().len(), 1);

    // The server restarts while outboxd keeps its connection in the pool.
    drop(first);
    let second = SmtpServer::start_on(port);
    let id = db.verification_to("b@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Sent(1)]));
    assert_eq!(second.messages().len(), 1);
    let row = db.row(id).await;
    assert!(row.dispatched && row.attempts == 0, "{row:?}");
}

#[tokio::test]
async fn two_databases_migrated_apart_give_their_first_messages_different_message_ids() {
    let smtp = SmtpServer::start();
    let mut tags = Vec::new();
    for _ in 0..2 {
        let db = TestDb::empty().await;
        let migrated = crate::helpers::outboxd()
            .args(["migrate", "--database-url", &db.url])
            .output()
            .expect("outboxd migrate");
        assert!(migrated.status.success(), "{migrated:?}");
        let first = db.verification_to("ada@example.com").await;
        assert_eq!(first, 1, "each database's first message");
        let mut app = app(&db, Some(&smtp.url()), &[]).await;
        one_step(&mut app).await;
        tags.push(db.installation_tag().await);
    }
    let received = smtp.wait_for(2, Duration::from_secs(30)).await;
    let ids: Vec<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
    assert_ne!(
        ids[0], ids[1],
        "a receiver would drop the second as a duplicate"
    );
    assert_ne!(tags[0], tags[1]);
    for (id, tag) in ids.iter().zip(&tags) {
        assert!(id.starts_with(&format!("<outbox-1.{tag}@")), "{id}");
    }
}
