//! Tags: a producer labels a message, in SQL or with the producer crate; operators find
//! messages and dead letters by them in the API, the CLI and the admin page; the table
//! refuses what the crate refuses; and no tag becomes a metric label.

use serde_json::json;

use outboxd_producer::NewMessage;

use crate::admin::{TOKEN, admin_app, api_get, basic, get_with};
use crate::helpers::{TestDb, http_get, outboxd, succeeds, verification};

/// Enqueues with the producer crate: its id.
async fn tagged(db: &TestDb, to: &str, tags: &[&str]) -> i64 {
    let message = NewMessage::new("account_verification", verification(to))
        .and_then(|m| m.with_tags(tags.iter().copied()))
        .expect("a valid message");
    outboxd_producer::enqueue(&db.pool, message)
        .await
        .expect("enqueued")
}

/// The ids a JSON list of messages holds.
fn ids(list: &serde_json::Value) -> Vec<i64> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|m| m["id"].as_i64().expect("an id"))
        .collect()
}

#[tokio::test]
async fn messages_and_dead_letters_are_found_by_tag_in_the_api_the_cli_and_the_page() {
    let db = TestDb::new().await;
    let spring = tagged(&db, "ada@example.com", &["campaign:spring", "tenant-42"]).await;
    let autumn = tagged(&db, "bo@example.com", &["campaign:autumn"]).await;
    // An application that writes SQL sets them too.
    let from_sql: i64 = db
        .scalar(
            "INSERT INTO outbox_messages (kind, payload, tags) \
             VALUES ('account_verification', $1, ARRAY['campaign:spring']) RETURNING id",
            verification("cy@example.com"),
        )
        .await;
    let dead: i64 = db
        .scalar(
            "INSERT INTO outbox_messages (kind, payload, tags, attempts, last_error, dead_lettered_at) \
             VALUES ('account_verification', $1, ARRAY['campaign:spring'], 5, 'gave up', now()) \
             RETURNING id",
            verification("di@example.com"),
        )
        .await;
    let (_app, addr) = admin_app(&db, None, &[]).await;

    // The API: newest first, each message with its tags.
    let found = api_get(&addr, "/api/v1/messages?tag=campaign:spring")
        .await
        .ok_json();
    assert_eq!(ids(&found["messages"]), vec![dead, from_sql, spring]);
    assert_eq!(
        found["messages"][2]["tags"],
        json!(["campaign:spring", "tenant-42"])
    );
    assert_eq!(found["pending_searched_all"], true);
    let found = api_get(&addr, "/api/v1/messages?tag=campaign:autumn")
        .await
        .ok_json();
    assert_eq!(ids(&found["messages"]), vec![autumn]);
    let dead_letters = api_get(&addr, "/api/v1/dead-letters?tag=campaign:spring")
        .await
        .ok_json();
    assert_eq!(ids(&dead_letters["dead_letters"]), vec![dead]);
    let none = api_get(&addr, "/api/v1/dead-letters?tag=campaign:autumn")
        .await
        .ok_json();
    assert_eq!(ids(&none["dead_letters"]), Vec::<i64>::new());

    // The CLI.
    let listed = succeeds(
        outboxd().args([
            "messages",
            "--database-url",
            &db.url,
            "--tag",
            "tenant-42",
            "--json",
        ]),
        "outboxd messages --tag",
    );
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    assert_eq!(ids(&listed), vec![spring]);
    let text = succeeds(
        outboxd().args(["messages", "--database-url", &db.url, "--tag", "tenant-42"]),
        "outboxd messages --tag",
    );
    assert!(
        text.contains("[tags: campaign:spring, tenant-42]"),
        "{text}"
    );
    let dead_listed = succeeds(
        outboxd().args([
            "dead-letters",
            "list",
            "--database-url",
            &db.url,
            "--tag",
            "campaign:spring",
            "--json",
        ]),
        "outboxd dead-letters list --tag",
    );
    let dead_listed: serde_json::Value = serde_json::from_str(&dead_listed).expect("JSON");
    assert_eq!(ids(&dead_listed), vec![dead]);

    // The admin page.
    let auth = basic("ops", TOKEN);
    let page = get_with(&addr, "/admin/messages?tag=campaign%3Aautumn", &auth).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&format!("id=\"message-{autumn}\"")),
        "{}",
        page.body
    );
    assert!(!page.body.contains(&format!("id=\"message-{spring}\"")));
    let page = get_with(&addr, "/admin?tag=campaign%3Aspring", &auth).await;
    assert!(
        page.body.contains(&format!("id=\"dead-letter-{dead}\"")),
        "{}",
        page.body
    );
    assert!(page.body.contains("campaign:spring"));

    // Never a metric label.
    let metrics = http_get(&addr, "/metrics").await.1;
    assert!(!metrics.contains("campaign"), "a tag reached /metrics");
}

#[tokio::test]
async fn each_kind_of_bad_tag_is_refused_by_the_table_the_api_and_the_cli() {
    let db = TestDb::new().await;
    for (tags, why) in [
        ("ARRAY['campaign spring']", "a space"),
        ("ARRAY['a,b']", "the separator"),
        ("ARRAY[['a', 'b'], ['c', 'd']]", "two dimensions"),
        ("ARRAY['']", "an empty tag"),
        ("ARRAY[repeat('x', 65)]", "65 characters"),
        ("ARRAY[]::text[]", "an empty list"),
        ("ARRAY['a', NULL]", "a NULL tag"),
        (
            "(SELECT array_agg('t' || i) FROM generate_series(1, 11) AS i)",
            "11 tags",
        ),
        ("ARRAY['été']", "a letter outside ASCII"),
    ] {
        let sql = format!(
            "INSERT INTO outbox_messages (kind, payload, tags) \
             VALUES ('account_verification', '{{\"to\": \"a@example.com\"}}', {tags})"
        );
        let refused = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&db.pool)
            .await;
        let refused = refused.expect_err(why).to_string();
        assert!(
            refused.contains("outbox_messages_tags_check"),
            "{why}: {refused}"
        );
    }
    assert_eq!(db.count("all").await, 0, "nothing was written");

    let (_app, addr) = admin_app(&db, None, &[]).await;
    for path in [
        "/api/v1/messages?tag=a%20b",
        "/api/v1/dead-letters?tag=a%20b",
    ] {
        let refused = api_get(&addr, path).await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.body);
        assert!(
            refused.body.contains("a tag must be 1 to 64 characters"),
            "{}",
            refused.body
        );
    }
    let both = api_get(&addr, "/api/v1/messages?tag=a&recipient=a@example.com").await;
    assert_eq!(both.status, 400);
    let output = outboxd()
        .args(["messages", "--database-url", &db.url, "--tag", "a b"])
        .output()
        .expect("outboxd messages");
    assert_eq!(output.status.code(), Some(2), "a malformed command line");
    assert!(String::from_utf8_lossy(&output.stderr).contains("a tag must be"));
}

#[tokio::test]
async fn retention_deletes_a_messages_tags_with_it() {
    use outboxd::store::prune::{Prunable, prune};
    let db = TestDb::new().await;
    let old = tagged(&db, "ada@example.com", &["campaign:spring"]).await;
    let kept = tagged(&db, "bo@example.com", &["campaign:spring"]).await;
    db.exec(format!(
        "UPDATE outbox_messages SET dispatched_at = now() - interval '30 days' WHERE id = {old}"
    ))
    .await;
    let cutoff = chrono::Utc::now() - chrono::Duration::days(7);
    let pruned = prune(&db.store, Prunable::Dispatched, cutoff, 100)
        .await
        .expect("pruned");
    assert_eq!(pruned, 1);
    let left: Vec<i64> = sqlx::query_scalar("SELECT message_id FROM outbox_message_tags")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, vec![kept]);
}
