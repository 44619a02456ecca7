//! The pace found without `OUTBOXD_RATE_LIMIT`, against a real SMTP server: it is found
//! only from a reply that says the relay is throttling, and it does not outlive the
//! push-back (the two faults a probe found: one echoed reply, or one ordinary `451 4.7.1`
//! episode, held a replica at 1 message a second until it restarted).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, free_port, http_get, metric_value, verification,
};

fn epoch_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// `n` verification emails to `<prefix><i>@example.com`, committed at once.
async fn backlog(db: &TestDb, prefix: &str, n: i32) {
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload) \
         SELECT 'account_verification', jsonb_build_object('to', $1 || g || '@example.com', \
                'name', 'Bulk', 'verify_url', 'https://app.example/v') \
         FROM generate_series(1, $2) g",
    )
    .bind(prefix)
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Commits `n` messages and waits until the server has `total` in all: the seconds from the
/// commit to the last arrival.
async fn drain(
    db: &TestDb,
    smtp: &SmtpServer,
    prefix: &str,
    total: usize,
    within: Duration,
) -> f64 {
    let committed = epoch_seconds();
    let n = i32::try_from(total - smtp.messages().len()).expect("a few hundred");
    backlog(db, prefix, n).await;
    let received = smtp.wait_for(total, within).await;
    received
        .iter()
        .map(|m| m.received_at)
        .fold(f64::MIN, f64::max)
        - committed
}

async fn metrics(outboxd: &Outboxd) -> String {
    http_get(&outboxd.http, "/metrics").await.1
}

fn relay_flags(smtp: &SmtpServer) -> [String; 4] {
    [
        "--smtp-url".into(),
        smtp.url(),
        "--from".into(),
        "Acme <no-reply@acme.example>".into(),
    ]
}

#[tokio::test]
async fn a_reply_that_echoes_rate_in_an_address_changes_nothing_measurable() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let flags = relay_flags(&smtp);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::start(&db.url, &flags, &[]).await;
    let before = drain(&db, &smtp, "before", 300, Duration::from_secs(60)).await;

    // Postfix's reject_unknown_recipient_domain, echoing a sign-up as rate@<a domain that
    // does not resolve>: `450 4.1.2 <rate@nxdomain.example>: ... Domain not found`.
    let echoed = db
        .enqueue(
            "account_verification",
            verification("reply-postfix-domain-not-found-x@example.com"),
        )
        .await;
    eventually(Duration::from_secs(30), "the refusal recorded", || async {
        db.row(echoed).await.attempts == 1
    })
    .await;
    let after = drain(&db, &smtp, "after", 600, Duration::from_secs(60)).await;

    // The bug paced the replica at 1/s: 300 messages in 5 minutes. Three times the drain
    // before, with a floor for a machine the rest of the suite keeps busy.
    assert!(
        after <= (3.0 * before).max(3.0),
        "300 messages took {after:.2} s after the echoed reply, {before:.2} s before"
    );
    let body = metrics(&outboxd).await;
    assert_eq!(metric_value(&body, "outbox_throttled_total"), Some(0.0));
    assert_eq!(
        metric_value(
            &body,
            "outbox_send_rate_limit_per_second{lane=\"transactional\"}"
        ),
        Some(0.0),
        "no pace was found"
    );
    assert!(
        db.row(echoed)
            .await
            .last_error
            .unwrap()
            .contains("450 4.1.2"),
        "the refusal is the message's own"
    );
}

#[tokio::test]
async fn thirty_seconds_after_a_throttling_episode_the_found_pace_is_forgotten() {
    let db = TestDb::new().await;
    // For its first 5 s the relay answers every message `451 4.7.1`, as a provider does
    // through an ordinary deferral episode; then it takes everything.
    let smtp = SmtpServer::start_with(
        free_port(),
        &[
            "--throttle-every",
            "1",
            "--throttle-for",
            "5",
            "--throttle-reply",
            "451 4.7.1 Temporarily deferred: too much mail from 127.0.0.1",
        ],
    );
    let flags = relay_flags(&smtp);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::start(&db.url, &flags, &[]).await;
    drain(&db, &smtp, "episode", 30, Duration::from_secs(120)).await;
    let episode_ended = smtp.last_throttled_at().expect("the relay throttled");
    let body = metrics(&outboxd).await;
    assert!(
        metric_value(
            &body,
            "outbox_send_rate_limit_per_second{lane=\"transactional\"}"
        )
        .is_some_and(|p| p > 0.0),
        "a pace was found: {body}"
    );

    // The scenario's own time: the done-when's 30 seconds after the episode.
    let wait = episode_ended + 30.0 - epoch_seconds();
    tokio::time::sleep(Duration::from_secs_f64(wait.max(0.0))).await;
    let took = drain(&db, &smtp, "later", 330, Duration::from_secs(20)).await;
    assert!(took <= 20.0, "300 messages took {took:.1} s");
    let body = metrics(&outboxd).await;
    assert_eq!(
        metric_value(
            &body,
            "outbox_send_rate_limit_per_second{lane=\"transactional\"}"
        ),
        Some(0.0),
        "the found pace is forgotten"
    );
}

#[tokio::test]
async fn the_pace_hears_throttling_that_costs_a_message_an_attempt() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start_with(
        free_port(),
        &["--throttle-every", "1", "--throttle-for", "3600"],
    );
    // Messages that have met as many throttling replies as cost no attempt: each further
    // one is a retry, not a release, and must still slow the pace.
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, throttled_releases) \
         SELECT 'account_verification', jsonb_build_object('to', 'cap' || g || '@example.com', \
                'name', 'Cap', 'verify_url', 'https://app.example/v'), 20 \
         FROM generate_series(1, 30) g",
    )
    .await;
    let flags = relay_flags(&smtp);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::start(&db.url, &flags, &[]).await;
    eventually(Duration::from_secs(30), "a pace found", || async {
        metric_value(
            &metrics(&outboxd).await,
            "outbox_send_rate_limit_per_second{lane=\"transactional\"}",
        )
        .is_some_and(|pace| pace > 0.0)
    })
    .await;
    let attempts: i64 = sqlx::query_scalar("SELECT sum(attempts) FROM outbox_messages")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(attempts > 0, "the refusals were the messages' retries");
}
