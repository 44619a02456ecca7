//! The SES API v2 relay (`ses://REGION`), against the binary and moto's SES (a third-party
//! emulator): a thousand messages arrive as SES sent messages with SES's MessageId on their
//! timelines; a sender SES refuses dead-letters with SES's reason; throttling answers cost
//! no attempt and cut the pace; and an SES endpoint that does not answer hands the mail to
//! the next relay.

use std::collections::HashMap;
use std::time::Duration;

use crate::helpers::{
    Outboxd, SesServer, SmtpServer, TestDb, eventually, free_port, http_get, metric_value,
};

/// outboxd sending through `ses` (`ses://us-east-1`, its endpoint), with `flags`.
async fn through_ses(db: &TestDb, ses: &SesServer, flags: &[&str]) -> Outboxd {
    let env = ses.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Outboxd::sending_to(&db.url, "ses://us-east-1", flags, &env).await
}

#[tokio::test]
async fn a_thousand_messages_arrive_through_ses_with_its_message_ids_on_their_timelines() {
    let db = TestDb::new().await;
    let ses = SesServer::start(&["--verify", "example.com"]);
    let _outboxd = through_ses(&db, &ses, &[]).await;
    let ids = db.insert_many("account_verification", 1000).await;

    let sent = ses.wait_for(1000, Duration::from_secs(120)).await;
    eventually(Duration::from_secs(30), "every row dispatched", || async {
        db.count("dispatched").await == 1000
    })
    .await;
    let ses_ids: HashMap<String, String> = sent
        .iter()
        .map(|m| (m.outbox_id.clone(), m.ses_message_id.clone()))
        .collect();
    assert_eq!(ses_ids.len(), 1000, "each sent once");
    let said: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, smtp_reply, relay FROM outbox_messages ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(said.len(), ids.len());
    for (id, reply, relay) in said {
        assert_eq!(reply, format!("SES MessageId {}", ses_ids[&id.to_string()]));
        assert_eq!(relay, format!("127.0.0.1:{}", ses.port));
    }
    // The timeline, as an operator reads it.
    let first = ids[0].to_string();
    let timeline = crate::helpers::succeeds(
        crate::helpers::outboxd().args(["messages", "--database-url", &db.url, "--id", &first]),
        "outboxd messages --id",
    );
    let expected = format!(
        "SES MessageId {} (relay 127.0.0.1:{})",
        ses_ids[&first], ses.port
    );
    assert!(timeline.contains(&expected), "{timeline}");
    // The raw message went whole: its Message-ID is outboxd's.
    assert!(sent.iter().all(|m| m.message_id.starts_with("<outbox-")));
}

#[tokio::test]
async fn a_sender_ses_refuses_is_dead_lettered_with_ses_s_reason() {
    let db = TestDb::new().await;
    let ses = SesServer::start(&["--verify", "elsewhere.example"]);
    let _outboxd = through_ses(&db, &ses, &[]).await;
    let id = db.insert_many("account_verification", 1).await[0];
    eventually(
        Duration::from_secs(30),
        "the message dead-lettered",
        || async { db.row(id).await.dead },
    )
    .await;
    let error = db.row(id).await.last_error.unwrap_or_default();
    assert!(error.contains("MessageRejected"), "{error}");
    assert!(
        error.contains("Did not have authority to send from email a@example.com"),
        "{error}"
    );
    assert_eq!(db.error_class(id).await.as_deref(), Some("smtp_554"));
}

#[tokio::test]
async fn ses_s_throttling_costs_no_attempt_and_cuts_the_pace() {
    let db = TestDb::new().await;
    let ses = SesServer::start(&[
        "--verify",
        "example.com",
        "--throttle-every",
        "4",
        "--throttle-for",
        "5",
    ]);
    let outboxd = through_ses(&db, &ses, &["--sample-interval", "200ms"]).await;
    db.insert_many("account_verification", 200).await;
    ses.wait_for(200, Duration::from_secs(120)).await;
    eventually(Duration::from_secs(30), "every row dispatched", || async {
        db.count("dispatched").await == 200
    })
    .await;
    assert!(ses.throttled() > 0);
    let attempts: i64 = db
        .scalar(
            "SELECT coalesce(sum(attempts), 0)::bigint FROM outbox_messages WHERE $1",
            true,
        )
        .await;
    assert_eq!(attempts, 0, "a throttling answer charges no attempt");
    let metrics = http_get(&outboxd.http, "/metrics").await.1;
    let throttled = metric_value(&metrics, "outbox_throttled_total");
    assert!(throttled.is_some_and(|n| n > 0.0), "{throttled:?}");
}

#[tokio::test]
async fn an_ses_endpoint_that_does_not_answer_hands_the_mail_to_the_next_relay() {
    let db = TestDb::new().await;
    let fallback = SmtpServer::start();
    let gone = format!("http://127.0.0.1:{}", free_port());
    let env = [
        ("OUTBOXD_SES_ENDPOINT_URL", gone.as_str()),
        ("AWS_ACCESS_KEY_ID", "AKIDTESTING"),
        ("AWS_SECRET_ACCESS_KEY", "testing-secret"),
    ];
    let flags = ["--smtp-fallback-urls", &fallback.url()];
    let _outboxd = Outboxd::sending_to(&db.url, "ses://us-east-1", &flags, &env).await;
    db.insert_many("account_verification", 20).await;
    fallback.wait_for(20, Duration::from_secs(30)).await;
    let attempts: i64 = db
        .scalar(
            "SELECT coalesce(sum(attempts), 0)::bigint FROM outbox_messages WHERE $1",
            true,
        )
        .await;
    assert_eq!(attempts, 0);
}
