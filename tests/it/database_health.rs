//! The database's own health as outboxd sees it: a transaction left open elsewhere, which
//! keeps vacuum from removing what was sent.

use std::time::Duration;

use crate::helpers::{Outboxd, TestDb, http_get, poll_until};

async fn gauge(outboxd: &Outboxd, name: &str) -> Option<f64> {
    let (_, body) = http_get(&outboxd.http, "/metrics").await;
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn a_transaction_left_open_shows_as_the_oldest_transactions_age_until_it_ends() {
    let db = TestDb::new().await;
    let (mut open, _) = db.open_transaction().await;
    let outboxd = Outboxd::start(&db.url, &["--sample-interval", "1s"], &[]).await;
    let age = "outbox_database_oldest_transaction_age_seconds";
    let held = poll_until(
        Duration::from_secs(30),
        "the open transaction's age",
        || async { gauge(&outboxd, age).await.filter(|&seconds| seconds >= 2.0) },
    )
    .await;
    assert!(held < 60.0, "{held}");
    assert!(gauge(&outboxd, "outbox_table_dead_tuples").await.is_some());
    sqlx::raw_sql("COMMIT").execute(&mut open).await.unwrap();
    poll_until(
        Duration::from_secs(30),
        "the age to fall once it ended",
        || async { gauge(&outboxd, age).await.filter(|&seconds| seconds < 1.0) },
    )
    .await;
}
