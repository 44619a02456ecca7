//! Failover between relays (`OUTBOXD_SMTP_FALLBACK_URLS`), against the binary and two real
//! SMTP servers (a Postfix, and aiosmtpd): a relay stopped mid-drain loses nothing and sends
//! nothing twice that was not ambiguous, its mail goes through the next one, and traffic returns to it when it is
//! back; a failure after DATA is retried on the same relay, never sent elsewhere.

use std::collections::HashMap;
use std::time::Duration;

use crate::helpers::{Outboxd, Postfix, SmtpServer, TestDb, eventually, http_get, metric_value};

/// `relay` as outboxd names it.
fn label(smtp: &SmtpServer) -> String {
    format!("127.0.0.1:{}", smtp.port)
}

/// How many times each outbox id arrived at these servers.
fn arrivals(servers: &[&SmtpServer]) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for server in servers {
        for message in server.messages() {
            *seen.entry(message.outbox_id).or_insert(0) += 1;
        }
    }
    seen
}

#[tokio::test]
async fn a_postfix_relay_stopped_mid_drain_loses_nothing_its_mail_fails_over_and_comes_back() {
    let db = TestDb::new().await;
    // The first relay is a real Postfix, which passes what it takes on to `beyond`.
    let beyond = SmtpServer::start();
    let first = Postfix::start(&["--relay", &format!("127.0.0.1:{}", beyond.port)]);
    let first_label = format!("127.0.0.1:{}", first.port);
    let second = SmtpServer::start();
    let fallback = second.url();
    let flags = [
        "--smtp-fallback-urls",
        &fallback,
        "--retry-backoff",
        "200ms",
        "--retry-backoff-max",
        "1s",
        "--batch-size",
        "100",
        "--sample-interval",
        "200ms",
    ];
    let outboxd = Outboxd::sending_to(&db.url, &first.url(), &flags, &[]).await;
    let ids = db.insert_many("account_verification", 5000).await;

    // The first relay dies part-way through the drain.
    beyond.wait_for(500, Duration::from_secs(60)).await;
    first.stop();
    eventually(Duration::from_secs(120), "every message sent", || async {
        db.count("pending").await == 0
    })
    .await;
    assert_eq!(db.count("dispatched").await, 5000);
    let metrics = http_get(&outboxd.http, "/metrics").await.1;
    let up = |metrics: &str, relay: &str| {
        metric_value(
            metrics,
            &format!("outbox_relay_up{{relay=\"{relay}\",lane=\"transactional\"}}"),
        )
    };
    assert_eq!(up(&metrics, &first_label), Some(0.0), "the first is down");
    assert_eq!(up(&metrics, &label(&second)), Some(1.0));

    // None handed to two relays, or twice to one, unless its send was ambiguous (the relay
    // died after its data went). Postfix's log names every message it took.
    let mut handed = first.message_ids_taken();
    handed.extend(second.messages().into_iter().map(|m| m.outbox_id));
    let mut times: HashMap<String, usize> = HashMap::new();
    for id in handed {
        *times.entry(id).or_insert(0) += 1;
    }
    let twice: Vec<i64> = times
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id.parse().expect("an id"))
        .collect();
    let ambiguous: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT message_id FROM outbox_message_events WHERE error_class = 'ambiguous'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        twice.iter().all(|id| ambiguous.contains(id)),
        "sent twice: {twice:?}"
    );

    // The first relay is back: what it queued goes on, it is probed, and takes mail again.
    first.start_again();
    eventually(
        Duration::from_secs(60),
        "Postfix's queue delivered",
        || async { first.queued() == 0 },
    )
    .await;
    let seen = arrivals(&[&beyond, &second]);
    for id in &ids {
        assert!(
            seen.contains_key(&id.to_string()),
            "message {id} never arrived"
        );
    }
    assert!(
        !second.messages().is_empty(),
        "the rest went through the fallback"
    );
    let later = db.insert_many("account_verification", 10).await;
    eventually(
        Duration::from_secs(30),
        "the first relay takes mail again",
        || async {
            let relays: Vec<Option<String>> =
                sqlx::query_scalar("SELECT relay FROM outbox_messages WHERE id = ANY($1)")
                    .bind(&later)
                    .fetch_all(&db.pool)
                    .await
                    .unwrap();
            relays
                .iter()
                .all(|r| r.as_deref() == Some(first_label.as_str()))
        },
    )
    .await;
}

#[tokio::test]
async fn each_message_s_timeline_says_which_relay_took_it() {
    let db = TestDb::new().await;
    let mut first = SmtpServer::start();
    let second = SmtpServer::start();
    let fallback = second.url();
    let outboxd = Outboxd::sending_to(
        &db.url,
        &first.url(),
        &["--smtp-fallback-urls", &fallback],
        &[],
    )
    .await;
    db.insert_many("account_verification", 5).await;
    first.wait_for(5, Duration::from_secs(30)).await;
    first.stop();
    db.insert_many("account_verification", 5).await;
    second.wait_for(5, Duration::from_secs(30)).await;
    // The relay that took a message is recorded with its outcome, just after the reply.
    eventually(
        Duration::from_secs(30),
        "every outcome recorded",
        || async { db.count("dispatched").await == 10 },
    )
    .await;
    let second_label = label(&second);
    let by_relay: Vec<(String, i64)> =
        sqlx::query_as("SELECT relay, count(*) FROM outbox_messages GROUP BY relay ORDER BY relay")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let mut expected = vec![(label(&first), 5), (second_label.clone(), 5)];
    expected.sort();
    assert_eq!(by_relay, expected);
    let via_fallback = second.messages()[0].outbox_id.clone();
    let timeline = crate::helpers::succeeds(
        crate::helpers::outboxd().args([
            "messages",
            "--database-url",
            &db.url,
            "--id",
            &via_fallback,
        ]),
        "outboxd messages --id",
    );
    assert!(
        timeline.contains(&format!("(relay {second_label})")),
        "{timeline}"
    );
    // An outcome is counted just after its row is written: wait for the count.
    let sent = format!("outbox_relay_sent_total{{relay=\"{second_label}\",fallback=\"true\"}}");
    eventually(
        Duration::from_secs(10),
        "five sends counted for the fallback",
        || async { metric_value(&http_get(&outboxd.http, "/metrics").await.1, &sent) == Some(5.0) },
    )
    .await;
}

#[tokio::test]
async fn a_reset_after_data_is_retried_on_the_same_relay_never_on_the_next() {
    let db = TestDb::new().await;
    let first = SmtpServer::start();
    let second = SmtpServer::start();
    let fallback = second.url();
    let flags = [
        "--smtp-fallback-urls",
        &fallback,
        "--retry-backoff",
        "100ms",
        "--retry-backoff-max",
        "200ms",
        "--max-attempts",
        "3",
    ];
    let _outboxd = Outboxd::sending_to(&db.url, &first.url(), &flags, &[]).await;
    let id = db.verification_to("resetafter1@example.com").await;
    eventually(
        Duration::from_secs(30),
        "the message dead-lettered",
        || async { db.row(id).await.dead },
    )
    .await;
    let resets = std::fs::read_to_string(first.spool().join("reset.jsonl")).unwrap_or_default();
    assert_eq!(
        resets.lines().count(),
        3,
        "every attempt went to the first relay"
    );
    // The server resets `resetafter` recipients wherever they come: none may have come to
    // the fallback, whose log of resets stays empty.
    assert!(second.messages().is_empty(), "none went to the fallback");
    assert!(
        !second.spool().join("reset.jsonl").exists(),
        "the fallback never saw the message"
    );
    let class: Option<String> = db
        .scalar("SELECT error_class FROM outbox_messages WHERE id = $1", id)
        .await;
    assert_eq!(class.as_deref(), Some("ambiguous"));
}

#[tokio::test]
async fn a_relay_that_defers_before_data_hands_its_message_to_the_next() {
    let db = TestDb::new().await;
    // Up, but answering 451 to every recipient: nothing of the message went.
    let first = SmtpServer::start_deferring_all(crate::helpers::free_port());
    let second = SmtpServer::start();
    let fallback = second.url();
    let _outboxd = Outboxd::sending_to(
        &db.url,
        &first.url(),
        &["--smtp-fallback-urls", &fallback],
        &[],
    )
    .await;
    let id = db.verification_to("ada@example.com").await;
    let received = second.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received[0].outbox_id, id.to_string());
    assert!(first.messages().is_empty());
    eventually(Duration::from_secs(10), "the send recorded", || async {
        db.row(id).await.dispatched
    })
    .await;
    let row: (i32, Option<String>) = db
        .one_row(
            "SELECT attempts, relay FROM outbox_messages WHERE id = $1",
            id,
        )
        .await;
    assert_eq!(
        row,
        (0, Some(label(&second))),
        "sent by the fallback, no attempt spent"
    );
}
