//! Mail goes out when it falls due, not at the next poll: a retry and a `not_before` row
//! are each sent within a second of their due time with the default 15 s poll interval.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::helpers::{Outboxd, SmtpServer, TestDb, eventually, verification};

/// When the server received the message of row `id`, as seconds since the epoch.
async fn received_at(smtp: &SmtpServer, id: i64) -> f64 {
    let mut at = None;
    eventually(Duration::from_secs(30), "the message received", || {
        at = smtp
            .messages()
            .iter()
            .find(|m| m.outbox_id == id.to_string())
            .map(|m| m.received_at);
        std::future::ready(at.is_some())
    })
    .await;
    at.expect("received")
}

fn seconds(at: DateTime<Utc>) -> f64 {
    at.timestamp_micros() as f64 / 1e6
}

async fn due_of(db: &TestDb, id: i64) -> DateTime<Utc> {
    db.scalar(
        "SELECT next_attempt_at FROM outbox_messages WHERE id = $1",
        id,
    )
    .await
}

#[tokio::test]
async fn a_retry_and_a_not_before_row_are_sent_within_a_second_of_falling_due() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let flags = ["--retry-backoff", "2s"];
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;

    // The relay greylists the first attempt (451 4.7.1), and takes the second.
    let retried = db
        .enqueue(
            "account_verification",
            verification("flaky1-ann@example.com"),
        )
        .await;
    eventually(
        Duration::from_secs(30),
        "the first attempt refused",
        || async { db.row(retried).await.attempts == 1 },
    )
    .await;
    let due = due_of(&db, retried).await;
    let late = received_at(&smtp, retried).await - seconds(due);
    assert!(
        (-0.05..1.0).contains(&late),
        "the retry went out {late:.2} s after it fell due"
    );

    // Two rows committed together, due 3 and 6 s later: each goes out on time, the second
    // too, although the first wake-up is for the first.
    let later: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, not_before) \
         SELECT 'account_verification', $1, now() + make_interval(secs => s) \
         FROM unnest(ARRAY[3, 6]) AS s RETURNING id",
    )
    .bind(verification("later@example.com"))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for id in later {
        let due = due_of(&db, id).await;
        let late = received_at(&smtp, id).await - seconds(due);
        assert!(
            (-0.05..1.0).contains(&late),
            "a not_before row went out {late:.2} s after it fell due"
        );
    }
}
