//! Delivery policy for real relays: a send-rate limit all replicas share, throttling
//! replies that slow the pace without costing attempts, priorities, expiry and
//! idempotent enqueue.

use std::time::Duration;

use crate::helpers::Count::{Claimed, Expired, Sent};
use crate::helpers::{
    Outboxd, SmtpServer, TestDb, app, batch, eventually, http_get, one_step, outboxd, verification,
};

/// The most messages the server took in any one-second window.
/// The most messages received within any `window` seconds.
pub(crate) fn busiest(mut times: Vec<f64>, window: f64) -> usize {
    times.sort_by(f64::total_cmp);
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|&&t| t < times[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// `n` verification emails to `bulk<i>@example.com`, committed at once: a backlog.
async fn backlog(db: &TestDb, n: i32) {
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload) \
         SELECT 'account_verification', jsonb_build_object('to', 'bulk' || g || '@example.com', \
                'name', 'Bulk', 'verify_url', 'https://app.example/v') \
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn enqueue_many(db: &TestDb, prefix: &str, n: usize) {
    for i in 0..n {
        db.enqueue(
            "account_verification",
            verification(&format!("{prefix}-{i}@example.com")),
        )
        .await;
    }
}

/// A message of priority 10 to `to`.
fn urgent(to: &str) -> outboxd::NewMessage {
    outboxd::NewMessage::new("account_verification", verification(to))
        .and_then(|message| message.with_priority(10))
        .expect("a valid message")
}

fn replicas(db: &TestDb, smtp: &SmtpServer, n: usize, limit: &str) -> Vec<Outboxd> {
    (0..n)
        .map(|i| {
            let worker = format!("replica-{i}");
            let flags = [
                "--smtp-url",
                &smtp.url(),
                "--from",
                "Acme <no-reply@acme.example>",
                "--rate-limit",
                limit,
                "--worker-id",
                &worker,
                "--batch-size",
                "100",
            ];
            Outboxd::start_unready(&db.url, &flags, &[])
        })
        .collect()
}

#[tokio::test]
async fn two_and_four_replicas_together_stay_under_a_global_rate_limit() {
    const LIMIT: usize = 50;
    for count in [2, 4] {
        let db = TestDb::new().await;
        let smtp = SmtpServer::start();
        enqueue_many(&db, &format!("r{count}"), 300).await;
        let running = replicas(&db, &smtp, count, "50/s");
        let received = smtp.wait_for(300, Duration::from_secs(60)).await;
        // An outcome is written a moment after the server accepted its message: wait for
        // all of them before the replicas are killed.
        eventually(
            Duration::from_secs(30),
            "every outcome recorded",
            || async { db.count("dispatched").await == 300 },
        )
        .await;
        drop(running);
        let times: Vec<f64> = received.iter().map(|m| m.received_at).collect();
        let span = times.iter().copied().fold(f64::MIN, f64::max)
            - times.iter().copied().fold(f64::MAX, f64::min);
        // The documented bound: the limit plus one a second, plus what uneven send times
        // add (sends that started late catch up). Over three seconds, so that a process
        // held up for a few hundred milliseconds on this shared machine (the whole suite
        // runs at once) stays within a fifth, while replicas that each took the whole
        // limit would send twice as many.
        const WINDOW: usize = 3;
        let busiest = busiest(times, WINDOW as f64);
        assert!(
            busiest <= (WINDOW * LIMIT) + (WINDOW * LIMIT) / 5,
            "{count} replicas: {busiest} messages in {WINDOW} seconds under a limit of {LIMIT}/s"
        );
        assert!(
            span >= 300.0 / LIMIT as f64 - 1.5,
            "{count} replicas sent 300 messages in {span:.1} s at {LIMIT}/s"
        );
    }
}

#[tokio::test]
pub(crate) async fn throttling_replies_slow_the_pace_and_cost_no_attempt() {
    let db = TestDb::new().await;
    // Every fourth message gets `454 4.7.0 Throttling failure` for the first 20 s, whatever
    // the rate: a share refused that no pace would lower.
    let smtp = SmtpServer::start_with(
        crate::helpers::free_port(),
        &["--throttle-every", "4", "--throttle-for", "20"],
    );
    enqueue_many(&db, "t", 600).await;
    let flags = ["--rate-limit", "40/s", "--max-attempts", "1"];
    // Two replicas share the pace, and what one learns of the relay.
    let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
    let other = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
    let pace = |body: &str| {
        body.lines()
            .find_map(|l| {
                l.strip_prefix("outbox_send_rate_limit_per_second{lane=\"transactional\"} ")
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    // The pace is cut, then grows back while the relay goes on refusing a quarter: cutting
    // a quarter again every second took a 50/s pace down to 2.2/s with one replica.
    let (mut lowest, mut grew_back_at) = (f64::INFINITY, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while smtp.messages().len() < 600 {
        assert!(std::time::Instant::now() < deadline, "600 not delivered");
        let (_, body) = http_get(&outboxd.http, "/metrics").await;
        let now = pace(&body).unwrap_or(0.0);
        if now > 0.0 && now < 40.0 {
            lowest = lowest.min(now);
        }
        if now >= lowest + 3.0 && grew_back_at.is_none() {
            grew_back_at = Some(smtp.throttled());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lowest < 40.0, "the pace was never cut below 40/s");
    assert!(
        lowest >= 8.0,
        "a quarter refused took the pace to {lowest:.1}/s"
    );
    let tolerated: f64 = sqlx::query_scalar("SELECT max(tolerated_share) FROM outbox_send_rate")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(tolerated > 0.0, "the replicas learnt no share to tolerate");
    let refused_then = grew_back_at.expect("the pace grew back from its lowest");
    assert!(
        smtp.throttled() > refused_then,
        "the pace grew back only once the relay stopped refusing"
    );
    // Each reply is counted by the replica that met it.
    let mut throttled = 0.0;
    for replica in [&outboxd, &other] {
        let (_, body) = http_get(&replica.http, "/metrics").await;
        throttled += body
            .lines()
            .find_map(|l| l.strip_prefix("outbox_throttled_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("outbox_throttled_total");
    }
    assert_eq!(throttled as usize, smtp.throttled());
    // With one attempt allowed, any counted attempt would have dead-lettered a message.
    assert_eq!(db.count("dead").await, 0);
    let attempts: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(attempts), 0) FROM outbox_messages")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, 0);
}

#[tokio::test]
pub(crate) async fn a_high_priority_message_overtakes_a_backlog_and_an_old_one_is_not_starved() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    backlog(&db, 5000).await;
    let urgent_id = db
        .store
        .enqueue(&db.pool, urgent("urgent@example.com"))
        .await
        .unwrap();
    let mut app = app(&db, Some(&smtp.url()), &["--batch-size", "25"]).await;
    one_step(&mut app).await;
    let first_batch = smtp.messages();
    assert_eq!(first_batch.len(), 25);
    assert!(
        first_batch
            .iter()
            .any(|m| m.outbox_id == urgent_id.to_string()),
        "the priority-10 message was not in the first batch"
    );

    // Aging: a priority point is a minute. A message that has waited twenty minutes goes
    // before a priority-10 one that has just arrived.
    db.exec("DELETE FROM outbox_messages").await;
    let old: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, not_before) \
         VALUES ('account_verification', $1, now() - interval '20 minutes') RETURNING id",
    )
    .bind(verification("patient@example.com"))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    db.store
        .enqueue(&db.pool, urgent("urgent2@example.com"))
        .await
        .unwrap();
    let mut app = crate::helpers::app(&db, Some(&smtp.url()), &["--batch-size", "1"]).await;
    one_step(&mut app).await;
    let last = smtp.messages().pop().expect("a message");
    assert_eq!(last.outbox_id, old.to_string());
}

#[tokio::test]
async fn a_priority_message_is_not_held_back_by_an_older_row_an_application_has_locked() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let due = |to: &'static str, priority: i32, minutes_ago: i32| {
        sqlx::query_scalar::<_, i64>(
            "INSERT INTO outbox_messages (kind, payload, priority, not_before) \
             VALUES ('account_verification', $1, $2, now() - make_interval(mins => $3)) \
             RETURNING id",
        )
        .bind(verification(to))
        .bind(priority)
        .bind(minutes_ago)
        .fetch_one(&db.pool)
    };
    let locked = due("locked@example.com", 0, 10).await.unwrap();
    let urgent = due("urgent@example.com", 1, 5).await.unwrap();
    let plain = due("plain@example.com", 0, 4).await.unwrap();
    // The oldest due row is held by an application's transaction, as an UPDATE left open
    // would hold it. A priority-1 row goes before priority-0 rows due a minute after it,
    // and the oldest of those that can be claimed now is `plain`.
    let application = db.hold_row(locked, "FOR UPDATE").await;
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    one_step(&mut app).await;
    let mut sent: Vec<String> = smtp
        .wait_for(2, Duration::from_secs(30))
        .await
        .into_iter()
        .map(|m| m.outbox_id)
        .collect();
    sent.sort();
    let mut expected = [urgent.to_string(), plain.to_string()];
    expected.sort();
    assert_eq!(sent, expected);
    application.rollback().await.unwrap();
}

#[tokio::test]
async fn without_a_limit_a_relay_that_takes_40_a_second_sets_the_pace_with_few_refusals() {
    let db = TestDb::new().await;
    // Takes 40 messages a second (a second's burst) and answers 454 4.7.0 to the rest.
    let smtp = SmtpServer::start_with(crate::helpers::free_port(), &["--accept-rate", "40"]);
    enqueue_many(&db, "r", 300).await;
    let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    let received = smtp.wait_for(300, Duration::from_secs(120)).await;
    let ids: std::collections::HashSet<&str> =
        received.iter().map(|m| m.outbox_id.as_str()).collect();
    assert_eq!((received.len(), ids.len()), (300, 300), "each once");
    // Pausing a second per refusal, as outboxd did, drew about four refusals per message
    // from this relay; a found pace draws its refusals while it settles, about 120 here.
    assert!(
        smtp.throttled() < 300,
        "{} throttling replies for 300 messages",
        smtp.throttled()
    );
    let attempts: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(attempts), 0) FROM outbox_messages")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, 0, "a throttling reply charges no attempt");
    // The found pace is exported as a configured one is.
    let (_, body) = http_get(&outboxd.http, "/metrics").await;
    let pace = body
        .lines()
        .find_map(|l| l.strip_prefix("outbox_send_rate_limit_per_second{lane=\"transactional\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(pace.is_some_and(|p| p > 0.0), "{body}");
}

/// Where the message `id` arrived at `smtp`, counting from 0.
fn arrival_of(smtp: &SmtpServer, id: i64) -> Option<usize> {
    smtp.messages()
        .iter()
        .position(|m| m.outbox_id == id.to_string())
}

#[tokio::test]
pub(crate) async fn a_priority_message_inserted_while_a_drain_runs_overtakes_its_backlog() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    backlog(&db, 3000).await;
    let smtp_url = smtp.url();
    let flags = [
        "--batch-size",
        "25",
        "--max-batch-size",
        "25",
        "--smtp-concurrency",
        "2",
    ];
    let _outboxd = Outboxd::start(
        &db.url,
        &flags,
        &[
            ("OUTBOXD_SMTP_URL", &smtp_url),
            ("OUTBOXD_FROM", "Acme <no-reply@acme.example>"),
        ],
    )
    .await;
    // The drain is under way: a few batches of the backlog are out.
    smtp.wait_for(200, Duration::from_secs(60)).await;
    let urgent_id = db
        .store
        .enqueue(&db.pool, urgent("reset@example.com"))
        .await
        .unwrap();
    let sent_before = smtp.messages().len();
    let arrived =
        crate::helpers::poll_until(Duration::from_secs(60), "the priority message", || async {
            arrival_of(&smtp, urgent_id)
        })
        .await;
    // The claim under way and the next may have been taken already; then it goes first.
    let batches_after = arrived.saturating_sub(sent_before) / 25;
    assert!(
        batches_after <= 3,
        "sent after {arrived} messages, {sent_before} of them out when it was committed"
    );
    assert!(
        arrived < 3000 - 100,
        "it waited for the backlog: sent after {arrived}"
    );
}

#[tokio::test]
pub(crate) async fn an_expired_message_is_never_sent_and_is_reported_as_expired() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let late = outboxd::NewMessage::new("account_verification", verification("late@example.com"))
        .unwrap()
        .with_expires_at(chrono::Utc::now() - chrono::Duration::seconds(1))
        .unwrap();
    let own_deadline = db.store.enqueue(&db.pool, late).await.unwrap();
    // A kind's default lifetime counts from created_at.
    let by_kind: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, created_at) \
         VALUES ('workspace_invite', $1, now() - interval '2 hours') RETURNING id",
    )
    .bind(
        serde_json::json!({"to": "old@example.com", "inviter_name": "Ada",
                             "workspace_name": "Engines", "accept_url": "https://app.example/i/1"}),
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let fresh = db.verification_to("fresh@example.com").await;
    let mut app = app(
        &db,
        Some(&smtp.url()),
        &["--expire-after", "workspace_invite=1h"],
    )
    .await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(3), Sent(1), Expired(2)]));
    let received = smtp.messages();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].outbox_id, fresh.to_string());
    for id in [own_deadline, by_kind] {
        let detail = outboxd::store::admin::message(&db.store, id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(detail.state.as_str(), "expired");
        assert_eq!(detail.end_reason.as_deref(), Some("expired"));
    }
    // The API shows it in its state; the dead-letter endpoints do not.
    let (_admin, addr) = crate::admin::admin_app(&db, None, &[]).await;
    let shown = crate::admin::api_get(&addr, &format!("/api/v1/messages/{by_kind}")).await;
    assert_eq!(shown.status, 200);
    assert_eq!(shown.json()["state"], "expired");
    let as_dead = crate::admin::api_get(&addr, &format!("/api/v1/dead-letters/{by_kind}")).await;
    assert_eq!(as_dead.status, 404);
    // Not a dead letter: the gauge and the dead-letter list leave it out.
    let sample = outboxd::store::sample(&db.store, Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!(sample.totals.dead_letters, 0);
    assert_eq!(sample.totals.pending, 0);
    let stats = outboxd::store::stats::stats(&db.store).await.unwrap();
    assert_eq!(stats.expired_last_hour, 2);
    let cli = outboxd()
        .args(["stats", "--database-url", &db.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(table.contains("EXPIRED LAST HOUR"), "{table}");
    let cli = outboxd()
        .args([
            "dead-letters",
            "show",
            &by_kind.to_string(),
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&cli.stdout);
    assert!(shown.contains(r#""state": "expired""#), "{shown}");
}

#[tokio::test]
pub(crate) async fn a_duplicate_idempotency_key_yields_one_row_and_one_email() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let keyed = || {
        outboxd::NewMessage::new("account_verification", verification("once@example.com"))
            .unwrap()
            .with_idempotency_key("signup-42")
            .unwrap()
    };
    let first = db.store.enqueue(&db.pool, keyed()).await.unwrap();
    let again = db.store.enqueue(&db.pool, keyed()).await.unwrap();
    assert_eq!(first, again);
    // A producer in any language: a plain INSERT ... ON CONFLICT DO NOTHING.
    let inserted = sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, idempotency_key) \
         VALUES ('account_verification', $1, 'signup-42') ON CONFLICT DO NOTHING",
    )
    .bind(verification("once@example.com"))
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(inserted.rows_affected(), 0);
    // And the CLI.
    for _ in 0..2 {
        let output = outboxd()
            .args([
                "enqueue",
                "--database-url",
                &db.url,
                "--kind",
                "account_verification",
            ])
            .args(["--payload", &verification("once@example.com").to_string()])
            .args(["--idempotency-key", "signup-42"])
            .output()
            .unwrap();
        assert!(output.status.success());
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            first.to_string()
        );
    }
    assert_eq!(db.count("all").await, 1);
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    one_step(&mut app).await;
    assert_eq!(smtp.messages().len(), 1);
}
