//! Reliability under a misbehaving SMTP server: no send outlives its lease, ambiguous
//! outcomes are told apart from outages, and an outage mid-batch costs no attempts.

use std::collections::HashMap;
use std::time::Duration;

use outboxd::dispatch::Step;

use crate::helpers::Count::{Claimed, Released, Retried, Sent};
use crate::helpers::{
    Dispatching, Outboxd, Scenario, SmtpServer, TestDb, app, batch, eventually, free_port,
    one_step, verification,
};

#[tokio::test]
async fn a_connection_reset_after_the_message_is_ambiguous_and_retried_not_an_outage() {
    let Scenario { db, smtp, mut app } = Scenario::new(&["--retry-backoff", "0s"]).await;
    let id = db
        .enqueue(
            "account_verification",
            verification("resetafter@example.com"),
        )
        .await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Retried(1)]));
    let row = db.row(id).await;
    assert_eq!(row.attempts, 1, "an ambiguous outcome counts an attempt");
    assert!(
        row.last_error
            .unwrap_or_default()
            .contains("after the message was sent, before the server confirmed it"),
    );
    assert_eq!(db.error_class(id).await.as_deref(), Some("ambiguous"));
    // Not an outage: the circuit stays closed and the next message goes out.
    db.verification_to("next@example.com").await;
    let step = one_step(&mut app).await;
    assert!(
        matches!(step, Step::Batch(ref r) if r.sent == 1),
        "{step:?}"
    );
    let received = smtp.messages();
    assert!(
        received.iter().any(|m| m.rcpt_tos == ["next@example.com"]),
        "{received:?}"
    );
}

#[tokio::test]
async fn a_reply_to_the_message_that_never_comes_is_ambiguous_not_an_outage() {
    let Scenario { db, smtp, mut app } =
        Scenario::new(&["--smtp-timeout", "1s", "--lease", "10s"]).await;
    // The only message of its batch: under the old rule this opened the circuit.
    let id = db.verification_to("hold@example.com").await;
    let step = one_step(&mut app).await;
    assert!(
        matches!(step, Step::Batch(ref r) if r.retried == 1),
        "{step:?}"
    );
    assert_eq!(db.row(id).await.attempts, 1);
    assert_eq!(db.error_class(id).await.as_deref(), Some("ambiguous"));
    smtp.release();
    db.verification_to("next@example.com").await;
    let step = one_step(&mut app).await;
    assert!(
        !matches!(step, Step::CircuitOpen { .. }),
        "an ambiguous outcome is not an outage: {step:?}"
    );
}

#[tokio::test]
async fn messages_after_the_servers_death_mid_batch_are_released_without_an_attempt() {
    let db = TestDb::new().await;
    let port = free_port();
    let smtp = SmtpServer::start_on(port);
    let mut app = app(
        &db,
        Some(&format!("smtp://127.0.0.1:{port}")),
        &["--smtp-concurrency", "1", "--batch-size", "10"],
    )
    .await;
    let mut ids = Vec::new();
    for to in ["first", "hold", "after1", "after2", "after3"] {
        ids.push(
            db.enqueue(
                "account_verification",
                verification(&format!("{to}@example.com")),
            )
            .await,
        );
    }
    let (step, ()) = tokio::join!(app.dispatcher.dispatch_once(), async {
        smtp.holding(1).await;
        // The server dies with the second message in its hands.
        drop(smtp);
    });
    let step = step.unwrap();
    assert_eq!(step, batch(&[Claimed(5), Sent(1), Retried(1), Released(3)]));
    assert!(db.row(ids[0]).await.dispatched);
    assert_eq!(db.error_class(ids[1]).await.as_deref(), Some("ambiguous"));
    for id in &ids[2..] {
        let row = db.row(*id).await;
        assert!(row.attempts == 0 && !row.dead && !row.dispatched, "{row:?}");
        assert_eq!(db.error_class(*id).await.as_deref(), Some("unreachable"));
    }
}

/// The reproduction of the lease overrun: 5 s leases, 1 s SMTP timeout, batches of 4 on
/// one connection, a server slow to greet and to answer each message, and a message whose
/// connection it resets after the body. Two replicas run; nothing may be sent twice.
#[tokio::test]
async fn no_send_outlives_its_lease_so_a_second_replica_never_sends_a_batch_again() {
    let db = TestDb::new().await;
    let port = free_port();
    let smtp = SmtpServer::start_with(port, &["--greeting-delay", "0.9"]);
    let flags = [
        "--lease",
        "5s",
        "--smtp-timeout",
        "1s",
        "--batch-size",
        "4",
        "--smtp-concurrency",
        "1",
        "--poll-interval",
        "200ms",
        "--retry-backoff",
        "1h",
    ];
    let url = format!("smtp://127.0.0.1:{port}");
    let replicas = [
        app(&db, Some(&url), &flags).await,
        app(&db, Some(&url), &flags).await,
    ];
    let stops: Vec<_> = replicas.iter().map(|r| r.shutdown.stop.clone()).collect();
    let running: Vec<_> = replicas
        .into_iter()
        .map(|replica| tokio::spawn(replica.dispatcher.run()))
        .collect();
    let rounds = 3;
    let mut expected = Vec::new();
    for round in 0..rounds {
        for i in 0..4 {
            let to = format!("lag900-r{round}-{i}@example.com");
            db.verification_to(&to).await;
            expected.push(to);
        }
        db.enqueue(
            "account_verification",
            verification(&format!("resetafter-r{round}@example.com")),
        )
        .await;
    }
    eventually(
        Duration::from_secs(120),
        "every slow message sent",
        || async { smtp.messages().len() >= expected.len() },
    )
    .await;
    // Wait out every lease still held: a row whose send had overrun its lease would then
    // be claimed and sent again by the other replica.
    let last_lease: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT max(locked_until) FROM outbox_messages")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    eventually(
        Duration::from_secs(60),
        "every lease held ended",
        || async {
            let ended: bool = db
                .scalar("SELECT $1::timestamptz IS NULL OR now() > $1", last_lease)
                .await;
            ended
        },
    )
    .await;
    eventually(Duration::from_secs(60), "every claim settled", || async {
        db.count("leased").await == 0
    })
    .await;
    let mut received: HashMap<String, usize> = HashMap::new();
    for message in smtp.messages() {
        for to in message.rcpt_tos {
            *received.entry(to).or_default() += 1;
        }
    }
    for to in &expected {
        assert_eq!(
            received.get(to),
            Some(&1),
            "{to} received {:?} times",
            received.get(to)
        );
    }
    for stop in &stops {
        stop.cancel();
    }
    for task in running {
        task.await.unwrap();
    }
}

/// An application transaction left open with a lock on one sent row (an `UPDATE`, or a
/// `SELECT ... FOR UPDATE`) holds back that row's outcome only. Its batch-mates are recorded
/// at once, and later messages go out; the row is recorded when the lock goes. Before, the
/// outcome write waited on the lock: nothing more was sent, and the batch-mates' rows sat
/// unwritten until their leases ran out and another replica sent them again.
#[tokio::test]
async fn a_row_locked_by_another_transaction_holds_back_only_its_own_outcome() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    // A poll interval longer than the test's waits: the locked row's outcome must be tried
    // again of itself once the lock goes, which no notification announces.
    let app = app(&db, Some(&smtp.url()), &["--poll-interval", "5m"]).await;
    let (locked, mate) = two_to_hold(&db).await;
    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    let open = lock_while_held(&db, &smtp, locked, mate).await;
    let later = db.verification_to("later@example.com").await;
    eventually(
        Duration::from_secs(30),
        "a later message sent and recorded while the row is locked",
        || async { db.row(later).await.dispatched },
    )
    .await;
    assert!(!db.row(locked).await.dispatched);
    open.commit().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "the locked row recorded once its lock is gone",
        || async { db.row(locked).await.dispatched },
    )
    .await;
    let mut received: HashMap<String, usize> = HashMap::new();
    for message in smtp.messages() {
        for to in message.rcpt_tos {
            *received.entry(to).or_default() += 1;
        }
    }
    for to in [
        "hold-a@example.com",
        "hold-b@example.com",
        "later@example.com",
    ] {
        assert_eq!(received.get(to), Some(&1), "{to}: {received:?}");
    }
    let row = db.row(locked).await;
    assert_eq!(row.attempts, 0, "sent at the first attempt: {row:?}");
    running.stop().await;
}

/// Stopping while a row's lock holds its outcome back says that the message will go out
/// again, as for any outcome that could not be written.
#[tokio::test]
async fn stopping_while_a_row_is_locked_says_its_message_will_be_sent_again() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (locked, mate) = two_to_hold(&db).await;
    let outboxd =
        Outboxd::sending_to(&db.url, &smtp.url(), &["--poll-interval", "200ms"], &[]).await;
    let open = lock_while_held(&db, &smtp, locked, mate).await;
    outboxd.sigterm();
    let (status, logs) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{logs}");
    assert!(logs.contains("another transaction still locks"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "no colour escapes in logs that go to a pipe: {logs}"
    );
    assert!(!db.row(locked).await.dispatched);
    open.rollback().await.unwrap();
}

/// Two messages for the server to hold: the row to lock, and its batch-mate. Enqueued
/// before outboxd starts, so that one claim takes both.
async fn two_to_hold(db: &TestDb) -> (i64, i64) {
    let locked = db.verification_to("hold-a@example.com").await;
    let mate = db.verification_to("hold-b@example.com").await;
    (locked, mate)
}

/// Once the server holds both messages, locks `row` in a transaction left open, lets the
/// server answer, and waits until `mate`'s outcome is recorded all the same.
async fn lock_while_held(
    db: &TestDb,
    smtp: &SmtpServer,
    row: i64,
    mate: i64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    smtp.holding(2).await;
    let open = db.hold_row(row, "FOR UPDATE").await;
    smtp.release();
    eventually(
        Duration::from_secs(30),
        "the batch-mate recorded while the other row is locked",
        || async { db.row(mate).await.dispatched },
    )
    .await;
    open
}
