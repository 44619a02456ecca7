//! Each message's timeline, and finding a user's messages by address: what support asks
//! ("did they get their email, and if not, why?").

use std::time::Duration;

use serde_json::Value;

use crate::admin::{TOKEN, admin_app, api_get, api_post, basic};
use crate::helpers::{SmtpServer, TestDb, http_full, one_step, outboxd, verification};

/// The events of a message as the API gives them: `(type, smtp_code)`.
fn events(message: &Value) -> Vec<(String, Option<i64>)> {
    message["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_owned(),
                e["smtp_code"].as_i64(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_message_deferred_then_accepted_is_found_by_its_recipient_in_any_case_with_both_replies()
{
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (mut app, addr) = admin_app(&db, Some(&smtp.url()), &["--retry-backoff", "0s"]).await;
    // The server greylists the first attempt at this address (451), then accepts it.
    let id = db
        .enqueue(
            "account_verification",
            verification("flaky1-ann@example.com"),
        )
        .await;
    let other = db.verification_to("bob@example.com").await;
    while !db.row(id).await.dispatched {
        one_step(&mut app).await;
    }
    let queue_id = smtp.wait_for(2, Duration::from_secs(30)).await;
    let queue_id = &queue_id
        .iter()
        .find(|m| m.outbox_id == id.to_string())
        .expect("received")
        .queue_id;

    let found = api_get(&addr, "/api/v1/messages?recipient=FLAKY1-Ann@Example.COM")
        .await
        .ok_json();
    let messages = found["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "only Ann's, not {other}'s: {found}");
    let message = &messages[0];
    assert_eq!(message["id"], id);
    assert_eq!(
        events(message),
        [
            ("enqueued".to_owned(), None),
            ("retry".to_owned(), Some(451)),
            ("sent".to_owned(), Some(250)),
        ]
    );
    let replies: Vec<&str> = message["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["smtp_reply"].as_str())
        .collect();
    assert!(replies[0].contains("greylisted"), "{replies:?}");
    assert!(
        replies[1].contains(&format!("queued as {queue_id}")),
        "{replies:?}"
    );
    assert_eq!(message["smtp_reply"], replies[1]);
    // The same timeline for the message by its id.
    let one = api_get(&addr, &format!("/api/v1/messages/{id}"))
        .await
        .json();
    assert_eq!(one["events"], message["events"]);

    // And from the command line, any case again.
    let printed = outboxd()
        .args([
            "messages",
            "--recipient",
            "Flaky1-ANN@example.com",
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8_lossy(&printed.stdout);
    for said in ["enqueued", "retry", "greylisted", "sent", queue_id.as_str()] {
        assert!(printed.contains(said), "{said} in:\n{printed}");
    }
    let json = outboxd()
        .args([
            "messages",
            "--id",
            &id.to_string(),
            "--json",
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json[0]["events"], message["events"]);
}

#[tokio::test]
async fn dead_letters_and_operators_actions_are_in_the_timeline_and_pending_messages_are_found() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (mut app, addr) = admin_app(&db, Some(&smtp.url()), &[]).await;
    let refused = db
        .enqueue(
            "account_verification",
            verification("reject-carol@example.com"),
        )
        .await;
    one_step(&mut app).await;
    let retried = api_post(&addr, &format!("/api/v1/dead-letters/{refused}/retry")).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    // Pending again, and found from the pending rows, with its history.
    let found = api_get(&addr, "/api/v1/messages?recipient=reject-carol@example.com")
        .await
        .json();
    let message = &found["messages"][0];
    assert_eq!(message["state"], "pending", "{found}");
    assert_eq!(
        events(message),
        [
            ("enqueued".to_owned(), None),
            ("dead".to_owned(), Some(550)),
            ("requeued".to_owned(), None),
        ]
    );
    assert_eq!(message["events"][2]["actor"], "api:alice");
}

#[tokio::test]
async fn the_admin_page_finds_a_recipients_messages_behind_the_token() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (mut app, addr) = admin_app(&db, Some(&smtp.url()), &[]).await;
    let id = db.verification_to("dana@example.com").await;
    one_step(&mut app).await;
    let page = |path: String, token: bool| {
        let addr = addr.clone();
        async move {
            let auth = basic("ops", TOKEN);
            let headers: Vec<(&str, &str)> = if token {
                vec![("Authorization", auth.as_str())]
            } else {
                Vec::new()
            };
            http_full(&addr, "GET", &path, &headers, "").await.unwrap()
        }
    };
    let admin = page("/admin".to_owned(), true).await;
    assert!(
        admin.body.contains("action=\"/admin/messages\""),
        "a search box"
    );
    let found = page(
        "/admin/messages?recipient=DANA%40example.com".to_owned(),
        true,
    )
    .await;
    assert_eq!(found.status, 200, "{}", found.body);
    assert!(
        found.body.contains(&format!("id=\"message-{id}\"")),
        "{}",
        found.body
    );
    assert!(found.body.contains("queued as"), "{}", found.body);
    let one = page(format!("/admin/messages/{id}"), true).await;
    assert!(one.body.contains("dana@example.com"), "{}", one.body);
    for path in [
        "/admin/messages?recipient=dana%40example.com".to_owned(),
        format!("/admin/messages/{id}"),
        "/api/v1/messages?recipient=dana%40example.com".to_owned(),
    ] {
        let refused = page(path.clone(), false).await;
        assert_eq!(refused.status, 401, "{path}");
        assert!(!refused.body.contains("dana"), "{path}: {}", refused.body);
    }
}

#[tokio::test]
async fn lookups_that_cannot_be_meant_are_refused_with_what_was_wrong() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    for (query, says) in [
        ("", "recipient or tag is required"),
        ("?recipient=", "recipient or tag is required"),
        ("?recipient=not-an-address", "not an email address"),
        ("?recipient=a@example.com&limit=0", "limit must be"),
        ("?recipient=a@example.com&limit=501", "limit must be"),
        ("?recipient=a@example.com&after=x", "after must be"),
        ("?recipient=a@example.com&kind=k", "unknown parameter"),
        ("?recipient=a%0d%0a@example.com", "control characters"),
    ] {
        let refused = api_get(&addr, &format!("/api/v1/messages{query}")).await;
        assert_eq!(refused.status, 400, "{query}: {}", refused.body);
        assert!(refused.body.contains(says), "{query}: {}", refused.body);
    }
    for (args, says) in [
        (
            &["--recipient", "not-an-address"][..],
            "not an email address",
        ),
        (&["--id", "0"], "not a message id"),
        (&[], "--recipient"),
    ] {
        let output = outboxd()
            .arg("messages")
            .args(args)
            .args(["--database-url", &db.url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Every shape of envelope a payload may have, and the addresses it names, in the lookup's
/// form: one recipient (the B-tree index), or several, or one with a `cc` or `bcc` (the GIN
/// index).
fn envelopes() -> Vec<(Value, Vec<&'static str>)> {
    let with = |fields: Value| {
        let mut payload = verification("unused@example.com");
        for (field, value) in fields.as_object().expect("fields") {
            payload[field] = value.clone();
        }
        payload
    };
    vec![
        (
            with(serde_json::json!({"to": "solo-a@example.com"})),
            vec!["solo-a@example.com"],
        ),
        (
            with(serde_json::json!({"to": "Eve Example <Solo-B@Example.COM>"})),
            vec!["solo-b@example.com"],
        ),
        // KELVIN SIGN stays as it is: only ASCII letters are lower-cased.
        (
            with(serde_json::json!({"to": "\u{212A}elvin-i@Example.com"})),
            vec!["\u{212A}elvin-i@example.com"],
        ),
        (
            with(serde_json::json!({"to": ["pair-c@example.com", "Dee <pair-d@example.com>"]})),
            vec!["pair-c@example.com", "pair-d@example.com"],
        ),
        (
            with(serde_json::json!({"to": "cc-e@example.com", "cc": ["cc-f@example.com"]})),
            vec!["cc-e@example.com", "cc-f@example.com"],
        ),
        (
            with(serde_json::json!({"to": "bcc-g@example.com", "bcc": "bcc-h@example.com"})),
            vec!["bcc-g@example.com", "bcc-h@example.com"],
        ),
    ]
}

#[tokio::test]
async fn every_envelope_is_found_by_each_of_its_addresses_once_sent_through_the_lookups_indexes() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (mut app, addr) = admin_app(&db, Some(&smtp.url()), &[]).await;
    let mut sent = Vec::new();
    for (payload, addresses) in envelopes() {
        sent.push((db.enqueue("account_verification", payload).await, addresses));
    }
    for (id, _) in &sent {
        while !db.row(*id).await.dispatched {
            one_step(&mut app).await;
        }
    }
    for (id, addresses) in &sent {
        for address in addresses {
            let found = api_get(&addr, &format!("/api/v1/messages?recipient={address}"))
                .await
                .ok_json();
            let ids: Vec<i64> = found["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .filter_map(|m| m["id"].as_i64())
                .collect();
            assert_eq!(ids, [*id], "{address}: {found}");
        }
    }
    let lookalike = api_get(&addr, "/api/v1/messages?recipient=kelvin-i@example.com")
        .await
        .ok_json();
    assert_eq!(lookalike["messages"], serde_json::json!([]), "{lookalike}");
    // On a table the size of a real one, the lookup reads the ended rows from its two
    // indexes: 20 000 more sent rows, one recipient each.
    db.exec("INSERT INTO outbox_messages (kind, payload, dispatched_at) \
         SELECT 'account_verification', jsonb_build_object('to', 'u' || g || '@example.com'), now() \
         FROM generate_series(1, 20000) AS g").await;
    db.exec("ANALYZE outbox_messages").await;
    let plan: (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) {}",
        db.store
            .statement_text("messages_by_recipient")
            .expect("the lookup")
    )))
    .bind(vec!["cc-f@example.com".to_owned()])
    .bind(None::<i64>)
    .bind(50_i64)
    .bind(outboxd::store::messages::PENDING_SCAN_ROWS)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let plan = plan.0.to_string();
    for index in [
        "outbox_messages_single_recipient_idx",
        "outbox_messages_many_recipients_idx",
    ] {
        assert!(plan.contains(index), "{index} not in {plan}");
    }
}
