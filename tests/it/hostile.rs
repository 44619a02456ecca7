//! Hostile input: rows that PostgreSQL accepts but outboxd cannot use fail alone, and no
//! single message can hold its batch.

use std::time::Duration;

use outboxd::dispatch::{BatchReport, Step};
use serde_json::json;

use crate::helpers::{SmtpServer, TestDb, app, verification};

/// A valid `account_verification` payload, as JSON text, with `extra` spliced in.
fn payload_with(to: &str, extra: &str) -> String {
    format!(r#"{{"to": "{to}", "name": "Ada", "verify_url": "https://app.example/v", {extra}}}"#)
}

#[tokio::test]
async fn a_payload_outboxd_cannot_read_is_dead_lettered_alone_and_its_batch_mates_are_sent() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let app = app(&db, Some(&smtp.url()), &[]).await;
    let deep = format!("\"deep\": {}1{}", "[".repeat(200), "]".repeat(200));
    // One statement, as a producer's bulk insert would: the poisoned rows sit between
    // good ones in the same claim.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload) \
         SELECT 'account_verification', p::jsonb FROM unnest($1::text[]) WITH ORDINALITY AS t(p, i) \
         ORDER BY i RETURNING id",
    )
    .bind(vec![
        payload_with("first@example.com", "\"n\": 1"),
        payload_with("deep@example.com", &deep),
        payload_with("huge@example.com", "\"n\": 1e400"),
        payload_with("last@example.com", "\"n\": 2"),
    ])
    .fetch_all(&db.pool)
    .await
    .unwrap();

    let step = tokio::time::timeout(Duration::from_secs(30), app.dispatcher.dispatch_once())
        .await
        .expect("the batch ends")
        .unwrap();
    assert_eq!(
        step,
        Step::Batch(BatchReport {
            claimed: 4,
            sent: 2,
            dead_lettered: 2,
            ..BatchReport::default()
        })
    );
    let mut delivered: Vec<_> = smtp.messages().into_iter().map(|m| m.rcpt_tos).collect();
    delivered.sort();
    assert_eq!(
        delivered,
        [vec!["first@example.com"], vec!["last@example.com"]]
    );
    for (id, reason) in [(ids[1], "recursion limit"), (ids[2], "number out of range")] {
        let row = db.row(id).await;
        assert!(row.dead && row.attempts == 1, "{row:?}");
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains(reason), "{error}");
        assert_eq!(db.error_class(id).await.as_deref(), Some("payload"));
        // Operators can still look at the row: its payload comes back as text.
        let detail = outboxd::store::admin::message(&db.pool, id)
            .await
            .unwrap()
            .unwrap();
        assert!(detail.payload.0.is_string(), "{:?}", detail.payload);
        assert_eq!(
            detail.recipients,
            [format!(
                "{}@example.com",
                if id == ids[1] { "deep" } else { "huge" }
            )]
        );
    }
}

#[tokio::test]
async fn a_message_with_more_recipients_than_the_limit_is_refused_without_rendering() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let app = app(&db, Some(&smtp.url()), &["--max-recipients", "100"]).await;
    let bcc: Vec<String> = (0..20_000)
        .map(|i| format!("user{i}@example.com"))
        .collect();
    let mut crowded = verification("crowd@example.com");
    crowded["bcc"] = json!(bcc);
    let crowded = db.enqueue("account_verification", crowded).await;
    let mut fine = verification("fine@example.com");
    fine["cc"] = json!(
        (0..99)
            .map(|i| format!("cc{i}@example.com"))
            .collect::<Vec<_>>()
    );
    let fine = db.enqueue("account_verification", fine).await;

    let step = tokio::time::timeout(Duration::from_secs(30), app.dispatcher.dispatch_once())
        .await
        .expect("the batch ends")
        .unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.sent == 1 && r.dead_lettered == 1),
        "{step:?}: {:?}",
        db.row(fine).await
    );
    let row = db.row(crowded).await;
    assert!(row.dead, "{row:?}");
    assert!(
        row.last_error
            .unwrap_or_default()
            .contains("20001 addresses"),
        "the count includes to"
    );
    assert_eq!(
        db.error_class(crowded).await.as_deref(),
        Some("too_many_recipients")
    );
    assert!(db.row(fine).await.dispatched);
    assert_eq!(smtp.messages()[0].rcpt_tos.len(), 100);
}

#[tokio::test]
async fn an_address_named_twice_is_sent_to_once() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let app = app(&db, Some(&smtp.url()), &[]).await;
    let mut payload = verification("twice@example.com");
    payload["cc"] = json!(vec!["twice@EXAMPLE.com"; 50]);
    payload["bcc"] = json!(["Twice@example.com"]);
    db.enqueue("account_verification", payload).await;
    app.dispatcher.dispatch_once().await.unwrap();
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    // The domain is case-insensitive; the local part is kept as written.
    assert_eq!(
        received[0].rcpt_tos,
        ["twice@example.com", "Twice@example.com"]
    );
}

#[tokio::test]
async fn a_payload_past_the_size_limit_is_dead_lettered_and_the_rest_is_sent() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let app = app(&db, Some(&smtp.url()), &["--max-message-bytes", "8KiB"]).await;
    let mut big = verification("big@example.com");
    big["padding"] = json!("x".repeat(20_000));
    let big = db.enqueue("account_verification", big).await;
    db.enqueue("account_verification", verification("small@example.com"))
        .await;
    let step = app.dispatcher.dispatch_once().await.unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.sent == 1 && r.dead_lettered == 1),
        "{step:?}"
    );
    let row = db.row(big).await;
    assert!(row.dead, "{row:?}");
    assert!(
        row.last_error
            .unwrap_or_default()
            .contains("more than the limit of 8192 (OUTBOXD_MAX_MESSAGE_BYTES)")
    );
    assert_eq!(db.error_class(big).await.as_deref(), Some("payload"));
    assert_eq!(smtp.messages()[0].rcpt_tos, ["small@example.com"]);
}

#[tokio::test]
async fn null_and_non_string_recipients_cost_their_own_message_and_never_the_claim() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let app = app(&db, Some(&smtp.url()), &[]).await;
    // The claim statement reads the addresses for the suppression list: none of these may
    // fail it, which would leave the whole batch leased and unsent.
    let mut no_cc = verification("kept@example.com");
    no_cc["cc"] = serde_json::Value::Null;
    no_cc["bcc"] = json!([]);
    let no_cc = db.enqueue("account_verification", no_cc).await;
    let mut odd = Vec::new();
    for to in [
        json!([null, "x@example.com"]),
        json!(42),
        json!({"address": "y@example.com"}),
        json!([["nested@example.com"]]),
    ] {
        let mut payload = verification("unused@example.com");
        payload["to"] = to;
        odd.push(db.enqueue("account_verification", payload).await);
    }
    let step = app.dispatcher.dispatch_once().await.unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.sent == 1 && r.dead_lettered == 4),
        "{step:?}"
    );
    assert!(db.row(no_cc).await.dispatched, "{no_cc}");
    for id in odd {
        assert_eq!(db.error_class(id).await.as_deref(), Some("address"), "{id}");
    }
    assert_eq!(smtp.messages()[0].rcpt_tos, ["kept@example.com"]);
}
