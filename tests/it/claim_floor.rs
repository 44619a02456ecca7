//! Claims scan the due index from a floor (so that a transaction left open elsewhere does
//! not make them walk every row sent since). Rows that commit below the floor must still
//! go out at once: the insert trigger tells the dispatcher their due time. No claim waits
//! for PostgreSQL to JIT-compile it, and none reads the suppression list once per row.
//! Nor is a small outcome write planned again each time.

use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::PgListener;

use crate::helpers::{Dispatching, SmtpServer, TestDb, app, one_step, verification};
use outboxd::message::{Delivery, Outcome};
use outboxd::store::{self, ClaimRequest, OutcomeRow, RowLocks};

#[tokio::test]
async fn rows_that_commit_below_the_claim_floor_are_sent_as_soon_as_they_commit() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    // Ten minutes between polls, and a full scan once a minute: within 30 s, only the
    // trigger's notification can explain a delivery.
    let app = app(&db, Some(&smtp.url()), &["--poll-interval", "10m"]).await;
    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    db.wait_for_listener().await;

    // A producer's transaction begins (its row will be due when it began) and stays open
    // while later rows are committed and sent, moving the floor past it.
    let mut late = db.pool.begin().await.unwrap();
    outboxd_producer::enqueue(
        &mut *late,
        outboxd::NewMessage::new("account_verification", verification("late@example.com")).unwrap(),
    )
    .await
    .unwrap();
    for n in 0..3 {
        db.enqueue(
            "account_verification",
            verification(&format!("on-time-{n}@example.com")),
        )
        .await;
    }
    smtp.wait_for(3, Duration::from_secs(30)).await;
    late.commit().await.unwrap();
    let received = smtp.wait_for(4, Duration::from_secs(30)).await;
    assert!(
        received
            .iter()
            .any(|m| m.rcpt_tos.iter().any(|r| r == "late@example.com"))
    );

    // A producer may also ask for a time long past.
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, not_before) \
         VALUES ('account_verification', $1, now() - interval '1 hour')",
    )
    .bind(verification("overdue@example.com"))
    .execute(&db.pool)
    .await
    .unwrap();
    let received = smtp.wait_for(5, Duration::from_secs(30)).await;
    assert!(
        received
            .iter()
            .any(|m| m.rcpt_tos.iter().any(|r| r == "overdue@example.com"))
    );

    running.stop().await;
}

#[tokio::test]
async fn a_row_an_application_holds_a_key_share_lock_on_is_still_claimed() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let id = db.verification_to("held@example.com").await;
    // What a foreign key check from an application's table takes, in a transaction left
    // open: it does not stop an update that keeps the key, and must not stop the claim.
    let application = db.hold_row(id, "FOR KEY SHARE").await;
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    one_step(&mut app).await;
    assert!(db.row(id).await.dispatched, "the row was skipped as locked");
    application.rollback().await.unwrap();
}

#[tokio::test]
async fn the_insert_trigger_notifies_the_due_time_of_what_it_inserts() {
    let db = TestDb::new().await;
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener
        .listen(outboxd::store::NOTIFY_CHANNEL)
        .await
        .unwrap();
    for (not_before, payload) in [
        ("2026-01-01T00:00:00.750Z", "1767225600750"),
        // The last time the table takes (times off the calendar are refused at the insert).
        ("9999-12-31T23:59:59.999Z", "253402300799999"),
    ] {
        sqlx::query(
            "INSERT INTO outbox_messages (kind, payload, not_before) \
             VALUES ('account_verification', $1, $2::timestamptz)",
        )
        .bind(verification("a@example.com"))
        .bind(not_before)
        .execute(&db.pool)
        .await
        .unwrap();
        let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notification")
            .unwrap();
        assert_eq!(notification.payload(), payload, "{not_before}");
    }
}

#[tokio::test]
async fn the_dispatchers_sessions_run_without_jit_compilation() {
    let db = TestDb::new().await;
    // On, whatever the server's default: a claim's cost estimate alone could then start a
    // compilation that takes far longer than the claim.
    db.set_default("jit", Some("on")).await;
    let app = app(&db, None, &[]).await;
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(app.store().pool())
        .await
        .unwrap();
    assert_eq!(jit, "off");
}

#[tokio::test]
async fn a_claim_reads_a_suppression_list_of_a_thousand_addresses_once_for_its_whole_batch() {
    let db = TestDb::new().await;
    // A thousand addresses: few enough that the planner reads the table rather than its
    // index, which row by row cost 85 us a row.
    db.exec(
        "INSERT INTO outbox_suppressions (address, reason, source) \
         SELECT 'gone' || i || '@example.org', 'hard_bounce', 'smtp' \
         FROM generate_series(1, 1000) AS i",
    )
    .await;
    db.insert_many("account_verification", 100).await;
    db.exec("ANALYZE outbox_suppressions, outbox_messages")
        .await;
    let plan: (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        db.store.statement_text("claim").expect("the claim")
    )))
    .bind(100_i64)
    .bind(60.0_f64)
    .bind("plan-test")
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(uuid::Uuid::new_v4())
    .bind(1_000_000_i64)
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(Vec::<String>::new())
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(vec!["transactional", "bulk"])
    .bind(None::<i64>)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut reads = Vec::new();
    reads_of("outbox_suppressions", &plan.0[0]["Plan"], &mut reads);
    assert!(
        !reads.is_empty(),
        "the claim did not read the list: {}",
        plan.0
    );
    // The entries kept as an erased address's mark are read only once there are some: until
    // then that scan's branch never runs (0 loops).
    assert!(
        reads.iter().all(|loops| *loops <= 1) && reads.iter().filter(|l| **l == 1).count() == 1,
        "the list was read {reads:?} times, not once: {}",
        plan.0
    );
}

/// The `Actual Loops` of every node of `plan` that reads `table`.
fn reads_of(table: &str, plan: &Value, reads: &mut Vec<u64>) {
    if plan["Relation Name"] == table {
        reads.push(plan["Actual Loops"].as_u64().unwrap_or(0));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        reads_of(table, child, reads);
    }
}

#[tokio::test]
async fn an_outcome_write_of_one_message_keeps_the_plan_postgresql_made_once() {
    let db = TestDb::new().await;
    // A table of some size, as every installation's soon is: over a few hundred rows the
    // plan PostgreSQL would keep lost to the plan of each small write.
    db.insert_many("account_verification", 2_000).await;
    db.exec("ANALYZE outbox_messages").await;
    let mut connection = db.pool.acquire().await.unwrap();
    let request = ClaimRequest {
        limit: 1,
        bulk_limit: None,
        lease: Duration::from_secs(60),
        worker_id: "plan-test",
        due_by: None,
        max_payload_bytes: 1 << 20,
        floor: None,
        bulk_kinds: &[],
        bulk_floor: None,
        lanes: &outboxd::message::Lane::ALL,
    };
    let sent = Outcome::Sent {
        via: Delivery::Smtp,
        reply: None,
        relay: None,
        fallback: false,
    };
    let writes = 10;
    for _ in 0..writes {
        let batch = store::claim(&db.store, &mut *connection, &request)
            .await
            .unwrap()
            .batch;
        let outcomes = [OutcomeRow {
            id: batch.messages[0].id,
            outcome: &sent,
            took: None,
            bounced: None,
            suppress: false,
        }];
        let recorded = store::record_outcomes(
            &db.store,
            &mut connection,
            batch.token,
            "plan-test",
            &outcomes,
            RowLocks::WaitBriefly,
        )
        .await
        .unwrap();
        assert_eq!(recorded.written.len(), 1);
    }
    // The first five executions are always planned for their parameters.
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE '%UPDATE outbox_messages AS m%INSERT INTO outbox_message_events%' \
           AND statement NOT LIKE '%pg_prepared_statements%'",
    )
    .fetch_one(&mut *connection)
    .await
    .unwrap();
    assert_eq!(
        (generic, custom),
        (writes - 5, 5),
        "the outcome write was planned {custom} times in {writes}"
    );
}
