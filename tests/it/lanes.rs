//! Lanes: with OUTBOXD_BULK_KINDS, transactional messages go ahead of a bulk run that is
//! already draining under a shared rate limit, and the lanes' gauges say which is which.

use std::time::Duration;

use crate::helpers::succeeds;
use crate::helpers::{Outboxd, SmtpServer, TestDb, eventually, http_get, metric_value};

const BULK: &str = "workspace_invite";
const TRANSACTIONAL: &str = "account_verification";

/// Bulk messages sent after message `id` was committed and before it was sent.
async fn bulk_sent_ahead_of(db: &TestDb, id: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox_messages AS b, outbox_messages AS t \
         WHERE t.id = $1 AND b.kind = $2 \
           AND b.dispatched_at > t.created_at AND b.dispatched_at < t.dispatched_at",
    )
    .bind(id)
    .bind(BULK)
    .fetch_one(&db.pool)
    .await
    .expect("count")
}

#[tokio::test]
async fn transactional_messages_go_ahead_of_a_bulk_run_that_is_draining_under_a_shared_limit() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let flags = [
        "--rate-limit",
        "40/s",
        "--bulk-kinds",
        BULK,
        "--sample-interval",
        "200ms",
    ];
    let replicas = [
        Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await,
        Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await,
    ];
    let bulk = 600;
    db.insert_many(BULK, bulk).await;
    eventually(
        Duration::from_secs(30),
        "the bulk run under way",
        || async { db.sent_of(BULK).await >= 40 },
    )
    .await;
    let mut ahead = Vec::new();
    for _ in 0..5 {
        let id = db.insert_many(TRANSACTIONAL, 1).await[0];
        eventually(
            Duration::from_secs(30),
            "the transactional message sent",
            || async { db.sent_of(TRANSACTIONAL).await == i64::try_from(ahead.len() + 1).unwrap() },
        )
        .await;
        ahead.push(bulk_sent_ahead_of(&db, id).await);
    }
    let left = i64::from(bulk) - db.sent_of(BULK).await;
    assert!(left > 100, "the bulk run ended first: {left} left");
    // Only what was booked before each commit goes ahead of it: the replicas book a
    // second of sends ahead (dispatch::pace), and a claim waits for its replica's batch,
    // so two seconds at 40/s at most, and a little slack; one lane sent the whole backlog
    // first (more than 500 here).
    assert!(
        ahead.iter().all(|&n| n <= 100),
        "bulk sent ahead: {ahead:?}"
    );

    let body = http_get(&replicas[0].http, "/metrics").await.1;
    let bulk_ready = metric_value(&body, "outbox_lane_ready_messages{lane=\"bulk\"}");
    assert!(bulk_ready.is_some_and(|n| n > 0.0), "{bulk_ready:?}");
    let sent_bulk = metric_value(&body, "outbox_lane_sent_total{lane=\"bulk\"}");
    assert!(sent_bulk.is_some_and(|n| n > 0.0), "{sent_bulk:?}");
}

/// The mixin's delivery objectives read `outbox_delivery_latency_seconds` of one lane below
/// one bucket: every objective's lane and threshold must be series outboxd exposes.
#[tokio::test]
async fn every_delivery_objective_reads_a_latency_bucket_outboxd_exposes() {
    let shown = succeeds(
        std::process::Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/mixin/generate.py"))
            .arg("--show-config"),
        "mixin/generate.py --show-config",
    );
    let config: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let objectives = config["deliverySLOs"].as_array().unwrap();
    assert!(!objectives.is_empty());

    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd =
        Outboxd::sending_to(&db.url, &smtp.url(), &[], &[("OUTBOXD_BULK_KINDS", BULK)]).await;
    db.insert_many(TRANSACTIONAL, 1).await;
    db.insert_many(BULK, 1).await;
    smtp.wait_for(2, Duration::from_secs(30)).await;
    eventually(Duration::from_secs(30), "both lanes' latency observed", || async {
        let body = http_get(&outboxd.http, "/metrics").await.1;
        objectives.iter().all(|slo| {
            let lane = slo["lane"].as_str().unwrap();
            let threshold = slo["thresholdSeconds"].as_f64().unwrap();
            let kind = if lane == "bulk" { BULK } else { TRANSACTIONAL };
            let series = format!(
                "outbox_delivery_latency_seconds_bucket{{kind=\"{kind}\",lane=\"{lane}\",le=\"{threshold}\"}}"
            );
            metric_value(&body, &series).is_some_and(|n| n >= 1.0)
        })
    })
    .await;
}
