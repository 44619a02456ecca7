//! The recipient lookup is bounded and apart: it reads at most a bounded share of a long
//! backlog, the server stops it at its timeout or when its client leaves, a lookup that
//! finds its connections busy is refused at once, and none of it makes a provider's signed
//! webhook wait (they record through another pool).

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::admin::{TOKEN, admin_app, api_get};
use crate::helpers::{TestDb, eventually, http_get, metric_value};
use crate::webhooks::post_standard;

/// `n` pending messages, not due for a day, so that no claim takes them.
async fn backlog(db: &TestDb, n: i32) {
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, not_before) \
         SELECT 'account_verification', jsonb_build_object('to', 'u' || g || '@example.com'), \
                now() + interval '1 day' \
         FROM generate_series(1, $1) AS g",
    )
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Lookups of the app's database waiting or running now.
async fn lookups_running(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND state = 'active' AND query LIKE '%outbox_single_recipient_key(payload) = ANY%' \
         AND pid <> pg_backend_pid()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

const SECRET: [u8; 32] = [42; 32];

fn whsec() -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SECRET)
    )
}

/// A signed Standard Webhooks complaint, and how long outboxd took to answer it.
async fn signed_complaint(addr: &str, n: usize) -> (u16, Duration) {
    let body = json!({"type": "email.complained", "data": {"email": format!("c{n}@example.com")}})
        .to_string();
    let id = format!("msg_{n}");
    let started = Instant::now();
    let answered = post_standard(addr, &SECRET, &id, &body).await;
    (answered.status, started.elapsed())
}

#[tokio::test]
async fn four_lookups_over_300_000_pending_rows_never_make_a_signed_webhook_wait() {
    let db = TestDb::new().await;
    let first_due = db.verification_to("Ann@Example.com").await;
    backlog(&db, 300_000).await;
    let newest = db.verification_to("bo@example.com").await;
    let (app, addr) = admin_app(&db, None, &["--webhook-secret", &whsec()]).await;
    // The lookups are held at their last step (their audit entry) for as long as an
    // application's transaction holds the audit table: they keep their connections, as
    // slow lookups would.
    let held = db.lock_table("outbox_admin_audit").await;
    let lookups: Vec<_> = (0..4)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let path = "/api/v1/messages?recipient=ann@example.com";
                (api_get(&addr, path).await, started.elapsed())
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "two lookups holding", || async {
        db.sessions("wait_event_type = 'Lock' AND query LIKE 'INSERT INTO outbox_admin_audit%'")
            .await
            == 2
    })
    .await;
    for n in 0..20 {
        let (status, took) = signed_complaint(&addr, n).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "a webhook waited {took:?}");
    }
    held.rollback().await.unwrap();
    let mut answered = 0;
    for lookup in lookups {
        let (response, took) = lookup.await.unwrap();
        assert!(took < Duration::from_secs(6), "a lookup took {took:?}");
        let body: Value = serde_json::from_str(&response.body).unwrap();
        match response.status {
            200 => {
                answered += 1;
                assert_eq!(body["messages"][0]["id"], first_due, "{body}");
                // The backlog is longer than a lookup reads, and the answer says so.
                assert_eq!(body["pending_searched_all"], false, "{body}");
            }
            503 => assert_eq!(body["error"]["code"], "lookups_busy", "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    // The two held are answered; the others were either refused as busy or got a
    // connection once the held ones let go.
    assert!(answered >= 2, "{answered} answered");
    // The message just enqueued is found too, at the far end of the backlog.
    let newest_found = api_get(&addr, "/api/v1/messages?recipient=bo@example.com").await;
    let body: Value = serde_json::from_str(&newest_found.body).unwrap();
    assert_eq!(body["messages"][0]["id"], newest, "{body}");
    // Each answered lookup is in the audit, as the actor's lookup of the address.
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_admin_audit \
         WHERE action = 'lookup' AND actor = 'api:alice' AND target = 'ann@example.com'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(audited, answered);
    drop(app);
}

#[tokio::test]
async fn a_lookup_is_stopped_at_its_timeout_refused_when_busy_and_ended_when_its_client_leaves() {
    let db = TestDb::new().await;
    let (app, addr) = admin_app(&db, None, &[]).await;
    // An application's migration holds the table: every lookup waits on it.
    let mut migration = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *migration)
        .await
        .unwrap();

    // A client that leaves: the server ends its statement within a second, not at the
    // timeout.
    let mut leaving = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "GET /api/v1/messages?recipient=a@example.com HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {TOKEN}\r\n\r\n"
    );
    leaving.write_all(request.as_bytes()).await.unwrap();
    eventually(Duration::from_secs(5), "the lookup waiting", || async {
        lookups_running(&db).await == 1
    })
    .await;
    drop(leaving);
    let left = Instant::now();
    eventually(
        Duration::from_secs(3),
        "the abandoned lookup ended",
        || async { lookups_running(&db).await == 0 },
    )
    .await;
    assert!(
        left.elapsed() < Duration::from_millis(1500),
        "{:?}",
        left.elapsed()
    );

    // Two lookups take both connections; a third is refused at once.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let answered = api_get(&addr, "/api/v1/messages?recipient=b@example.com").await;
                (answered, started.elapsed())
            })
        })
        .collect();
    eventually(Duration::from_secs(5), "two lookups waiting", || async {
        lookups_running(&db).await == 2
    })
    .await;
    let started = Instant::now();
    let busy = api_get(&addr, "/api/v1/messages?recipient=c@example.com").await;
    assert_eq!(busy.status, 503, "{}", busy.body);
    assert!(busy.body.contains("lookups_busy"), "{}", busy.body);
    assert!(started.elapsed() < Duration::from_secs(2));
    for lookup in waiting {
        let (answered, took) = lookup.await.unwrap();
        assert_eq!(answered.status, 503, "{}", answered.body);
        let body: Value = serde_json::from_str(&answered.body).unwrap();
        assert_eq!(body["error"]["code"], "lookup_timed_out", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("5s"),
            "{body}"
        );
        assert!(took < Duration::from_secs(7), "{took:?}");
    }
    migration.rollback().await.unwrap();

    let (_, metrics) = http_get(&app.http_addr().to_string(), "/metrics").await;
    for (result, at_least) in [("busy", 1.0), ("timed_out", 2.0)] {
        let series = format!("outbox_recipient_lookups_total{{result=\"{result}\"}}");
        assert!(
            metric_value(&metrics, &series).is_some_and(|n| n >= at_least),
            "{series}: {metrics}"
        );
    }
}
