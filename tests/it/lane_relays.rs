//! A relay per lane (`OUTBOXD_BULK_SMTP_URL`), against the binary and real SMTP servers:
//! each lane's mail arrives at its own relay, and while the bulk lane's relay is down the
//! transactional lane goes on, the bulk lane waits without spending attempts or claiming in
//! a loop, and it drains when its relay is back.

use std::time::Duration;

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, free_port, http_get, metric_value, run_refused,
};

const BULK: &str = "workspace_invite";
const TRANSACTIONAL: &str = "account_verification";

/// The bulk lane's relay, and its kinds.
fn bulk_lane(relay_url: &str) -> Vec<String> {
    [
        "--bulk-kinds",
        BULK,
        "--bulk-smtp-url",
        relay_url,
        "--sample-interval",
        "200ms",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Whether every message that arrived at `smtp` is one of `ids`.
fn only_of(smtp: &SmtpServer, ids: &[i64]) -> bool {
    let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
    smtp.messages().iter().all(|m| ids.contains(&m.outbox_id))
}

#[tokio::test]
async fn each_lane_s_mail_arrives_at_its_own_relay() {
    let db = TestDb::new().await;
    let (main, bulk) = (SmtpServer::start(), SmtpServer::start());
    let flags = bulk_lane(&bulk.url());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _outboxd = Outboxd::sending_to(&db.url, &main.url(), &flags, &[]).await;
    let bulk_ids = db.insert_many(BULK, 30).await;
    let transactional_ids = db.insert_many(TRANSACTIONAL, 20).await;

    main.wait_for(20, Duration::from_secs(30)).await;
    bulk.wait_for(30, Duration::from_secs(30)).await;
    assert!(only_of(&main, &transactional_ids));
    assert!(only_of(&bulk, &bulk_ids));
    let relays: String = db
        .scalar(
            "SELECT string_agg(DISTINCT kind || ' ' || relay, ', ') FROM outbox_messages WHERE $1",
            true,
        )
        .await;
    assert_eq!(
        relays,
        format!(
            "{TRANSACTIONAL} 127.0.0.1:{}, {BULK} 127.0.0.1:{}",
            main.port, bulk.port
        )
    );
}

#[tokio::test]
async fn while_the_bulk_relay_is_down_transactional_mail_goes_on_and_bulk_mail_waits() {
    let db = TestDb::new().await;
    let main = SmtpServer::start();
    let bulk_port = free_port();
    let flags = bulk_lane(&format!("smtp://127.0.0.1:{bulk_port}"));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::sending_to(&db.url, &main.url(), &flags, &[]).await;
    let bulk_ids = db.insert_many(BULK, 50).await;

    let circuit = |body: &str, lane: &str| {
        metric_value(
            body,
            &format!("outbox_smtp_circuit_open{{lane=\"{lane}\"}}"),
        )
    };
    eventually(
        Duration::from_secs(30),
        "the bulk lane's circuit open",
        || async { circuit(&http_get(&outboxd.http, "/metrics").await.1, "bulk") == Some(1.0) },
    )
    .await;
    let transactional_ids = db.insert_many(TRANSACTIONAL, 20).await;
    main.wait_for(20, Duration::from_secs(30)).await;
    let body = http_get(&outboxd.http, "/metrics").await.1;
    assert_eq!(circuit(&body, "transactional"), Some(0.0), "{body}");
    assert_eq!(
        metric_value(
            &body,
            &format!("outbox_relay_up{{relay=\"127.0.0.1:{bulk_port}\",lane=\"bulk\"}}")
        ),
        Some(0.0)
    );
    // The bulk messages wait: no attempt spent, not given back in a loop.
    assert_eq!(db.sent_of(BULK).await, 0);
    let attempts: i64 = db
        .scalar(
            "SELECT coalesce(sum(attempts), 0)::bigint FROM outbox_messages WHERE kind = $1",
            BULK,
        )
        .await;
    assert_eq!(attempts, 0);
    let releases = metric_value(
        &body,
        "outbox_messages_released_total{reason=\"smtp_unavailable\"}",
    );
    assert!(releases.is_some_and(|n| n <= 50.0), "{releases:?}");

    // The bulk relay comes up: its lane drains.
    let bulk = SmtpServer::start_on(bulk_port);
    bulk.wait_for(50, Duration::from_secs(90)).await;
    assert!(only_of(&bulk, &bulk_ids));
    assert!(only_of(&main, &transactional_ids));
}

/// The main relay's flags, with `more`.
fn relaying(more: &[&'static str]) -> Vec<&'static str> {
    let mut flags = vec![
        "--smtp-url",
        "smtp://127.0.0.1:2525",
        "--from",
        "a@example.com",
    ];
    flags.extend(more);
    flags
}

#[test]
fn a_bulk_relay_without_bulk_kinds_is_refused_at_start() {
    run_refused(
        &relaying(&["--bulk-smtp-url", "smtp://127.0.0.1:2526"]),
        "OUTBOXD_BULK_SMTP_URL is set but no kind is bulk",
    );
}

#[test]
fn a_bad_bulk_relay_url_is_refused_naming_its_setting_not_its_password() {
    let said = run_refused(
        &relaying(&[
            "--bulk-kinds",
            BULK,
            "--bulk-smtp-url",
            "smtp://127.0.0.1:2526",
            "--bulk-smtp-fallback-urls",
            "smtp://user:hunter2@mail.example",
        ]),
        "OUTBOXD_BULK_SMTP_FALLBACK_URLS (fallback 1)",
    );
    assert!(!said.contains("hunter2"), "{said}");
}

#[test]
fn a_bulk_rate_limit_without_a_bulk_relay_is_refused_at_start() {
    run_refused(
        &relaying(&["--bulk-kinds", BULK, "--bulk-rate-limit", "10/s"]),
        "OUTBOXD_BULK_RATE_LIMIT is set but OUTBOXD_BULK_SMTP_URL is not",
    );
}

/// Each route's pace, as `/metrics` shows it.
async fn pace(outboxd: &Outboxd, route: &str) -> Option<f64> {
    let body = http_get(&outboxd.http, "/metrics").await.1;
    metric_value(
        &body,
        &format!("outbox_send_rate_limit_per_second{{lane=\"{route}\"}}"),
    )
}

#[tokio::test]
async fn a_bulk_relay_s_throttling_paces_the_bulk_lane_alone() {
    let db = TestDb::new().await;
    let main = SmtpServer::start();
    // Takes 20 messages a second (a second's burst) and answers 454 4.7.0 to the rest.
    let bulk = SmtpServer::start_with(free_port(), &["--accept-rate", "20"]);
    let flags = bulk_lane(&bulk.url());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::sending_to(&db.url, &main.url(), &flags, &[]).await;
    let bulk_ids = db.insert_many(BULK, 200).await;
    eventually(
        Duration::from_secs(30),
        "a pace found for the bulk relay",
        || async { pace(&outboxd, "bulk").await.is_some_and(|p| p > 0.0) },
    )
    .await;

    let transactional_ids = db.insert_many(TRANSACTIONAL, 200).await;
    main.wait_for(200, Duration::from_secs(60)).await;
    assert_eq!(
        pace(&outboxd, "transactional").await,
        Some(0.0),
        "the transactional relay never throttled: its mail is not paced"
    );
    let received = bulk.wait_for(200, Duration::from_secs(120)).await;
    let mut ids: Vec<&str> = received.iter().map(|m| m.outbox_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "each bulk message once");
    assert!(only_of(&bulk, &bulk_ids));
    assert!(only_of(&main, &transactional_ids));
    assert_eq!(main.throttled(), 0);
}

#[tokio::test]
async fn the_bulk_rate_limit_paces_the_bulk_relay_and_not_the_transactional_one() {
    const LIMIT: usize = 25;
    let db = TestDb::new().await;
    let (main, bulk) = (SmtpServer::start(), SmtpServer::start());
    let mut flags = bulk_lane(&bulk.url());
    flags.extend(["--bulk-rate-limit".to_owned(), format!("{LIMIT}/s")]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let outboxd = Outboxd::sending_to(&db.url, &main.url(), &flags, &[]).await;
    db.insert_many(BULK, 150).await;
    db.insert_many(TRANSACTIONAL, 150).await;

    main.wait_for(150, Duration::from_secs(60)).await;
    let received = bulk.wait_for(150, Duration::from_secs(60)).await;
    assert_eq!(pace(&outboxd, "bulk").await, Some(LIMIT as f64));
    assert_eq!(pace(&outboxd, "transactional").await, Some(0.0));
    // A claim books slots up to a second ahead (`HORIZON_SECONDS`), so a window that holds
    // the start holds a second more than its own; unpaced, the 150 would arrive at once.
    const WINDOW: usize = 3;
    let times: Vec<f64> = received.iter().map(|m| m.received_at).collect();
    let span = times.iter().copied().fold(f64::MIN, f64::max)
        - times.iter().copied().fold(f64::MAX, f64::min);
    let busiest = crate::policy::busiest(times, WINDOW as f64);
    assert!(
        busiest <= (WINDOW + 1) * LIMIT,
        "{busiest} bulk messages in {WINDOW} seconds under a limit of {LIMIT}/s"
    );
    assert!(
        span >= 150.0 / LIMIT as f64 - 1.5,
        "150 bulk messages in {span:.1} s at {LIMIT}/s"
    );
}
