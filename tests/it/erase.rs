//! Erasure by recipient: every text outboxd keeps of an address replaced by its one-way
//! mark, the suppression list kept (or kept as the mark, which the claim still honours),
//! and nothing of anyone else touched.

use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::{admin_app, api};
use crate::helpers::{Outboxd, SmtpServer, TestDb, outboxd, succeeds};

/// Every text (text, jsonb, text[]) of outboxd's tables that holds `needle`, but in the
/// suppression lists, as `table.column: value`.
async fn traces_of(db: &TestDb, needle: &str) -> Vec<String> {
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name LIKE 'outbox\\_%' \
           AND data_type IN ('text', 'jsonb', 'ARRAY', 'character varying') \
           AND table_name NOT IN ('outbox_suppressions', 'outbox_lane_suppressions') \
         ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        columns.len() > 30,
        "the search reads every table: {columns:?}"
    );
    let mut found = Vec::new();
    for (table, column) in columns {
        let sql = format!(
            "SELECT \"{column}\"::text FROM {table} WHERE \"{column}\"::text ILIKE '%' || $1 || '%'"
        );
        let hits: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(needle)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        found.extend(hits.into_iter().map(|v| format!("{table}.{column}: {v}")));
    }
    found
}

#[tokio::test]
async fn erasing_an_address_leaves_no_trace_of_it_outside_the_suppression_list() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, next_attempt_at, dispatched_at, smtp_reply, idempotency_key) VALUES \
         ('account_verification', '{\"to\": \"Ada <ADA@Example.com>\", \"name\": \"Ada Lovelace\", \"verify_url\": \"https://x/ada@example.com\"}', \
          now(), now(), '250 2.0.0 <ada@example.com> queued as 4XyZ', 'welcome:ada@example.com'), \
         ('invoice_notice', '{\"to\": [\"ada@example.com\"], \"cc\": \"bob@example.com\", \"amount\": \"12\"}', now(), now(), '250 ok', NULL), \
         ('invoice_notice', '{\"to\": \"notada@example.com\", \"note\": \"not ada@example.com.au\"}', now(), now(), '250 ok', NULL)",
    )
    .await;
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, next_attempt_at, attempts, last_error, dead_lettered_at) VALUES \
         ('account_verification', '{\"to\": \"ada@example.com\", \"name\": \"Ada\"}', now(), 3, \
          'permanent error (550): 5.1.1 <ada@example.com>: Recipient address rejected', now())",
    )
    .await;
    db.exec(
        "INSERT INTO outbox_message_events (message_id, event, detail) \
         SELECT id, 'retry', '450 4.2.0 <Ada@Example.com>: mailbox busy' FROM outbox_messages \
         WHERE payload->>'to' IS DISTINCT FROM 'notada@example.com'; \
         INSERT INTO outbox_callbacks (message_id, event, detail) \
         SELECT id, 'message.sent', smtp_reply FROM outbox_messages WHERE smtp_reply IS NOT NULL",
    )
    .await;
    let pending = db
        .enqueue(
            "account_verification",
            json!({"to": "ada@example.com", "name": "Ada", "verify_url": "v"}),
        )
        .await;
    db.exec(format!(
        "UPDATE outbox_messages SET next_attempt_at = now() + interval '1 hour', \
         last_error = '451 4.7.1 <ada@example.com>: try later' WHERE id = {pending}; \
         INSERT INTO outbox_message_events (message_id, event, detail) \
         VALUES ({pending}, 'retry', '451 4.7.1 ''ada@example.com'': try later')"
    ))
    .await;
    let suppress = json!({"address": "ada@example.com", "reason": "manual", "detail": "asked by ada@example.com"});
    assert_eq!(
        api(&addr, "POST", "/api/v1/suppressions", Some(suppress))
            .await
            .status,
        201
    );
    let looked = api(
        &addr,
        "GET",
        "/api/v1/messages?recipient=ada@example.com",
        None,
    )
    .await;
    assert_eq!(looked.status, 200);
    let pause = json!({"reason": "complaint from ada@example.com"});
    assert_eq!(
        api(
            &addr,
            "POST",
            "/api/v1/kinds/invoice_notice/pause",
            Some(pause)
        )
        .await
        .status,
        200
    );
    assert!(traces_of(&db, "ada@example.com").await.len() > 10);

    let said = succeeds(
        outboxd().args([
            "erase",
            "--database-url",
            &db.url,
            "--recipient",
            "ADA@example.com",
            "--yes",
        ]),
        "outboxd erase",
    );
    let mark = said
        .split_whitespace()
        .find(|w| w.ends_with("@erased.invalid"))
        .expect("the mark")
        .to_owned();
    assert!(
        said.contains("pending messages cancelled: 1") && said.contains("ended messages erased: 3"),
        "{said}"
    );

    // Only the bystanders' own addresses, which merely contain this one, are left.
    let left: Vec<String> = traces_of(&db, "ada@example.com")
        .await
        .into_iter()
        .filter(|t| {
            t.replace("notada@example.com", "")
                .replace("ada@example.com.au", "")
                .to_lowercase()
                .contains("ada@example.com")
        })
        .collect();
    assert!(left.is_empty(), "{left:#?}");
    assert_eq!(
        traces_of(&db, "Lovelace").await,
        Vec::<String>::new(),
        "the rest of the payload is gone"
    );
    let bystander: String = db
        .scalar(
            "SELECT payload::text FROM outbox_messages WHERE payload->>'to' = $1",
            "notada@example.com",
        )
        .await;
    assert!(bystander.contains("not ada@example.com.au"), "{bystander}");
    let cc: String = db
        .scalar(
            "SELECT payload::text FROM outbox_messages WHERE payload->>'cc' = $1",
            "bob@example.com",
        )
        .await;
    assert_eq!(
        cc,
        format!(r#"{{"cc": "bob@example.com", "to": ["{mark}"]}}"#)
    );
    let cancelled: String = db
        .scalar(
            "SELECT end_reason FROM outbox_messages WHERE id = $1",
            pending,
        )
        .await;
    assert_eq!(cancelled, "cancelled");

    // The suppression entry stays; the mark finds the messages and their timelines whole.
    let kept: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_suppressions WHERE address = $1",
            "ada@example.com",
        )
        .await;
    assert_eq!(kept, 1);
    let by_mark = api(
        &addr,
        "GET",
        &format!("/api/v1/messages?recipient={mark}"),
        None,
    )
    .await;
    let by_mark: Value = serde_json::from_str(&by_mark.body).unwrap();
    let found = by_mark["messages"].as_array().expect("messages");
    assert_eq!(found.len(), 4, "{by_mark}");
    assert!(
        found
            .iter()
            .all(|m| !m["events"].as_array().unwrap().is_empty())
    );
    let audited: String = db
        .scalar(
            "SELECT target FROM outbox_admin_audit WHERE action = $1",
            "erase",
        )
        .await;
    assert_eq!(audited, mark);
    // The same address erased again: the same mark, nothing more to change.
    let again = succeeds(
        outboxd().args([
            "erase",
            "--database-url",
            &db.url,
            "--recipient",
            "ada@example.com",
            "--yes",
        ]),
        "outboxd erase again",
    );
    assert!(
        again.contains(&mark) && again.contains("ended messages erased: 0"),
        "{again}"
    );
}

#[tokio::test]
async fn a_suppression_kept_as_the_mark_still_stops_mail_to_the_erased_address() {
    let db = TestDb::new().await;
    db.exec(
        "INSERT INTO outbox_suppressions (address, reason, source, detail) \
         VALUES ('ada@example.com', 'hard_bounce', 'smtp', '550 5.1.1 <ada@example.com>: no such user'); \
         INSERT INTO outbox_lane_suppressions (address, lane, reason, source) \
         VALUES ('ada@example.com', 'bulk', 'unsubscribe', 'one-click')",
    )
    .await;
    succeeds(
        outboxd().args([
            "erase",
            "--database-url",
            &db.url,
            "--recipient",
            "ada@example.com",
            "--mark-suppression",
            "--yes",
        ]),
        "outboxd erase --mark-suppression",
    );
    let traces = traces_of(&db, "ada@example.com").await;
    assert!(traces.is_empty(), "{traces:?}");
    let listed: Vec<String> = sqlx::query_scalar(
        "SELECT address || ' ' || coalesce(detail, '') FROM outbox_suppressions \
         UNION ALL SELECT address || ' ' || lane FROM outbox_lane_suppressions ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .all(|l| l.starts_with("erased-") && !l.contains("ada@")),
        "{listed:?}"
    );

    // The claim reads the mark of every recipient: Ada gets nothing, Bob his email.
    let smtp = SmtpServer::start();
    let _replica = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    let ada = db.verification_to("Ada <ada@Example.com>").await;
    db.verification_to("bob@example.com").await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received[0].rcpt_tos, ["bob@example.com"]);
    assert_eq!(
        db.ended(ada).await.0.as_deref(),
        Some("suppressed"),
        "Ada's"
    );
}

#[tokio::test]
async fn an_erasure_without_yes_or_with_a_bad_address_changes_nothing() {
    let db = TestDb::new().await;
    db.verification_to("ada@example.com").await;
    for (args, says) in [
        (vec!["--recipient", "ada@example.com"], "--yes"),
        (
            vec!["--recipient", "not an address", "--yes"],
            "not an email address",
        ),
    ] {
        let output = outboxd()
            .args(["erase", "--database-url", &db.url])
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let untouched: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_messages WHERE payload->>'to' = $1",
            "ada@example.com",
        )
        .await;
    assert_eq!(untouched, 1);
}
