//! Delivery callbacks to the application (`OUTBOXD_CALLBACK_URL`), against the binary, a
//! real SMTP server and a receiver that verifies every request with the `standardwebhooks`
//! package from PyPI: every terminal event of 2 000 messages arrives signed, none lost and
//! none out of order per message, through a minute with the receiver down and a replica
//! killed meanwhile; and settings that cannot be meant are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::helpers::{
    CALLBACK_SECRET, CallbackReceiver, Outboxd, SmtpServer, TestDb, eventually, http_get,
    metric_value, run_refused,
};
use crate::webhooks::post_standard;

/// The feedback webhook's secret (complaints come in through it).
const FEEDBACK_SECRET: [u8; 32] = [7; 32];

/// Inserts `n` verification emails to `<prefix><i>@example.com`; with `later`, due in an
/// hour and keyed `<prefix><i>`.
async fn batch(db: &TestDb, prefix: &str, n: i32, later: bool) {
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, not_before, idempotency_key, tags) \
         SELECT 'account_verification', jsonb_build_object('to', $1 || g || '@example.com', \
                'name', 'Ada', 'verify_url', 'https://app.example/v'), \
                CASE WHEN $3 THEN now() + interval '1 hour' ELSE now() END, \
                CASE WHEN $3 THEN $1 || g END, ARRAY['batch:' || $1] \
         FROM generate_series(1, $2) g",
    )
    .bind(prefix)
    .bind(n)
    .bind(later)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn replica(db: &TestDb, smtp: &SmtpServer, receiver: &CallbackReceiver) -> Outboxd {
    let whsec = format!(
        "whsec_{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, FEEDBACK_SECRET)
    );
    let flags = [
        "--callback-url",
        &receiver.url(),
        "--webhook-secret",
        &whsec,
        "--sample-interval",
        "200ms",
    ];
    Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &flags,
        &[("OUTBOXD_CALLBACK_SECRET", CALLBACK_SECRET)],
    )
    .await
}

async fn gauge(outboxd: &Outboxd, series: &str) -> f64 {
    metric_value(&http_get(&outboxd.http, "/metrics").await.1, series).unwrap_or(0.0)
}

#[tokio::test]
async fn every_terminal_event_arrives_signed_and_in_order_through_an_outage_and_a_kill() {
    let db = TestDb::new().await;
    db.exec(
        "INSERT INTO outbox_suppressions (address, reason, source) \
         SELECT 'supp' || g || '@example.com', 'manual', 'operator' FROM generate_series(1, 100) g",
    )
    .await;
    batch(&db, "ok", 1500, false).await;
    batch(&db, "unknown", 100, false).await;
    batch(&db, "reject", 100, false).await;
    batch(&db, "supp", 100, false).await;
    batch(&db, "later", 200, true).await;
    let smtp = SmtpServer::start();
    let mut receiver = CallbackReceiver::start();
    let outboxd = replica(&db, &smtp, &receiver).await;
    db.exec("SELECT outbox_cancel('later' || g, 'billing') FROM generate_series(1, 200) g")
        .await;
    receiver.wait_for(300, Duration::from_secs(60)).await;

    // The endpoint goes down; complaints about 100 sent messages come in meanwhile, and
    // the replica is killed and started again.
    receiver.stop();
    let complaints: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, payload->>'to' FROM outbox_messages WHERE payload->>'to' LIKE 'ok%' \
         ORDER BY id LIMIT 100",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let complained: Vec<i64> = complaints.iter().map(|(id, _)| *id).collect();
    eventually(Duration::from_secs(60), "the 100 sent", || async {
        db.scalar::<i64, _>(
            "SELECT count(*) FROM outbox_messages WHERE id = ANY($1) AND dispatched_at IS NOT NULL",
            complained.clone(),
        )
        .await
            == 100
    })
    .await;
    for (id, to) in &complaints {
        let body = serde_json::json!({"type": "email.complained",
            "data": {"email": to, "outbox_id": id}});
        let answered = post_standard(
            &outboxd.http,
            &FEEDBACK_SECRET,
            &format!("c{id}"),
            &body.to_string(),
        )
        .await;
        assert_eq!(answered.status, 200, "{}", answered.body);
    }
    drop(outboxd);
    let outboxd = replica(&db, &smtp, &receiver).await;
    eventually(
        Duration::from_secs(120),
        "the oldest callback waiting a minute",
        || async { gauge(&outboxd, "outbox_callback_oldest_age_seconds").await >= 60.0 },
    )
    .await;
    receiver.start_again(&[]);

    // 1500 sent, 100 bounced, 100 dead-lettered, 100 suppressed, 200 cancelled, and 100
    // complaints after their sends.
    let received = receiver.wait_for(2100, Duration::from_secs(240)).await;
    assert!(receiver.forged().is_empty(), "{:?}", receiver.forged());
    let mut first: BTreeMap<String, &crate::helpers::Callback> = BTreeMap::new();
    let mut per_message: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for callback in &received {
        if let Some(earlier) = first.get(&callback.webhook_id) {
            // At least once: a repeat says the same.
            assert_eq!(
                (&earlier.event, &earlier.data),
                (&callback.event, &callback.data)
            );
            continue;
        }
        first.insert(callback.webhook_id.clone(), callback);
        per_message
            .entry(callback.message_id())
            .or_default()
            .push(callback.event.clone());
    }
    let count = |event: &str| first.values().filter(|c| c.event == event).count();
    assert_eq!(
        [
            "message.sent",
            "message.bounced",
            "message.dead_lettered",
            "message.suppressed",
            "message.cancelled",
            "message.complained"
        ]
        .map(count),
        [1500, 100, 100, 100, 200, 100]
    );
    assert_eq!(per_message.len(), 2000, "one end for every message");
    for id in &complained {
        assert_eq!(
            per_message[id],
            ["message.sent", "message.complained"],
            "message {id}"
        );
    }
    let cancelled = first
        .values()
        .find(|c| c.event == "message.cancelled")
        .expect("a cancellation");
    assert_eq!(cancelled.data["kind"], "account_verification");
    assert!(
        cancelled.data["idempotency_key"]
            .as_str()
            .is_some_and(|k| k.starts_with("later")),
        "{:?}",
        cancelled.data
    );
    assert_eq!(cancelled.data["tags"], serde_json::json!(["batch:later"]));
    assert_eq!(cancelled.data["detail"], "billing");
    assert!(
        chrono::DateTime::parse_from_rfc3339(&cancelled.timestamp).is_ok(),
        "{}",
        cancelled.timestamp
    );
    let sent = first
        .values()
        .find(|c| c.event == "message.sent")
        .expect("a send");
    assert!(
        sent.data["detail"]
            .as_str()
            .is_some_and(|reply| reply.starts_with("250")),
        "the relay's reply: {:?}",
        sent.data
    );
    let webhook_ids: BTreeSet<&String> = first.keys().collect();
    assert_eq!(webhook_ids.len(), 2100);
    eventually(Duration::from_secs(10), "nothing left to send", || async {
        gauge(&outboxd, "outbox_callbacks_pending").await == 0.0
    })
    .await;
    assert!(
        gauge(
            &outboxd,
            "outbox_callback_failures_total{reason=\"unreachable\"}"
        )
        .await
            > 0.0
    );
}

#[test]
fn callback_settings_that_cannot_be_meant_are_refused() {
    let relay = [
        "--smtp-url",
        "smtp://127.0.0.1:2525",
        "--from",
        "a@example.com",
    ];
    let with = |more: &[&'static str]| {
        let mut flags = relay.to_vec();
        flags.extend(more);
        flags
    };
    run_refused(
        &with(&["--callback-url", "https://app.example/cb"]),
        "OUTBOXD_CALLBACK_URL is set but OUTBOXD_CALLBACK_SECRET (or _FILE) is not",
    );
    run_refused(
        &with(&["--callback-secret", CALLBACK_SECRET]),
        "OUTBOXD_CALLBACK_SECRET is set but OUTBOXD_CALLBACK_URL is not",
    );
    for (url, says) in [
        (
            "ftp://app.example/cb",
            "expected an http:// or https:// URL",
        ),
        ("not a url", "invalid --callback-url"),
        ("https://user:pw@app.example/cb", "credentials in the URL"),
    ] {
        let said = run_refused(
            &with(&["--callback-url", url, "--callback-secret", CALLBACK_SECRET]),
            says,
        );
        assert!(!said.contains("pw@"), "{said}");
    }
    let said = run_refused(
        &with(&[
            "--callback-url",
            "https://app.example/cb",
            "--callback-secret",
            "whsec_c2hvcnQ=",
        ]),
        "invalid OUTBOXD_CALLBACK_SECRET: the secret must be at least 24 bytes",
    );
    assert!(!said.contains("c2hvcnQ"), "{said}");
}
