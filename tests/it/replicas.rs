use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use outboxd::dispatch::Step;
use serde_json::json;

use crate::helpers::{BlackHole, SmtpServer, TestDb, app, eventually, outboxd, step_until};

fn verification(i: usize) -> serde_json::Value {
    json!({"to": format!("user{i}@example.com"), "name": "Ada", "verify_url": "https://app.example/v"})
}

#[tokio::test]
pub(crate) async fn two_dispatchers_on_one_table_never_send_a_row_twice() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let total = 300;
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..total {
        outboxd_producer::enqueue(
            &mut *tx,
            outboxd::NewMessage::new("account_verification", verification(i)).unwrap(),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();

    let flags = ["--batch-size", "10", "--smtp-concurrency", "4"];
    let mut one = app(
        &db,
        Some(&smtp.url()),
        &[&flags[..], &["--worker-id", "one"]].concat(),
    )
    .await;
    let mut two = app(
        &db,
        Some(&smtp.url()),
        &[&flags[..], &["--worker-id", "two"]].concat(),
    )
    .await;
    let (a, b) = tokio::join!(one.dispatcher.drain(), two.dispatcher.drain());
    let claimed = |step: Step| match step {
        Step::Batch(report) => report.claimed,
        other => panic!("{other:?}"),
    };
    let (a, b) = (claimed(a.unwrap()), claimed(b.unwrap()));
    assert_eq!(a + b, total, "one claimed {a}, two claimed {b}");

    let received = smtp.wait_for(total, Duration::from_secs(30)).await;
    let mut per_row: HashMap<String, usize> = HashMap::new();
    for message in &received {
        *per_row.entry(message.outbox_id.clone()).or_default() += 1;
    }
    assert_eq!(received.len(), total);
    assert_eq!(per_row.len(), total);
    assert!(per_row.values().all(|&n| n == 1));
    assert_eq!(db.count("dispatched").await, total as i64);
}

#[tokio::test]
pub(crate) async fn a_killed_dispatchers_rows_are_delivered_by_another_after_its_lease() {
    let db = TestDb::new().await;
    let hole = BlackHole::start().await;
    let id = db.enqueue("account_verification", verification(1)).await;

    // A real outboxd claims the row, then hangs on an SMTP server that never answers...
    let mut victim = outboxd()
        .args(["run", "--database-url", &db.url, "--smtp-url", &hole.url()])
        .args([
            "--from",
            "a@example.com",
            "--smtp-timeout",
            "1s",
            "--lease",
            "4s",
        ])
        .args(["--worker-id", "victim", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(30), "the row is claimed", || async {
        db.row(id).await.locked_by.as_deref() == Some("victim")
    })
    .await;
    // ...and is killed outright before it can record anything.
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert_eq!(db.row(id).await.locked_by.as_deref(), Some("victim"));

    let smtp = SmtpServer::start();
    let mut rescuer = app(&db, Some(&smtp.url()), &["--worker-id", "rescuer"]).await;
    // While the lease lasts, the row is nobody else's.
    let step = rescuer.dispatcher.dispatch_once().await.unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.claimed == 0),
        "{step:?}"
    );

    let reclaimed = step_until(
        &mut rescuer,
        Duration::from_secs(30),
        "the rescuer to send the row",
        |step| match step {
            Step::Batch(r) if r.sent == 1 => Some(r.reclaimed),
            _ => None,
        },
    )
    .await;
    assert_eq!(reclaimed, 1);
    let row = db.row(id).await;
    assert!(
        row.dispatched && row.attempts == 0 && row.locked_by.is_none(),
        "{row:?}"
    );
    assert_eq!(smtp.messages()[0].outbox_id, id.to_string());
}
