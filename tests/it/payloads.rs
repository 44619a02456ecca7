//! What a payload carries: secret fields, masked wherever outboxd shows a message and
//! scrubbed when it ends; a dead letter whose secrets are gone is not retried; payload
//! retention per kind; a read-only admin token.

use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::{TOKEN, admin_app, api, basic, get_with};
use crate::helpers::{
    HttpResponse, Outboxd, SmtpServer, TestDb, eventually, http_full, outboxd, succeeds,
};

/// The reset link every test sends: it must never be shown once it is secret.
const LINK: &str = "https://app.example/reset/k7Q2-SECRET-9xW";
const READ_TOKEN: &str = "test-read-only-token-0123456789";

/// A templates directory with the kind `password_reset`, whose `reset_url` is secret, and
/// `invoice_notice`-like `receipt`, whose payload is kept an hour.
fn kinds() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    for (kind, toml, body) in [
        (
            "password_reset",
            "secret_fields = [\"reset_url\"]\n",
            "Reset: {{ reset_url }}",
        ),
        (
            "receipt",
            "payload_retention = \"1h\"\n",
            "Paid {{ amount }}",
        ),
    ] {
        let folder = dir.path().join(kind);
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("subject.txt"), "A message").unwrap();
        std::fs::write(folder.join("body.txt"), body).unwrap();
        std::fs::write(folder.join("kind.toml"), toml).unwrap();
    }
    dir
}

/// A replica with [`kinds`] and the admin token, sending to `smtp`; keep the directory.
async fn sending_with_kinds(
    db: &TestDb,
    smtp: &SmtpServer,
    env: &[(&str, &str)],
) -> (tempfile::TempDir, Outboxd) {
    let templates = kinds();
    let dir = templates.path().display().to_string();
    let flags = ["--templates", &dir, "--admin-token", TOKEN];
    let replica = Outboxd::sending_to(&db.url, &smtp.url(), &flags, env).await;
    (templates, replica)
}

fn reset(to: &str) -> Value {
    json!({"to": to, "reset_url": LINK, "name": "Ada"})
}

async fn read_only(addr: &str, method: &str, path: &str, body: Option<Value>) -> HttpResponse {
    let auth = format!("Bearer {READ_TOKEN}");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    http_full(addr, method, path, &headers, &body)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_secret_link_is_delivered_then_gone_from_the_table_the_api_the_page_the_cli_and_the_logs()
{
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_templates, replica) = sending_with_kinds(&db, &smtp, &[("RUST_LOG", "debug")]).await;
    let sent = db.enqueue("password_reset", reset("ada@example.com")).await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert!(
        received[0]
            .text
            .as_deref()
            .unwrap_or_default()
            .contains(LINK),
        "it was delivered"
    );
    eventually(Duration::from_secs(10), "the send recorded", || async {
        db.scalar::<bool, _>(
            "SELECT dispatched_at IS NOT NULL FROM outbox_messages WHERE id = $1",
            sent,
        )
        .await
    })
    .await;

    let stored: String = db
        .scalar(
            "SELECT payload::text FROM outbox_messages WHERE id = $1",
            sent,
        )
        .await;
    assert!(!stored.contains(LINK), "{stored}");
    assert!(
        stored.contains("\"reset_url\": \"[secret]\"") && stored.contains("Ada"),
        "{stored}"
    );
    let scrubbed: bool = db
        .scalar(
            "SELECT secrets_scrubbed_at IS NOT NULL FROM outbox_messages WHERE id = $1",
            sent,
        )
        .await;
    assert!(scrubbed);

    // A message still pending keeps its link in the table (it is yet to be sent), and no
    // reader is shown it.
    let pending = db
        .enqueue(
            "password_reset",
            json!({"to": "bo@example.com", "reset_url": LINK}),
        )
        .await;
    db.exec(format!("UPDATE outbox_messages SET next_attempt_at = now() + interval '1 hour' WHERE id = {pending}"))
        .await;
    let admin = replica.http.as_str();
    for id in [sent, pending] {
        let shown = api(admin, "GET", &format!("/api/v1/messages/{id}"), None).await;
        assert_eq!(shown.status, 200, "{}", shown.body);
        assert!(
            !shown.body.contains(LINK) && shown.body.contains("[secret]"),
            "{}",
            shown.body
        );
        let page = get_with(
            admin,
            &format!("/admin/messages/{id}"),
            &basic("ops", TOKEN),
        )
        .await;
        assert_eq!(page.status, 200);
        assert!(
            !page.body.contains(LINK) && page.body.contains("[secret]"),
            "{}",
            page.body
        );
        let cli = succeeds(
            outboxd().args([
                "messages",
                "--database-url",
                &db.url,
                "--json",
                "--id",
                &id.to_string(),
            ]),
            "outboxd messages",
        );
        assert!(!cli.contains(LINK) && cli.contains("[secret]"), "{cli}");
    }
    // The timeline keeps everything else: the send, and by whom.
    let shown: Value = serde_json::from_str(
        &api(admin, "GET", &format!("/api/v1/messages/{sent}"), None)
            .await
            .body,
    )
    .unwrap();
    assert_eq!(shown["state"], "dispatched");
    assert_eq!(shown["secret_fields"], json!(["reset_url"]));
    assert!(
        shown["smtp_reply"]
            .as_str()
            .is_some_and(|r| r.starts_with("250")),
        "{shown}"
    );
    let logs = replica.stderr_so_far();
    assert!(
        logs.contains("sent") && !logs.contains(LINK),
        "the logs and spans hold the link"
    );
}

#[tokio::test]
async fn a_producer_marks_a_field_secret_for_one_message_and_a_cancel_scrubs_it_too() {
    let db = TestDb::new().await;
    let message = outboxd::NewMessage::new(
        "account_verification",
        json!({"to": "cy@example.com", "name": "Cy", "verify_url": LINK}),
    )
    .unwrap()
    .with_secret_fields(["verify_url"])
    .unwrap()
    .with_idempotency_key("verify:cy")
    .unwrap()
    .with_not_before(chrono::Utc::now() + chrono::Duration::hours(1))
    .unwrap();
    let id = db.store.enqueue(&db.pool, message).await.unwrap();
    let answer: String = db.scalar("SELECT outbox_cancel($1)", "verify:cy").await;
    assert_eq!(answer, "cancelled");
    let stored: String = db
        .scalar(
            "SELECT payload::text FROM outbox_messages WHERE id = $1",
            id,
        )
        .await;
    assert!(
        !stored.contains(LINK) && stored.contains("[secret]"),
        "{stored}"
    );

    // What the table refuses, the producer refuses before it: each with its reason.
    let refused = outboxd::NewMessage::new("account_verification", json!({}))
        .unwrap()
        .with_secret_fields(["a..b"]);
    assert!(refused.unwrap_err().to_string().contains("secret field"));
    let written = sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, secret_fields) VALUES ('x', '{}', ARRAY['a b'])",
    )
    .execute(&db.pool)
    .await;
    assert!(
        written
            .unwrap_err()
            .to_string()
            .contains("outbox_messages_secret_fields_check")
    );
}

#[tokio::test]
async fn a_dead_letter_whose_secrets_were_scrubbed_is_not_retried_and_says_why() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_templates, replica) = sending_with_kinds(&db, &smtp, &[]).await;
    let dead = db
        .enqueue("password_reset", reset("reject-me@example.com"))
        .await;
    eventually(Duration::from_secs(20), "the dead letter", || async {
        db.scalar::<bool, _>(
            "SELECT dead_lettered_at IS NOT NULL FROM outbox_messages WHERE id = $1",
            dead,
        )
        .await
    })
    .await;
    let retried = api(
        &replica.http,
        "POST",
        &format!("/api/v1/dead-letters/{dead}/retry"),
        None,
    )
    .await;
    assert_eq!(retried.status, 409, "{}", retried.body);
    assert!(
        retried.body.contains("payload_gone") && retried.body.contains("enqueue it anew"),
        "{}",
        retried.body
    );
    let cli = outboxd()
        .args([
            "dead-letters",
            "retry",
            "--database-url",
            &db.url,
            &dead.to_string(),
        ])
        .output()
        .unwrap();
    assert!(!cli.status.success());
    let said = String::from_utf8_lossy(&cli.stderr);
    assert!(said.contains("secret fields were scrubbed"), "{said}");
    let still_dead: bool = db
        .scalar(
            "SELECT dead_lettered_at IS NOT NULL FROM outbox_messages WHERE id = $1",
            dead,
        )
        .await;
    assert!(still_dead, "nothing changed");
}

#[tokio::test]
async fn a_kinds_payload_retention_removes_payloads_on_time_and_keeps_the_rows() {
    let db = TestDb::new().await;
    let templates = kinds();
    let dir = templates.path().display().to_string();
    // Built, not run: its start writes the kinds' policies; the passes below are the test's.
    let _app = crate::helpers::app(&db, None, &["--templates", &dir]).await;
    // Sent two hours ago and ten minutes ago; a receipt kept an hour; another kind's.
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, next_attempt_at, dispatched_at) VALUES \
         ('receipt', '{\"to\": \"old@example.com\", \"amount\": \"12.50\"}', now(), now() - interval '2 hours'), \
         ('receipt', '{\"to\": \"new@example.com\", \"amount\": \"8.00\"}', now(), now() - interval '10 minutes'), \
         ('password_reset', '{\"to\": \"pw@example.com\", \"reset_url\": \"x\"}', now(), now() - interval '2 hours'), \
         ('receipt', '{\"to\": \"gone@example.com\", \"amount\": \"1.00\"}', now(), NULL)",
    )
    .await;
    db.exec("UPDATE outbox_messages SET dead_lettered_at = now() - interval '2 hours', discarded_at = now() - interval '2 hours', end_reason = 'expired' WHERE payload->>'to' = 'gone@example.com'").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let removed = outboxd::background::retention::remove_payloads_once(&db.store, &stop)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "SELECT payload::text, payload_removed_at IS NOT NULL FROM outbox_messages ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (r#"{"to": "old@example.com"}"#.to_owned(), true),
            (
                r#"{"to": "new@example.com", "amount": "8.00"}"#.to_owned(),
                false
            ),
            (
                r#"{"to": "pw@example.com", "reset_url": "x"}"#.to_owned(),
                false
            ),
            (r#"{"to": "gone@example.com"}"#.to_owned(), true),
        ]
    );
    // The next pass starts where this one ended: nothing more to remove, nothing re-read.
    let again = outboxd::background::retention::remove_payloads_once(&db.store, &stop).await;
    assert_eq!(again.unwrap(), 0);
    let swept: bool = db
        .scalar(
            "SELECT payload_swept_until IS NOT NULL FROM outbox_kind_policies WHERE kind = $1",
            "receipt",
        )
        .await;
    assert!(swept);
}

#[tokio::test]
async fn a_read_only_token_reads_timelines_without_payloads_and_is_refused_every_change() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &["--admin-read-token", READ_TOKEN]).await;
    let sent = db
        .enqueue(
            "account_verification",
            json!({"to": "ro@example.com", "name": "Ro", "verify_url": LINK}),
        )
        .await;
    db.exec(format!(
        "UPDATE outbox_messages SET dispatched_at = now() WHERE id = {sent}"
    ))
    .await;
    let pending = db
        .enqueue(
            "account_verification",
            json!({"to": "ro@example.com", "name": "Ro", "verify_url": "p"}),
        )
        .await;

    let one = read_only(&addr, "GET", &format!("/api/v1/messages/{sent}"), None).await;
    assert_eq!(one.status, 200, "{}", one.body);
    let one: Value = serde_json::from_str(&one.body).unwrap();
    assert_eq!(
        one["payload"],
        Value::Null,
        "no payload of an ended message"
    );
    assert!(one["events"].is_array());
    let found = read_only(
        &addr,
        "GET",
        "/api/v1/messages?recipient=ro@example.com",
        None,
    )
    .await;
    assert_eq!(found.status, 200);
    assert!(
        !found.body.contains(LINK) && found.body.contains("\"verify_url\":\"p\""),
        "{}",
        found.body
    );
    for path in [
        "/api/v1/stats",
        "/api/v1/dead-letters",
        "/api/v1/suppressions",
        "/api/v1/pauses",
    ] {
        assert_eq!(
            read_only(&addr, "GET", path, None).await.status,
            200,
            "{path}"
        );
    }
    let counted = read_only(
        &addr,
        "POST",
        "/api/v1/pending/count",
        Some(json!({"kind": "account_verification"})),
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.body);

    for (method, path, body) in [
        ("POST", format!("/api/v1/dead-letters/{sent}/retry"), None),
        ("POST", format!("/api/v1/dead-letters/{sent}/discard"), None),
        (
            "POST",
            "/api/v1/kinds/account_verification/pause".to_owned(),
            Some(json!({"reason": "x"})),
        ),
        (
            "POST",
            "/api/v1/suppressions".to_owned(),
            Some(json!({"address": "x@example.com", "reason": "manual"})),
        ),
        (
            "POST",
            "/api/v1/messages/cancel".to_owned(),
            Some(json!({"id": pending})),
        ),
        (
            "POST",
            "/api/v1/erase".to_owned(),
            Some(json!({"recipient": "ro@example.com"})),
        ),
    ] {
        let refused = read_only(&addr, method, &path, body).await;
        assert_eq!(refused.status, 403, "{path}: {}", refused.body);
        assert!(refused.body.contains("read_only"), "{}", refused.body);
    }
    // The page shows what the token may do: no button, and its forms are refused.
    let page = get_with(&addr, "/admin", &basic("oncall", READ_TOKEN)).await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("(read-only)") && !page.body.contains("action=\"/admin/suppressions\""),
        "{}",
        page.body
    );
    let message_page = get_with(
        &addr,
        &format!("/admin/messages/{pending}"),
        &basic("oncall", READ_TOKEN),
    )
    .await;
    assert!(!message_page.body.contains("Cancel this message"));
    let posted = http_full(
        &addr,
        "POST",
        &format!("/admin/messages/{pending}/cancel"),
        &[
            ("Authorization", &basic("oncall", READ_TOKEN)),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "csrf=x",
    )
    .await
    .unwrap();
    assert_eq!(posted.status, 403);
    let untouched: bool = db
        .scalar(
            "SELECT dead_lettered_at IS NULL FROM outbox_messages WHERE id = $1",
            pending,
        )
        .await;
    assert!(untouched, "nothing changed");

    // Every change, and every lookup, names the token that made it.
    assert_eq!(
        api(
            &addr,
            "POST",
            "/api/v1/messages/cancel",
            Some(json!({"id": pending}))
        )
        .await
        .status,
        200
    );
    let tokens: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT action, token FROM outbox_admin_audit ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let of = |action: &str| {
        tokens
            .iter()
            .find(|(a, _)| a == action)
            .and_then(|(_, t)| t.clone())
            .unwrap_or_default()
    };
    assert!(of("lookup").starts_with("read-only#"), "{tokens:?}");
    assert!(of("cancel").starts_with("admin#"), "{tokens:?}");
    assert!(!tokens.iter().any(|(_, t)| {
        t.as_deref()
            .is_some_and(|t| t.contains(TOKEN) || t.contains(READ_TOKEN))
    }));
}

#[tokio::test]
async fn a_token_file_is_read_again_when_it_changes() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin-token");
    let (old, new) = (
        "first-admin-token-0123456789",
        "second-admin-token-0123456789",
    );
    std::fs::write(&file, format!("{old}\n")).unwrap();
    let path = file.display().to_string();
    let (_app, addr) = admin_app_with_file(&db, &path).await;
    let with = |token: &'static str| {
        let addr = addr.clone();
        async move {
            get_with(&addr, "/api/v1/stats", &format!("Bearer {token}"))
                .await
                .status
        }
    };
    assert_eq!(with(old).await, 200);
    assert_eq!(with(new).await, 401);
    // Both during the roll-out, then the new one alone, as a Secret's update writes them.
    std::fs::write(&file, format!("{old}\n{new}\n")).unwrap();
    eventually(
        Duration::from_secs(10),
        "the new token accepted",
        || async { with(new).await == 200 },
    )
    .await;
    assert_eq!(with(old).await, 200);
    std::fs::write(&file, format!("{new}\n")).unwrap();
    eventually(Duration::from_secs(10), "the old token refused", || async {
        with(old).await == 401
    })
    .await;
    assert_eq!(with(new).await, 200);
}

async fn admin_app_with_file(db: &TestDb, path: &str) -> (outboxd::app::App, String) {
    let mut app = crate::helpers::app(db, None, &["--admin-token-file", path]).await;
    let addr = app.admin_addr().expect("admin on").to_string();
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    (app, addr)
}
