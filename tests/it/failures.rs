use std::time::Duration;

use outboxd::dispatch::{BatchReport, DispatchError, Step};
use outboxd::message::{Delivery, Outcome};
use outboxd::store::{self, ClaimRequest};
use outboxd::telemetry::metrics::DatabaseOperation;
use serde_json::json;

use crate::helpers::Count::{Claimed, DeadLettered, Released, Retried, Sent};
use crate::helpers::{
    BlackHole, Dispatching, Scenario, SmtpServer, TestDb, app, batch, free_port, one_step,
    poll_until, step_until, verification,
};

#[tokio::test]
pub(crate) async fn a_transient_failure_is_retried_then_delivered() {
    let Scenario { db, smtp, mut app } = Scenario::new(&["--retry-backoff", "0s"]).await;
    let id = db.verification_to("flaky1@example.com").await;

    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Retried(1)]));
    let row = db.row(id).await;
    assert_eq!(row.attempts, 1);
    assert!(
        row.last_error.as_deref().unwrap().contains("451"),
        "{row:?}"
    );
    assert!(!row.dispatched && !row.dead && row.locked_by.is_none());

    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Sent(1)]));
    let row = db.row(id).await;
    assert!(row.dispatched, "{row:?}");
    assert_eq!(smtp.messages().len(), 1);
}

#[tokio::test]
async fn a_retry_waits_for_its_backoff() {
    let Scenario {
        db,
        smtp: _smtp,
        mut app,
    } = Scenario::new(&["--retry-backoff", "1h", "--retry-backoff-max", "2h"]).await;
    let id = db.verification_to("defer@example.com").await;
    one_step(&mut app).await;
    let (min, max): (f64, f64) = db.one_row("SELECT extract(epoch FROM next_attempt_at - now())::float8, 7200::float8 FROM outbox_messages WHERE id = $1", id).await;
    assert!((3500.0..=max).contains(&min), "next attempt in {min}s");
    let step = one_step(&mut app).await;
    assert_eq!(step, Step::Batch(BatchReport::default()));
}

#[tokio::test]
pub(crate) async fn a_permanent_rejection_is_dead_lettered_at_once() {
    let Scenario {
        db,
        smtp: _smtp,
        mut app,
    } = Scenario::new(&[]).await;
    let id = db.verification_to("reject@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), DeadLettered(1)]));
    let row = db.row(id).await;
    assert!(row.dead && !row.dispatched && row.attempts == 1, "{row:?}");
    assert!(
        row.last_error.as_deref().unwrap().contains("550"),
        "{row:?}"
    );
    assert_eq!(
        one_step(&mut app).await,
        Step::Batch(BatchReport::default())
    );
}

#[tokio::test]
async fn reaching_the_retry_limit_dead_letters_with_the_error_cut_to_500_characters() {
    let Scenario { db, smtp, mut app } =
        Scenario::new(&["--retry-backoff", "0s", "--max-attempts", "3"]).await;
    let id = db
        .enqueue(
            "account_verification",
            verification("deferlong@example.com"),
        )
        .await;
    for attempt in 1..=2 {
        let step = one_step(&mut app).await;
        assert_eq!(step, batch(&[Claimed(1), Retried(1)]));
        assert_eq!(db.row(id).await.attempts, attempt);
    }
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), DeadLettered(1)]));
    let row = db.row(id).await;
    assert!(row.dead && row.attempts == 3, "{row:?}");
    let error = row.last_error.unwrap();
    assert_eq!(error.chars().count(), 500, "{error}");
    assert!(error.starts_with("gave up after 3 attempts: "), "{error}");
    assert!(smtp.messages().is_empty());
}

#[tokio::test]
pub(crate) async fn bad_payloads_are_dead_lettered_without_blocking_the_rest() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    let good1 = db.verification_to("one@example.com").await;
    let bad = [
        (
            db.enqueue("no_such_kind", json!({"to": "x@example.com"}))
                .await,
            "unknown kind",
        ),
        (
            db.enqueue(
                "account_verification",
                json!({"to": "x@example.com", "name": "A"}),
            )
            .await,
            "undefined",
        ),
        (
            db.verification_to("not an address").await,
            "invalid address in to",
        ),
        (
            db.enqueue(
                "account_verification",
                json!({"name": "A", "verify_url": "u"}),
            )
            .await,
            "no recipient",
        ),
        (
            db.enqueue(
                "account_verification",
                json!({"to": 42, "name": "A", "verify_url": "u"}),
            )
            .await,
            "must be an address",
        ),
        (
            db.enqueue(
                "account_verification",
                verification("x@example.com\r\nBcc: victim@example.com"),
            )
            .await,
            "header injection",
        ),
        (
            db.enqueue(
                "workspace_invite",
                json!({"to": "x@example.com", "inviter_name": "Eve\nBcc: v@example.com",
                "workspace_name": "W", "accept_url": "u"}),
            )
            .await,
            "header injection",
        ),
    ];
    let good2 = db.verification_to("two@example.com").await;

    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(9), Sent(2), DeadLettered(7)]));
    for (id, reason) in bad {
        let row = db.row(id).await;
        assert!(row.dead && row.attempts == 1, "{row:?}");
        let error = row.last_error.unwrap();
        assert!(
            error.contains(reason),
            "row {id}: {error:?} lacks {reason:?}"
        );
    }
    assert!(db.row(good1).await.dispatched && db.row(good2).await.dispatched);
    let received = smtp.messages();
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|m| {
        m.rcpt_tos
            .iter()
            .all(|r| !r.contains("victim") && !r.contains("v@"))
    }));
}

#[tokio::test]
pub(crate) async fn an_smtp_outage_pauses_claiming_without_using_up_attempts() {
    let db = TestDb::new().await;
    let port = free_port();
    let url = format!("smtp://127.0.0.1:{port}");
    let mut app = app(&db, Some(&url), &["--max-attempts", "1"]).await;
    let ids = [
        db.verification_to("a@example.com").await,
        db.verification_to("b@example.com").await,
    ];

    // Nobody listens on the port: connection refused for every message.
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(2), Released(2)]));
    for id in ids {
        let row = db.row(id).await;
        assert!(
            !row.dead && !row.dispatched && row.attempts == 0 && row.locked_by.is_none(),
            "{row:?}"
        );
        assert!(
            row.last_error.as_deref().unwrap().contains("unreachable"),
            "{row:?}"
        );
    }
    assert!(matches!(one_step(&mut app).await, Step::CircuitOpen { .. }));

    // The server comes back: the breaker's probe closes the circuit and delivery resumes.
    let smtp = SmtpServer::start_on(port);
    let delivered = step_until(
        &mut app,
        Duration::from_secs(30),
        "delivery to resume",
        |step| match step {
            Step::Batch(report) if report.sent > 0 => Some(report),
            _ => None,
        },
    )
    .await;
    assert_eq!(delivered.sent, 2);
    assert_eq!(smtp.messages().len(), 2);
}

#[tokio::test]
async fn a_timed_out_send_is_retried_while_the_rest_of_the_batch_goes_through() {
    let Scenario {
        db,
        smtp: _smtp,
        mut app,
    } = Scenario::new(&[
        "--smtp-timeout",
        "1s",
        "--lease",
        "10s",
        "--retry-backoff",
        "0s",
    ])
    .await;
    let slow = db.verification_to("slow3@example.com").await;
    let fast = db.verification_to("fast@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(2), Sent(1), Retried(1)]));
    assert!(db.row(fast).await.dispatched);
    // The server had the whole message when its reply failed to come: perhaps delivered.
    let row = db.row(slow).await;
    assert_eq!(row.attempts, 1);
    let error = row.last_error.unwrap();
    assert!(
        error.contains("no reply to the message within 1s; the server may have it"),
        "{error}"
    );
    // The pool was replaced after the timeout; the next message goes through cleanly.
    let next = db.verification_to("next@example.com").await;
    let step = one_step(&mut app).await;
    assert!(
        matches!(step, Step::Batch(ref r) if r.claimed == 2),
        "{step:?}"
    );
    assert!(db.row(next).await.dispatched);
}

#[tokio::test]
async fn a_hung_smtp_server_is_an_outage_not_a_message_failure() {
    let db = TestDb::new().await;
    let hole = BlackHole::start().await;
    let mut app = app(
        &db,
        Some(&hole.url()),
        &["--smtp-timeout", "500ms", "--lease", "5s"],
    )
    .await;
    let id = db.verification_to("a@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Claimed(1), Released(1)]));
    assert_eq!(db.row(id).await.attempts, 0);
    assert!(matches!(one_step(&mut app).await, Step::CircuitOpen { .. }));
}

#[tokio::test]
pub(crate) async fn a_stale_claimer_cannot_overwrite_the_outcome_of_the_one_that_took_over() {
    let db = TestDb::new().await;
    let id = db.verification_to("a@example.com").await;
    let request = |worker| ClaimRequest {
        limit: 10,
        bulk_limit: None,
        lease: Duration::from_millis(200),
        worker_id: worker,
        due_by: None,
        max_payload_bytes: 1 << 20,
        floor: None,
        bulk_kinds: &[],
        bulk_floor: None,
        lanes: &outboxd::message::Lane::ALL,
    };
    let stale = store::claim(&db.store, &db.pool, &request("stale"))
        .await
        .unwrap()
        .batch;
    assert_eq!(stale.messages.len(), 1);
    assert!(
        store::claim(&db.store, &db.pool, &request("other"))
            .await
            .unwrap()
            .batch
            .messages
            .is_empty()
    );

    // Once the 200 ms lease has run out on the database's clock, the row is claimable again.
    let fresh = poll_until(Duration::from_secs(10), "the lease to run out", || async {
        let claimed = store::claim(&db.store, &db.pool, &request("fresh"))
            .await
            .unwrap()
            .batch;
        (!claimed.messages.is_empty()).then_some(claimed)
    })
    .await;
    assert_eq!(fresh.messages.len(), 1);
    assert!(fresh.messages[0].reclaimed);

    let sent = Outcome::Sent {
        via: Delivery::Smtp,
        reply: None,
        relay: None,
        fallback: false,
    };
    assert_eq!(
        store::record_outcomes(
            &db.store,
            &mut db.pool.acquire().await.unwrap(),
            fresh.token,
            "test",
            &[store::OutcomeRow {
                id,
                outcome: &sent,
                took: None,
                bounced: None,
                suppress: false,
            }],
            store::RowLocks::WaitBriefly,
        )
        .await
        .unwrap()
        .written,
        [id]
    );
    let late = Outcome::Retry {
        error_class: "smtp_451".into(),
        failure_type: outboxd::message::FailureType::Transient,
        error: "stale".into(),
        delay: Duration::ZERO,
    };
    assert!(
        store::record_outcomes(
            &db.store,
            &mut db.pool.acquire().await.unwrap(),
            stale.token,
            "test",
            &[store::OutcomeRow {
                id,
                outcome: &late,
                took: None,
                bounced: None,
                suppress: false,
            }],
            store::RowLocks::WaitBriefly,
        )
        .await
        .unwrap()
            == store::Recorded::default(),
        "a lease lost is neither written nor locked"
    );
    let row = db.row(id).await;
    assert!(
        row.dispatched && row.attempts == 0 && row.last_error.is_none(),
        "{row:?}"
    );
}

#[tokio::test]
async fn with_zero_backoff_a_failed_message_waits_for_the_next_cycle() {
    let Scenario {
        db,
        smtp: _smtp,
        mut app,
    } = Scenario::new(&["--retry-backoff", "0s", "--batch-size", "1"]).await;
    let a = db.verification_to("defer-a@example.com").await;
    let b = db.verification_to("defer-b@example.com").await;
    let step = app.dispatcher.drain().await.unwrap();
    assert_eq!(step, batch(&[Claimed(2), Retried(2)]));
    assert_eq!(db.row(a).await.attempts, 1);
    assert_eq!(db.row(b).await.attempts, 1);
}

#[tokio::test]
async fn the_dispatcher_survives_losing_its_database_connections() {
    let Scenario { db, smtp, app } = Scenario::new(&["--poll-interval", "1s"]).await;
    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    db.verification_to("before@example.com").await;
    smtp.wait_for(1, Duration::from_secs(20)).await;

    db.cut_other_connections().await;
    db.verification_to("after@example.com").await;
    smtp.wait_for(2, Duration::from_secs(30)).await;
    assert!(!running.has_ended());
    running.stop().await;
}

#[tokio::test]
pub(crate) async fn outcomes_the_database_missed_are_recorded_before_the_next_claim_not_sent_again()
{
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    // The server holds its reply to DATA until released: the database is cut meanwhile.
    let id = db.verification_to("hold@example.com").await;
    let (failed, ()) = tokio::join!(app.dispatcher.dispatch_once(), async {
        smtp.holding(1).await;
        db.cut_other_connections().await;
        smtp.release();
    });
    assert!(
        matches!(
            failed,
            Err(DispatchError::Database {
                operation: DatabaseOperation::Record,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(smtp.messages().len(), 1);
    assert_eq!(app.dispatcher.held_outcomes(), 1);
    let row = db.row(id).await;
    assert!(!row.dispatched && row.locked_by.is_some(), "{row:?}");

    // The pool may hand out more connections that were cut; each fails once.
    let mut step = app.dispatcher.dispatch_once().await;
    for _ in 0..5 {
        if step.is_ok() {
            break;
        }
        step = app.dispatcher.dispatch_once().await;
    }
    step.unwrap();
    assert_eq!(app.dispatcher.held_outcomes(), 0);
    let row = db.row(id).await;
    assert!(
        row.dispatched && row.attempts == 0 && row.locked_by.is_none(),
        "{row:?}"
    );
    assert_eq!(smtp.messages().len(), 1, "sent once, not again");
}
