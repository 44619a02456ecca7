//! Suppression scopes: a complaint about a bulk message stops that lane's mail to the
//! address and not its account verification; a hard bounce stops every kind; an essential
//! kind still reaches an address that unsubscribed. Against the binary, with reports
//! signed as the Standard Webhooks package signs them.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{Outboxd, SmtpServer, TestDb, outboxd_as, succeeds, verification};
use crate::webhooks::post_standard;

const SECRET: [u8; 32] = [7; 32];

fn whsec() -> String {
    use base64::Engine as _;
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SECRET)
    )
}

/// Posts a report signed with the test's secret; its status.
async fn report(addr: &str, id: &str, body: serde_json::Value) -> u16 {
    post_standard(addr, &SECRET, id, &body.to_string())
        .await
        .status
}

fn invoice(to: &str) -> serde_json::Value {
    json!({"to": to, "customer_name": "Ada", "invoice_number": "INV-1", "amount": "1.00",
           "currency": "EUR", "due_date": "2027-01-01",
           "invoice_url": "https://app.example/invoices/1"})
}

#[tokio::test]
async fn a_complaint_about_bulk_mail_stops_that_lane_only_and_a_hard_bounce_stops_every_kind() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let secret = whsec();
    let flags = [
        "--webhook-secret",
        secret.as_str(),
        "--bulk-kinds",
        "invoice_notice",
    ];
    let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
    let addr = outboxd.http.clone();

    // Ada complains about an invoice notice, a bulk kind here.
    db.enqueue("invoice_notice", invoice("ada@example.com"))
        .await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    let complaint = json!({"type": "email.complained",
        "data": {"email": "ada@example.com", "message_id": received[0].message_id}});
    assert_eq!(report(&addr, "msg_complaint", complaint).await, 200);
    let scope: (String, String) = db
        .one_row(
            "SELECT lane, reason FROM outbox_lane_suppressions WHERE address = $1",
            "ada@example.com",
        )
        .await;
    assert_eq!(scope, ("bulk".to_owned(), "complaint".to_owned()));

    // Her next invoice notice is not sent; her account verification is.
    let invoice_id = db
        .enqueue("invoice_notice", invoice("ada@example.com"))
        .await;
    let verification_id = db.verification_to("ada@example.com").await;
    let (end, error) = db.ended(invoice_id).await;
    assert_eq!(end.as_deref(), Some("suppressed"));
    assert!(
        error.unwrap_or_default().contains("(bulk complaint)"),
        "the reason says the scope"
    );
    assert_eq!(db.ended(verification_id).await.0, None, "sent");
    assert!(db.row(verification_id).await.dispatched);

    // Bo's mailbox is gone (a hard bounce): neither kind reaches him, essential or not.
    let bounce = json!({"type": "email.bounced",
        "data": {"email": "bo@example.com", "bounce_type": "hard"}});
    assert_eq!(report(&addr, "msg_bounce", bounce).await, 200);
    let invoice_id = db
        .enqueue("invoice_notice", invoice("bo@example.com"))
        .await;
    let verification_id = db.verification_to("bo@example.com").await;
    for id in [invoice_id, verification_id] {
        let (end, error) = db.ended(id).await;
        assert_eq!(end.as_deref(), Some("suppressed"), "{error:?}");
        assert!(error.unwrap_or_default().contains("(hard_bounce)"));
    }
    // A later complaint about his invoice adds nothing: he is suppressed for every kind.
    let complaint = json!({"type": "email.complained",
        "data": {"email": "bo@example.com", "outbox_id": invoice_id}});
    assert_eq!(report(&addr, "msg_after_bounce", complaint).await, 200);
    let lane_entries: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_lane_suppressions WHERE address = $1",
            "bo@example.com",
        )
        .await;
    assert_eq!(lane_entries, 0);
    let metrics = crate::helpers::http_get(&addr, "/metrics").await.1;
    for series in [
        r#"outbox_messages_suppressed_total{kind="invoice_notice",reason="complaint",scope="bulk"} 1"#,
        r#"outbox_messages_suppressed_total{kind="account_verification",reason="hard_bounce",scope="all"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series}");
    }
}

#[tokio::test]
async fn an_essential_kind_reaches_an_address_that_unsubscribed_from_everything() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    // A password reset, marked essential: its owner asked for it just now.
    let templates = tempfile::tempdir().unwrap();
    let reset = templates.path().join("password_reset");
    std::fs::create_dir(&reset).unwrap();
    std::fs::write(reset.join("subject.txt"), "Reset your password").unwrap();
    std::fs::write(reset.join("body.txt"), "{{ reset_url }}").unwrap();
    std::fs::write(reset.join("kind.toml"), "essential = true\n").unwrap();
    let dir = templates.path().display().to_string();
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &["--templates", &dir], &[]).await;
    let added = succeeds(
        &mut outboxd_as(
            "ops",
            &db.url,
            &[
                "suppressions",
                "add",
                "cy@example.com",
                "--reason",
                "unsubscribe",
            ],
        ),
        "outboxd suppressions add",
    );
    assert!(added.contains("(unsubscribe)"), "{added}");
    let verification_id = db
        .enqueue("account_verification", verification("cy@example.com"))
        .await;
    let reset_id = db
        .enqueue(
            "password_reset",
            json!({"to": "cy@example.com", "reset_url": "https://app.example/r"}),
        )
        .await;
    assert_eq!(
        db.ended(verification_id).await.0.as_deref(),
        Some("suppressed")
    );
    assert_eq!(db.ended(reset_id).await.0, None);
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received[0].rcpt_tos, ["cy@example.com"]);
    assert_eq!(received[0].outbox_id, reset_id.to_string());
    // A hard bounce stops it too.
    succeeds(
        &mut outboxd_as(
            "ops",
            &db.url,
            &[
                "suppressions",
                "add",
                "di@example.com",
                "--reason",
                "hard_bounce",
            ],
        ),
        "outboxd suppressions add",
    );
    let bounced = db
        .enqueue(
            "password_reset",
            json!({"to": "di@example.com", "reset_url": "https://app.example/r"}),
        )
        .await;
    assert_eq!(db.ended(bounced).await.0.as_deref(), Some("suppressed"));
}

#[tokio::test]
async fn an_operator_scopes_an_entry_and_lifts_one_lane_of_it() {
    let db = TestDb::new().await;
    let run = |args: &[&str]| succeeds(&mut outboxd_as("ops", &db.url, args), "outboxd");
    let added = run(&["suppressions", "add", "dee@example.com", "--scope", "bulk"]);
    assert!(added.contains("(manual, bulk only)"), "{added}");
    run(&[
        "suppressions",
        "add",
        "dee@example.com",
        "--reason",
        "complaint",
        "--scope",
        "transactional",
    ]);
    run(&["suppressions", "add", "zoe@example.com"]);
    let listed = run(&["suppressions", "list"]);
    assert!(listed.contains("SCOPE"), "{listed}");
    assert_eq!(listed.matches("dee@example.com").count(), 2, "{listed}");
    // A page of one address holds all its entries, never half of them.
    let first = run(&["suppressions", "list", "--limit", "1"]);
    assert_eq!(first.matches("dee@example.com").count(), 2, "{first}");
    assert!(!first.contains("zoe@example.com"), "{first}");
    run(&[
        "suppressions",
        "remove",
        "dee@example.com",
        "--scope",
        "bulk",
    ]);
    let listed = run(&["suppressions", "list", "--json"]);
    let entries: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let scopes: Vec<&str> = entries
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["address"] == "dee@example.com")
        .map(|e| e["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["transactional"]);
    // A hard bounce is every kind's: an operator cannot scope one to a lane.
    let (ok, _, err) = crate::helpers::said(
        &mut outboxd_as(
            "ops",
            &db.url,
            &[
                "suppressions",
                "add",
                "e@example.com",
                "--reason",
                "hard_bounce",
                "--scope",
                "bulk",
            ],
        ),
        "outboxd suppressions add",
    );
    assert!(!ok && err.contains("its scope is all"), "{err}");
    let (ok, _, err) = crate::helpers::said(
        &mut outboxd_as(
            "ops",
            &db.url,
            &["suppressions", "add", "e@example.com", "--scope", "news"],
        ),
        "outboxd suppressions add",
    );
    assert!(!ok && err.contains("unknown scope"), "{err}");
}
