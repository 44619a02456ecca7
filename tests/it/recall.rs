//! Recall and replace by key in the producer's own transaction (`outbox_cancel`,
//! `outbox_cancel_id`, `outbox_replace`, and the producer crate's calls of them), against
//! the binary and a real SMTP server: a cancelled message is never sent, a rolled-back
//! cancel leaves it to be sent, a message being sent answers `in_flight` and is not tried
//! again, and a replacement is all the recipient gets.

use std::time::Duration;

use outboxd_producer::{CancelAnswer, NewMessage, Outbox, RecallError, ReplaceAnswer};

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, http_get, metric_value, verification,
};

/// Commits a verification email to `to` with idempotency key `key`, due now.
async fn keyed(db: &TestDb, key: &str, to: &str) -> i64 {
    let message = NewMessage::new("account_verification", verification(to))
        .unwrap()
        .with_idempotency_key(key)
        .unwrap();
    Outbox::default().enqueue(&db.pool, message).await.unwrap()
}

/// `outbox_cancel(key)` in a transaction of its own, committed or rolled back.
async fn cancel_in_transaction(db: &TestDb, key: &str, commit: bool) -> CancelAnswer {
    let mut tx = db.pool.begin().await.unwrap();
    let answer = Outbox::default()
        .cancel(&mut *tx, key, Some("billing-service"))
        .await
        .unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    answer
}

async fn events_of(db: &TestDb, id: i64) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT event, actor FROM outbox_message_events WHERE message_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_cancel_that_commits_withdraws_the_email_and_one_rolled_back_leaves_it_to_be_sent() {
    let db = TestDb::new().await;
    let withdrawn = keyed(&db, "invite-1", "withdrawn@example.com").await;
    let kept = keyed(&db, "invite-2", "kept@example.com").await;
    assert_eq!(
        cancel_in_transaction(&db, "invite-1", true).await,
        CancelAnswer::Cancelled
    );
    assert_eq!(
        cancel_in_transaction(&db, "invite-2", false).await,
        CancelAnswer::Cancelled
    );

    // A cancel held open while the replica starts and runs: the claim skips the locked
    // row, and once the cancel commits the row is never sent.
    let later = keyed(&db, "invite-3", "later@example.com").await;
    let mut held = db.pool.begin().await.unwrap();
    let answer = Outbox::default()
        .cancel_id(&mut *held, later, None)
        .await
        .unwrap();
    assert_eq!(answer, CancelAnswer::Cancelled);
    let smtp = SmtpServer::start();
    let outboxd =
        Outboxd::sending_to(&db.url, &smtp.url(), &["--sample-interval", "200ms"], &[]).await;
    let marker = keyed(&db, "invite-4", "marker@example.com").await;
    smtp.wait_for(2, Duration::from_secs(30)).await;
    held.commit().await.unwrap();

    let to: Vec<String> = smtp
        .messages()
        .iter()
        .map(|m| m.outbox_id.clone())
        .collect();
    assert_eq!(
        to,
        [kept.to_string(), marker.to_string()],
        "only the kept and the marker"
    );
    let ended: Vec<(i64, Option<String>, bool)> = sqlx::query_as(
        "SELECT id, end_reason, dispatched_at IS NULL FROM outbox_messages WHERE id = ANY($1) ORDER BY id",
    )
    .bind(vec![withdrawn, later])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        ended,
        [
            (withdrawn, Some("cancelled".into()), true),
            (later, Some("cancelled".into()), true)
        ]
    );
    assert_eq!(
        events_of(&db, withdrawn).await,
        [("cancelled".into(), Some("billing-service".into()))]
    );
    // What each call answers once the message's fate is known.
    assert_eq!(
        cancel_in_transaction(&db, "invite-2", true).await,
        CancelAnswer::Sent
    );
    assert_eq!(
        cancel_in_transaction(&db, "invite-1", true).await,
        CancelAnswer::Ended
    );
    assert_eq!(
        cancel_in_transaction(&db, "no-such-key", true).await,
        CancelAnswer::NotFound
    );
    eventually(
        Duration::from_secs(10),
        "the cancellation held open, counted from the replica's start on",
        || async {
            let body = http_get(&outboxd.http, "/metrics").await.1;
            metric_value(&body, "outbox_messages_cancelled_total") == Some(1.0)
        },
    )
    .await;
}

#[tokio::test]
async fn a_message_being_sent_answers_in_flight_and_a_failed_send_is_never_tried_again() {
    let db = TestDb::new().await;
    let mut smtp = SmtpServer::start();
    let flags = ["--retry-backoff", "100ms", "--retry-backoff-max", "200ms"];
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
    // The server holds its DATA reply: the message is being sent.
    let id = keyed(&db, "reminder-7", "hold-reminder@example.com").await;
    smtp.holding(1).await;
    assert_eq!(
        cancel_in_transaction(&db, "reminder-7", true).await,
        CancelAnswer::InFlight
    );
    // The relay dies before it answers: a send that would be retried.
    smtp.stop();
    eventually(Duration::from_secs(30), "the message ended", || async {
        db.row(id).await.dead
    })
    .await;
    let end_reason: Option<String> = db
        .scalar("SELECT end_reason FROM outbox_messages WHERE id = $1", id)
        .await;
    assert_eq!(end_reason.as_deref(), Some("cancelled"));
    let events: Vec<String> = events_of(&db, id).await.into_iter().map(|e| e.0).collect();
    assert_eq!(events, ["cancel_requested", "retry", "cancelled"]);
    assert_eq!(
        cancel_in_transaction(&db, "reminder-7", true).await,
        CancelAnswer::Ended
    );
}

#[tokio::test]
async fn a_replacement_by_key_is_all_the_recipient_gets() {
    let db = TestDb::new().await;
    let outbox = Outbox::default();
    let reminder = |name: &str| {
        NewMessage::new(
            "account_verification",
            serde_json::json!({"to": "ada@example.com", "name": name, "verify_url": "https://app.example/v"}),
        )
        .unwrap()
        .with_idempotency_key("reminder-ada")
        .unwrap()
    };
    let first = outbox.replace(&db.pool, reminder("First")).await.unwrap();
    assert_eq!(first.answer, ReplaceAnswer::Enqueued);
    let second = outbox.replace(&db.pool, reminder("Latest")).await.unwrap();
    assert_eq!(
        (second.id, second.answer),
        (first.id, ReplaceAnswer::Replaced)
    );

    let smtp = SmtpServer::start();
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert!(
        received[0]
            .text
            .as_deref()
            .unwrap_or_default()
            .contains("Latest"),
        "{:?}",
        received[0].text
    );
    assert!(
        !received[0]
            .text
            .as_deref()
            .unwrap_or_default()
            .contains("First")
    );
    eventually(Duration::from_secs(10), "the send recorded", || async {
        db.row(first.id).await.dispatched
    })
    .await;
    let third = outbox
        .replace(&db.pool, reminder("Too late"))
        .await
        .unwrap();
    assert_eq!(third.answer, ReplaceAnswer::Sent);
    assert_eq!(smtp.messages().len(), 1);
    let events: Vec<String> = events_of(&db, first.id)
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(events, ["replaced"]);
}

#[tokio::test]
async fn a_replace_without_a_key_or_with_another_kinds_key_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let outbox = Outbox::default();
    let unkeyed = NewMessage::new("account_verification", verification("a@example.com")).unwrap();
    assert!(matches!(
        outbox.replace(&db.pool, unkeyed).await,
        Err(RecallError::NoKey)
    ));
    keyed(&db, "shared-key", "a@example.com").await;
    let other_kind = NewMessage::new("password_reset", serde_json::json!({"to": "a@example.com"}))
        .unwrap()
        .with_idempotency_key("shared-key")
        .unwrap();
    let error = outbox.replace(&db.pool, other_kind).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("belongs to a message of kind account_verification"),
        "{error}"
    );
    let payloads: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM outbox_messages")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(payloads, [verification("a@example.com")]);
}
