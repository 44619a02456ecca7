//! Hostile input: rows that PostgreSQL accepts but outboxd cannot use fail alone, and no
//! single message can hold its batch.

use std::time::Duration;

use outboxd::dispatch::Step;
use serde_json::json;

use crate::helpers::{Count, Scenario, SmtpServer, TestDb, app, batch, one_step, verification};

/// Claims, sends and records one batch, which must end within 30 s: no input may hold it.
async fn one_batch(app: &mut outboxd::app::App) -> Step {
    tokio::time::timeout(Duration::from_secs(30), app.dispatcher.dispatch_once())
        .await
        .expect("the batch ends")
        .unwrap()
}

/// A valid `account_verification` payload, as JSON text, with `extra` spliced in.
fn payload_with(to: &str, extra: &str) -> String {
    format!(r#"{{"to": "{to}", "name": "Ada", "verify_url": "https://app.example/v", {extra}}}"#)
}

#[tokio::test]
async fn a_payload_outboxd_cannot_read_is_dead_lettered_alone_and_its_batch_mates_are_sent() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
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

    let step = one_batch(&mut app).await;
    assert_eq!(
        step,
        batch(&[Count::Claimed(4), Count::Sent(2), Count::DeadLettered(2)])
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
        let detail = outboxd::store::admin::message(&db.store, id)
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
    let Scenario { db, smtp, mut app } = Scenario::new(&["--max-recipients", "100"]).await;
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

    let step = one_batch(&mut app).await;
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
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    let mut payload = verification("twice@example.com");
    payload["cc"] = json!(vec!["twice@EXAMPLE.com"; 50]);
    payload["bcc"] = json!(["Twice@example.com"]);
    db.enqueue("account_verification", payload).await;
    one_step(&mut app).await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    // The domain is case-insensitive; the local part is kept as written.
    assert_eq!(
        received[0].rcpt_tos,
        ["twice@example.com", "Twice@example.com"]
    );
}

#[tokio::test]
async fn a_payload_past_the_size_limit_is_dead_lettered_and_the_rest_is_sent() {
    let Scenario { db, smtp, mut app } = Scenario::new(&["--max-message-bytes", "8KiB"]).await;
    let mut big = verification("big@example.com");
    big["padding"] = json!("x".repeat(20_000));
    let big = db.enqueue("account_verification", big).await;
    db.verification_to("small@example.com").await;
    let step = one_step(&mut app).await;
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
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
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
    let step = one_step(&mut app).await;
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

/// The columns a producer may set to a time, each with a CHECK since migration 12.
const TIME_COLUMNS: [&str; 4] = ["created_at", "not_before", "next_attempt_at", "expires_at"];

/// Migration 12, run again on a table whose rows were written without its CHECKs: the
/// state of a table upgraded to it.
const TIMES_MIGRATION: &str =
    include_str!("../../migrations/20261130000012_times_on_the_calendar.sql");

/// Runs migration 12 again, over whatever the table holds now.
async fn add_time_checks(db: &TestDb) {
    let mut upgrade = db.pool.begin().await.unwrap();
    sqlx::raw_sql(TIMES_MIGRATION)
        .execute(&mut *upgrade)
        .await
        .unwrap();
    upgrade.commit().await.unwrap();
}

/// The CHECK migration 12 puts on one of [`TIME_COLUMNS`].
fn time_check(column: &str) -> String {
    format!("outbox_messages_{column}_on_the_calendar")
}

/// `ALTER TABLE ... {verb} CONSTRAINT` for each time check: `DROP` or `VALIDATE`.
async fn on_each_time_check(db: &TestDb, verb: &str) {
    for column in TIME_COLUMNS {
        db.exec(format!(
            "ALTER TABLE outbox_messages {verb} CONSTRAINT {}",
            time_check(column)
        ))
        .await;
    }
}

async fn drop_time_checks(db: &TestDb) {
    on_each_time_check(db, "DROP").await;
}

#[tokio::test]
async fn times_off_the_calendar_are_refused_at_insert_with_the_column_named() {
    let db = TestDb::new().await;
    let checks: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'outbox_messages'::regclass AND conname LIKE '%on_the_calendar' \
         ORDER BY conname",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut expected: Vec<String> = TIME_COLUMNS.iter().map(|c| time_check(c)).collect();
    expected.sort();
    assert_eq!(checks, expected);
    for column in TIME_COLUMNS {
        for value in [
            "infinity",
            "-infinity",
            "10000-01-01 00:00:00+00",
            "0001-12-31 23:59:59+00 BC",
        ] {
            // The other times set to now, so that only this one is off (the insert trigger
            // would copy a not_before into next_attempt_at).
            let others: Vec<_> = TIME_COLUMNS.into_iter().filter(|c| *c != column).collect();
            let error = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO outbox_messages (kind, payload, {column}, {}) \
                 VALUES ('account_verification', '{{}}', '{value}', now(), now(), now())",
                others.join(", ")
            )))
            .execute(&db.pool)
            .await
            .expect_err("refused");
            let error = error.as_database_error().expect("a database error");
            assert_eq!(
                error.code().as_deref(),
                Some("23514"),
                "{column} = {value}: {error}"
            );
            assert_eq!(error.constraint(), Some(time_check(column).as_str()));
        }
    }
    // The Rust producer API holds the same range (`TIME_RANGE_SECS`): it refuses a second
    // past either end before the database does, and the database takes both ends.
    let (first, last) = (
        *outboxd_producer::TIME_RANGE_SECS.start(),
        *outboxd_producer::TIME_RANGE_SECS.end(),
    );
    let at = |secs: i64, nanos: u32| chrono::DateTime::from_timestamp(secs, nanos).unwrap();
    let message = |time| {
        outboxd::message::NewMessage::new("account_verification", verification("a@example.com"))
            .unwrap()
            .with_not_before(time)?
            .with_expires_at(time)
    };
    for time in [at(first - 1, 0), at(last + 1, 0)] {
        let refused = message(time).unwrap_err();
        assert!(refused.to_string().contains("years 1 to 9999"), "{refused}");
    }
    assert_eq!(db.count("all").await, 0);
    for time in [at(first, 0), at(last, 999_999_000)] {
        db.store
            .enqueue(&db.pool, message(time).unwrap())
            .await
            .unwrap();
    }
    assert_eq!(db.count("all").await, 2);
}

#[tokio::test]
async fn rows_from_before_the_checks_are_read_repaired_and_sent() {
    let Scenario { db, smtp, mut app } =
        Scenario::new(&["--expire-after", "account_verification=24h"]).await;
    drop_time_checks(&db).await;
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, created_at, not_before, next_attempt_at, expires_at) \
         VALUES ('account_verification', $1, now(), now(), now(), 'infinity'), \
                ('account_verification', $2, '270000-01-01', now(), '-infinity', NULL), \
                ('account_verification', $3, '-infinity', '-infinity', '-infinity', NULL), \
                ('account_verification', $4, now(), now(), now(), '10000-01-01'), \
                ('account_verification', $5, now(), now(), now(), NULL) \
         RETURNING id",
    )
    .bind(verification("never-expires@example.com"))
    .bind(verification("far-future@example.com"))
    .bind(verification("long-ago@example.com"))
    .bind(verification("year-10000@example.com"))
    .bind(verification("plain@example.com"))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    add_time_checks(&db).await;

    // What reads the table copes: the gauges (a due time of -infinity counts as year 1, an
    // absurd age whose alert fires), the counts per kind, an operator's look at a row.
    let sample = outboxd::store::sample(&db.store, Duration::from_secs(10), None)
        .await
        .expect("the gauges are read");
    assert!(sample.totals.oldest_pending_age > 6e10, "{sample:?}");
    outboxd::store::stats::stats(&db.store)
        .await
        .expect("the stats are read");
    for id in &ids {
        outboxd::store::admin::message(&db.store, *id)
            .await
            .expect("the row is read")
            .expect("the row exists");
    }
    // The claim moves the times into the range as it takes the rows (the CHECKs refuse
    // any update that does not). Created "at -infinity", year 1 once moved, one row is past
    // its kind's 24 hours and ends as expired; the others are sent.
    assert_eq!(
        one_batch(&mut app).await,
        batch(&[Count::Claimed(5), Count::Sent(4), Count::Expired(1)]),
        "rows {ids:?}"
    );
    let expired: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM outbox_messages WHERE end_reason = 'expired'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(expired, [ids[2]]);
    assert_eq!(db.count("dispatched").await, 4);
    assert_eq!(smtp.messages().len(), 4, "the relay received the four sent");
}

#[tokio::test]
async fn an_operator_can_retry_and_discard_old_dead_letters_with_times_off_the_calendar() {
    use outboxd::store::admin::{Action, Operator, Selection, apply};
    let db = TestDb::new().await;
    drop_time_checks(&db).await;
    // Dead letters never come back to the claim that repairs a row's times: the operators'
    // updates must pass the CHECKs by themselves.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages \
             (kind, payload, created_at, not_before, next_attempt_at, expires_at, dead_lettered_at) \
         VALUES ('account_verification', '{}', '20000-01-01', now(), now(), 'infinity', now()), \
                ('account_verification', '{}', now(), '-infinity', '-infinity', NULL, now()) \
         RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    add_time_checks(&db).await;

    let requeued = apply(
        &db.store,
        Action::Retry,
        &Selection::Ids(vec![ids[0]]),
        &Operator::named("ops"),
    )
    .await
    .expect("retried");
    assert_eq!(requeued.changed, [ids[0]]);
    let discarded = apply(
        &db.store,
        Action::Discard,
        &Selection::All,
        &Operator::named("ops"),
    )
    .await
    .expect("discarded");
    assert_eq!(discarded.changed, [ids[1]]);
    // Both rows now pass every check.
    on_each_time_check(&db, "VALIDATE").await;
}

#[tokio::test]
async fn a_row_whose_attempts_are_at_the_integers_end_fails_alone_and_its_batch_is_recorded() {
    let Scenario {
        db,
        smtp: _smtp,
        mut app,
    } = Scenario::new(&[]).await;
    // A producer may write any count of attempts; this one cannot go up by one more.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, attempts) \
         VALUES ('account_verification', '{\"to\": \"no-url@example.com\", \"name\": \"Ada\"}', \
                 2147483647), \
                ('account_verification', $1, 0) \
         RETURNING id",
    )
    .bind(verification("fine@example.com"))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        one_batch(&mut app).await,
        batch(&[Count::Claimed(2), Count::Sent(1), Count::DeadLettered(1)])
    );
    let stuck = db.row(ids[0]).await;
    assert!(stuck.dead && stuck.attempts == i32::MAX, "{stuck:?}");
    assert!(db.row(ids[1]).await.dispatched);
    assert_eq!(app.dispatcher.held_outcomes(), 0);
}

#[tokio::test]
async fn a_negative_count_of_throttled_releases_buys_no_extra_free_releases() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start_with(
        crate::helpers::free_port(),
        &["--throttle-every", "1", "--throttle-for", "600"],
    );
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, throttled_releases) \
         VALUES ('account_verification', $1, -1000000) RETURNING id",
    )
    .bind(verification("throttled@example.com"))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let step = one_batch(&mut app).await;
    assert_eq!(step, batch(&[Count::Claimed(1), Count::Released(1)]));
    let count: i32 = db
        .scalar(
            "SELECT throttled_releases FROM outbox_messages WHERE id = $1",
            id,
        )
        .await;
    assert_eq!(
        count, 1,
        "the count starts from zero, not from the producer's -1000000"
    );
}

#[tokio::test]
async fn dead_letters_with_odd_fields_a_producer_wrote_can_be_listed_looked_at_and_retried() {
    use outboxd::store::admin::{
        Action, Operator, Selection, apply, groups, list_dead_letters, message,
    };
    let db = TestDb::new().await;
    // Columns that are outboxd's own, but that an insert can still set: a time the driver
    // cannot read back, and an end reason without its discard.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_messages \
             (kind, payload, dead_lettered_at, dispatched_at, feedback_at, end_reason) \
         VALUES ('account_verification', '{}', 'infinity', NULL, NULL, NULL), \
                ('account_verification', '{}', '-infinity', 'infinity', '-infinity', NULL), \
                ('account_verification', '{}', now(), NULL, NULL, 'expired'), \
                ('account_verification', '{}', now(), NULL, NULL, NULL) \
         RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        list_dead_letters(&db.store, None, None, None, 100)
            .await
            .expect("the dead letters are listed")
            .len(),
        4
    );
    groups(&db.store).await.expect("the groups are read");
    for id in &ids {
        message(&db.store, *id)
            .await
            .expect("the row is read")
            .expect("the row exists");
    }
    let mut requeued = apply(
        &db.store,
        Action::Retry,
        &Selection::All,
        &Operator::named("ops"),
    )
    .await
    .expect("one odd row does not hold up the others")
    .changed;
    requeued.sort_unstable();
    assert_eq!(requeued, ids);
}
