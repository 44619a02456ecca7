//! Answers that say why: a retry of a dead letter whose recipient is suppressed says it
//! will not be sent and names the command that lifts the suppression, through the CLI,
//! the API and the admin page; an email only logged (no SMTP server) is never shown as
//! sent.

use crate::admin::{TOKEN, admin_app, api_post, basic, csrf_in, dead_letter};
use crate::helpers::{
    TestDb, app, http_full, one_step, outboxd, outboxd_as, succeeds, verification,
};

async fn suppress(db: &TestDb, address: &str) {
    sqlx::query(
        "INSERT INTO outbox_suppressions (address, reason, source) \
         VALUES ($1, 'hard_bounce', 'smtp')",
    )
    .bind(address)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn retrying_a_dead_letter_whose_recipient_is_suppressed_warns_and_names_the_remedy() {
    let db = TestDb::new().await;
    suppress(&db, "gone@example.com").await;
    let remedy = "outboxd suppressions remove gone@example.com";

    // The command line: the retry is done, and standard error says what will happen.
    let first = dead_letter(&db, "invoice_notice", "smtp_550", "gone@example.com").await;
    let output = outboxd()
        .args([
            "dead-letters",
            "retry",
            &first.to_string(),
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    let warned = String::from_utf8_lossy(&output.stderr);
    assert!(
        warned.contains(&format!(
            "warning: message {first} goes to gone@example.com, who is suppressed (hard_bounce)"
        )) && warned.contains(remedy),
        "{warned}"
    );

    // The API: in the answer's warnings.
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let second = dead_letter(&db, "invoice_notice", "smtp_550", "Gone@Example.com").await;
    let answered = api_post(&addr, &format!("/api/v1/dead-letters/{second}/retry")).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    let warnings = answered.json()["warnings"].clone();
    assert!(warnings[0].as_str().unwrap().contains(remedy), "{warnings}");
    // A retry of a recipient not suppressed warns of nothing.
    let fine = dead_letter(&db, "invoice_notice", "smtp_550", "here@example.com").await;
    let answered = api_post(&addr, &format!("/api/v1/dead-letters/{fine}/retry")).await;
    assert_eq!(answered.json()["warnings"], serde_json::json!([]));

    // The admin page: in the notice after the retry.
    let third = dead_letter(&db, "invoice_notice", "smtp_550", "gone@example.com").await;
    let auth = basic("ops", TOKEN);
    let page = http_full(
        &addr,
        "GET",
        "/admin",
        &[("Authorization", auth.as_str())],
        "",
    )
    .await
    .unwrap();
    let form = format!("csrf={}&kind=", csrf_in(&page.body));
    let posted = http_full(
        &addr,
        "POST",
        &format!("/admin/dead-letters/{third}/retry"),
        &[
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &format!("http://{addr}")),
        ],
        &form,
    )
    .await
    .unwrap();
    let location = posted
        .header("location")
        .unwrap_or_else(|| panic!("{}: {}", posted.status, posted.body));
    let shown = http_full(
        &addr,
        "GET",
        location,
        &[("Authorization", auth.as_str())],
        "",
    )
    .await
    .unwrap();
    // Without the address: the notice travels in the redirect's URL.
    assert!(!location.contains("gone"), "{location}");
    assert!(
        shown
            .body
            .contains(&format!("a recipient of message {third} is suppressed")),
        "{}",
        shown.body
    );
    assert!(
        shown.body.contains("outboxd suppressions"),
        "{}",
        shown.body
    );
}

#[tokio::test]
async fn an_email_only_logged_is_never_counted_or_shown_as_sent() {
    let db = TestDb::new().await;
    let id = db.verification_to("ada@example.com").await;
    let mut app = app(&db, None, &[]).await;
    one_step(&mut app).await;
    let row = db.row(id).await;
    assert!(!row.dispatched, "{row:?}");

    let stats = outboxd()
        .args(["stats", "--json", "--database-url", &db.url])
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(
        (&stats["sent_last_hour"], &stats["logged_only_last_hour"]),
        (&serde_json::json!(0), &serde_json::json!(1)),
        "{stats}"
    );
    let table = outboxd()
        .args(["stats", "--database-url", &db.url])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("LOGGED ONLY LAST HOUR"));

    let message = outboxd::store::messages::message(&db.store, id)
        .await
        .unwrap()
        .expect("the message");
    assert_eq!(message.state.as_str(), "logged_only");
    let events: Vec<&str> = message.events.iter().map(|e| e.event.as_str()).collect();
    assert!(
        events.contains(&"logged_only") && !events.contains(&"sent"),
        "{events:?}"
    );
}

#[tokio::test]
async fn stats_and_messages_say_why_pending_mail_waits() {
    let db = TestDb::new().await;
    let run = |args: &[&str]| succeeds(&mut outboxd_as("ann", &db.url, args), "outboxd");
    run(&[
        "pause",
        "--kind",
        "workspace_invite",
        "--reason",
        "template fix",
    ]);
    let held = db
        .enqueue(
            "workspace_invite",
            serde_json::json!({"to": "w@example.com"}),
        )
        .await;
    let later: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, not_before) \
         VALUES ('account_verification', $1, now() + interval '1 hour') RETURNING id",
    )
    .bind(verification("later@example.com"))
    .fetch_one(&db.pool)
    .await
    .unwrap();

    let stats = run(&["stats"]);
    assert!(
        stats.contains("paused: workspace_invite since ")
            && stats.contains(" by cli:ann: template fix"),
        "{stats}"
    );
    let message = run(&["messages", "--id", &held.to_string()]);
    assert!(
        message.contains("waiting: kind workspace_invite paused since ")
            && message.contains("(outboxd resume --kind workspace_invite)"),
        "{message}"
    );
    let message = run(&["messages", "--id", &later.to_string()]);
    assert!(message.contains("waiting: next attempt at "), "{message}");
    assert!(
        message.contains("(in 59m") || message.contains("(in 1h"),
        "{message}"
    );
}

#[tokio::test]
async fn stats_and_messages_say_when_an_open_circuit_holds_mail() {
    let db = TestDb::new().await;
    // A relay that refuses every connection: the replica's circuit opens.
    let nowhere = format!("smtp://127.0.0.1:{}", crate::helpers::free_port());
    let flags = ["--worker-id", "replica-a"];
    let _replica =
        crate::helpers::Outboxd::sending_to(&db.url, nowhere.as_str(), &flags, &[]).await;
    let id = db.verification_to("ada@example.com").await;
    let stats = crate::helpers::poll_until(
        std::time::Duration::from_secs(30),
        "the open circuit in stats",
        || async {
            let output = outboxd()
                .args(["stats", "--database-url", &db.url])
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&output.stdout).into_owned();
            said.contains("circuit open: replica-a since ")
                .then_some(said)
        },
    )
    .await;
    assert!(stats.contains("it claims nothing until it does"), "{stats}");
    let output = outboxd()
        .args([
            "messages",
            "--id",
            &id.to_string(),
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("waiting: the SMTP circuit of replica-a is open since "),
        "{said}"
    );
}
