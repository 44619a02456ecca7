//! Withdrawing pending messages by filter (`outboxd cancel`, `/api/v1/pending/...`) while a
//! replica delivers: counted first, then each message either sent or cancelled, never both,
//! other kinds delivered meanwhile, every batch audited; and each request that cannot be
//! meant refused, changing nothing.

use std::time::Duration;

use serde_json::json;

use crate::admin::api;
use crate::helpers::{Outboxd, SmtpServer, TestDb, eventually, outboxd, succeeds};

const CAMPAIGN: &str = "campaign:spring";

/// `n` verification emails tagged with the campaign, due now, committed at once.
async fn campaign(db: &TestDb, n: i32) {
    db.exec(&format!(
        "INSERT INTO outbox_messages (kind, payload, tags) \
         SELECT 'account_verification', jsonb_build_object('to', 'c' || g || '@example.com', \
                'name', 'Ada', 'verify_url', 'https://app.example/v'), ARRAY['{CAMPAIGN}'] \
         FROM generate_series(1, {n}) g"
    ))
    .await;
}

async fn tagged(db: &TestDb, condition: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM outbox_messages m JOIN outbox_message_tags t \
         ON t.message_id = m.id AND t.tag = $1 WHERE {condition}"
    )))
    .bind(CAMPAIGN)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_campaign_is_counted_then_cancelled_while_other_kinds_are_delivered() {
    let db = TestDb::new().await;
    campaign(&db, 5000).await;
    let count = succeeds(
        outboxd().args(["cancel", "--database-url", &db.url, "--tag", CAMPAIGN]),
        "outboxd cancel (count)",
    );
    assert!(count.contains("\n5000 pending messages match"), "{count}");
    assert_eq!(
        tagged(
            &db,
            "m.dispatched_at IS NULL AND m.dead_lettered_at IS NULL"
        )
        .await,
        5000
    );

    let smtp = SmtpServer::start();
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    let others = db.insert_many("workspace_invite", 300).await;
    let cancelled = succeeds(
        outboxd().args([
            "cancel",
            "--database-url",
            &db.url,
            "--tag",
            CAMPAIGN,
            "--yes",
        ]),
        "outboxd cancel --yes",
    );
    eventually(
        Duration::from_secs(60),
        "the other kind delivered",
        || async { db.sent_of("workspace_invite").await == 300 },
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "no campaign message pending",
        || async {
            tagged(
                &db,
                "m.dispatched_at IS NULL AND m.dead_lettered_at IS NULL",
            )
            .await
                == 0
        },
    )
    .await;

    let sent = tagged(&db, "m.dispatched_at IS NOT NULL").await;
    let ended = tagged(
        &db,
        "m.end_reason = 'cancelled' AND m.dispatched_at IS NULL",
    )
    .await;
    assert_eq!(
        sent + ended,
        5000,
        "each campaign message sent or cancelled: {cancelled}"
    );
    assert!(ended > 0, "{cancelled}");
    let mut ids: Vec<String> = smtp.messages().into_iter().map(|m| m.outbox_id).collect();
    let arrived = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), arrived, "none sent twice");
    assert_eq!(arrived as i64, sent + others.len() as i64);
    // What the command said it changed is what the audit trail and the table hold.
    let audited: i64 = db
        .scalar(
            "SELECT coalesce(sum(rows), 0)::bigint FROM outbox_admin_audit \
             WHERE action = 'cancel' AND target = $1",
            "filter",
        )
        .await;
    let said: Vec<i64> = cancelled
        .lines()
        .last()
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(said.iter().sum::<i64>(), audited, "{cancelled}");
    assert!(said[0] <= ended, "{cancelled}: {ended} ended cancelled");
}

#[tokio::test]
async fn requests_to_cancel_that_cannot_be_meant_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    campaign(&db, 3).await;
    let (_app, addr) = crate::admin::admin_app(&db, None, &[]).await;
    for (path, body, says) in [
        (
            "/api/v1/messages/cancel",
            json!({}),
            "give the message's id or its key",
        ),
        (
            "/api/v1/messages/cancel",
            json!({"id": 1, "key": "k"}),
            "not both",
        ),
        (
            "/api/v1/messages/cancel",
            json!({"key": ""}),
            "key must be 1 to 200",
        ),
        (
            "/api/v1/messages/cancel",
            json!({"key": "k".repeat(201)}),
            "key must be 1 to 200",
        ),
        (
            "/api/v1/messages/cancel",
            json!({"ids": [1]}),
            "unknown field",
        ),
        ("/api/v1/pending/cancel", json!({}), "name at least one"),
        (
            "/api/v1/pending/cancel",
            json!({"kind": "Not A Kind"}),
            "kind",
        ),
        (
            "/api/v1/pending/cancel",
            json!({"recipient_domain": "%"}),
            "not a domain name",
        ),
        ("/api/v1/pending/count", json!({"tag": "a b"}), "tag"),
        (
            "/api/v1/pending/cancel",
            json!({"created_before": "2026-01-01T00:00:00Z", "created_after": "2026-06-01T00:00:00Z"}),
            "matches nothing",
        ),
    ] {
        let response = api(&addr, "POST", path, Some(body.clone())).await;
        assert_eq!(response.status, 400, "{path} {body}: {}", response.body);
        assert!(
            response.body.contains(says),
            "{path} {body}: {}",
            response.body
        );
    }
    let pending: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NULL AND $1",
            true,
        )
        .await;
    assert_eq!(pending, 3, "nothing changed");

    // And what can be meant is answered, audited with the actor.
    let counted = api(
        &addr,
        "POST",
        "/api/v1/pending/count",
        Some(json!({"tag": CAMPAIGN})),
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.body);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&counted.body).unwrap(),
        json!({"matching": 3, "in_flight": 0})
    );
    let one = api(
        &addr,
        "POST",
        "/api/v1/messages/cancel",
        Some(json!({"id": 1})),
    )
    .await;
    assert_eq!(one.body, r#"{"answer":"cancelled"}"#);
    let rest = api(
        &addr,
        "POST",
        "/api/v1/pending/cancel",
        Some(json!({"tag": CAMPAIGN})),
    )
    .await;
    assert_eq!(rest.body, r#"{"cancelled":2,"in_flight":0}"#);
    let trail: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT actor, target, rows, detail FROM outbox_admin_audit WHERE action = 'cancel' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        trail,
        [
            (
                "api:alice".into(),
                "id:1".into(),
                1,
                Some("cancelled".into())
            ),
            (
                "api:alice".into(),
                "filter".into(),
                2,
                Some(format!("tag={CAMPAIGN}"))
            ),
        ]
    );
}

#[tokio::test]
async fn the_admin_page_counts_a_filter_then_cancels_it_and_cancels_one_message() {
    let db = TestDb::new().await;
    campaign(&db, 4).await;
    let (_app, addr) = crate::admin::admin_app(&db, None, &[]).await;
    let auth = crate::admin::basic("ops", crate::admin::TOKEN);
    let get = |path: String| {
        let (auth, addr) = (auth.clone(), addr.clone());
        async move {
            crate::helpers::http_full(&addr, "GET", &path, &[("Authorization", &auth)], "")
                .await
                .unwrap()
        }
    };
    let post = |path: String, form: String| {
        let (auth, addr) = (auth.clone(), addr.clone());
        async move {
            let origin = format!("http://{addr}");
            let headers = [
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Origin", origin.as_str()),
            ];
            crate::helpers::http_full(&addr, "POST", &path, &headers, &form)
                .await
                .unwrap()
        }
    };
    // One message, from its page.
    let one = get("/admin/messages/1".into()).await;
    assert!(one.body.contains("Cancel this message"), "{}", one.body);
    let csrf = crate::admin::csrf_in(&one.body);
    let cancelled = post("/admin/messages/1/cancel".into(), format!("csrf={csrf}")).await;
    assert_eq!(cancelled.status, 303, "{}", cancelled.body);
    assert!(
        cancelled.headers.contains("Message+1%3A+cancelled"),
        "{}",
        cancelled.headers
    );
    // The rest by tag: counted first, then cancelled by the count page's form.
    let counted = get(format!("/admin/pending?tag={CAMPAIGN}&kind=")).await;
    assert!(
        counted
            .body
            .contains("<strong>3</strong> pending messages match"),
        "{}",
        counted.body
    );
    let csrf = crate::admin::csrf_in(&counted.body);
    let refused = get("/admin/pending?tag=a+b".into()).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    let forged = post(
        "/admin/pending/cancel".into(),
        format!("csrf=wrong&tag={CAMPAIGN}"),
    )
    .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let rest = post(
        "/admin/pending/cancel".into(),
        format!("csrf={csrf}&tag={CAMPAIGN}"),
    )
    .await;
    assert_eq!(rest.status, 303, "{}", rest.body);
    let ended: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_messages WHERE end_reason = $1",
            "cancelled",
        )
        .await;
    assert_eq!(ended, 4);
    let trail: Vec<(String, i32)> = sqlx::query_as(
        "SELECT target, rows FROM outbox_admin_audit WHERE action = 'cancel' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(trail, [("id:1".to_owned(), 1), ("filter".to_owned(), 3)]);
}
