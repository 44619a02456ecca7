//! The suppression list: suppressed recipients are never mailed, a reply saying the
//! mailbox does not exist suppresses its recipient, and operators manage the list through
//! the API, the page and the CLI, each change audited.

use std::time::Duration;

use serde_json::json;

use outboxd::store::{self, ClaimRequest, suppressions};
use outboxd::suppression::{FeedbackSource, NewSuppression, SuppressionReason};

use crate::admin::{admin_app, api, api_get, basic, csrf_in};
use crate::helpers::said;
use crate::helpers::{
    Scenario, SmtpServer, TestDb, app, http_full, metric_value, one_step, outboxd, verification,
};

/// Puts `address` on the list, as an operator would.
async fn suppress(db: &TestDb, address: &str, reason: SuppressionReason) {
    suppressions::add(
        &db.store,
        &entry(address, reason),
        &outboxd::store::admin::Operator::named("test"),
    )
    .await
    .unwrap();
}

fn entry(address: &str, reason: SuppressionReason) -> NewSuppression {
    NewSuppression {
        address: outboxd::suppression::Address::parse(address).unwrap(),
        reason,
        scope: outboxd::suppression::Scope::All,
        source: FeedbackSource::Operator,
        detail: None,
        message_id: None,
        until: None,
    }
}

async fn state_of(db: &TestDb, id: i64) -> (Option<String>, Option<String>) {
    db.one_row(
        "SELECT end_reason, feedback FROM outbox_messages WHERE id = $1",
        id,
    )
    .await
}

#[tokio::test]
async fn a_suppressed_address_is_never_mailed_and_a_message_with_only_such_recipients_ends_suppressed()
 {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    suppress(&db, "gone@example.com", SuppressionReason::Complaint).await;
    // Compared lower-cased, the display name left aside.
    let only = db
        .enqueue(
            "account_verification",
            verification("Gone <GONE@Example.com>"),
        )
        .await;
    let mut mixed = verification("kept@example.com");
    mixed["cc"] = json!(["gone@example.com"]);
    let mixed = db.enqueue("account_verification", mixed).await;
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    one_step(&mut app).await;

    let received = smtp.messages();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].rcpt_tos, ["kept@example.com"]);
    assert_eq!(received[0].outbox_id, mixed.to_string());
    assert_eq!(state_of(&db, only).await.0.as_deref(), Some("suppressed"));
    // Not a dead letter: the gauge leaves it out; the detail says why.
    let sample = store::sample(&db.store, Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!((sample.totals.dead_letters, sample.totals.pending), (0, 0));
    let detail = outboxd::store::admin::message(&db.store, only)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.state.as_str(), "suppressed");
    assert!(detail.last_error.unwrap().contains("complaint"));
    let stats = outboxd::store::stats::stats(&db.store).await.unwrap();
    assert_eq!(stats.suppressed_last_hour, 1);
    // The recorder is the process's, shared by the tests running beside this one.
    let rendered = outboxd::telemetry::metrics::install_recorder()
        .unwrap()
        .render();
    let series = r#"outbox_messages_suppressed_total{kind="account_verification",reason="complaint",scope="all"} "#;
    let counted =
        metric_value(&rendered, series.trim_end()).unwrap_or_else(|| panic!("{rendered}"));
    assert!(counted >= 1.0, "{rendered}");
}

#[tokio::test]
async fn an_address_the_claim_cannot_read_as_listed_is_still_looked_up_and_suppressed() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    // The list keeps a domain in ASCII; the claim statement reads the payload's Unicode
    // form, which it cannot convert, so the dispatcher looks this one up itself.
    suppress(&db, "ada@xn--bcher-kva.de", SuppressionReason::Unsubscribe).await;
    let unicode = db.verification_to("Ada <Ada@Bücher.de>").await;
    let kept = db.verification_to("kept@example.com").await;
    let mut app = app(&db, Some(&smtp.url()), &[]).await;
    one_step(&mut app).await;

    let received = smtp.messages();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].outbox_id, kept.to_string());
    assert_eq!(
        state_of(&db, unicode).await.0.as_deref(),
        Some("suppressed")
    );
}

#[tokio::test]
async fn the_claim_reads_every_envelope_shape_and_finds_the_listed_addresses() {
    let db = TestDb::new().await;
    suppress(&db, "ada@example.com", SuppressionReason::Unsubscribe).await;
    suppress(&db, "dan@example.com", SuppressionReason::Complaint).await;
    // The dispatcher looks up any address the claim did not read, so only the claim's own
    // result shows what it read: one recipient in a display-name form, arrays, a string
    // `cc`, a null `cc`, entries that are not strings, and a payload past the size limit.
    let shapes = [
        json!({"to": "Ada <Ada@Example.COM>"}),
        json!({"to": ["bob@example.com"], "cc": "cy@example.com",
               "bcc": ["dan@example.com", 42]}),
        json!({"to": "eve@example.com", "cc": null}),
        json!({"to": "fay@example.com", "padding": "x".repeat(2_000)}),
    ];
    for shape in shapes {
        db.enqueue("account_verification", shape).await;
    }
    let claimed = store::claim(
        &db.store,
        &db.pool,
        &ClaimRequest {
            limit: 10,
            bulk_limit: None,
            lease: Duration::from_secs(60),
            worker_id: "test",
            due_by: None,
            max_payload_bytes: 1_000,
            floor: None,
            bulk_kinds: &[],
            bulk_floor: None,
            lanes: &outboxd::message::Lane::ALL,
        },
    )
    .await
    .unwrap();
    assert_eq!(claimed.batch.messages.len(), 4);
    // The payload past the size limit is not read: it is dead-lettered unsent.
    let mut looked_up: Vec<_> = claimed.suppression.looked_up.into_iter().collect();
    looked_up.sort();
    let expected = ["ada", "bob", "cy", "dan", "eve"].map(|name| format!("{name}@example.com"));
    assert_eq!(looked_up, expected);
    let listed = claimed.suppression.listed;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        listed["ada@example.com"][0].reason,
        SuppressionReason::Unsubscribe
    );
    assert_eq!(
        listed["dan@example.com"][0].reason,
        SuppressionReason::Complaint
    );
}

#[tokio::test]
async fn a_reply_that_the_mailbox_does_not_exist_suppresses_its_recipient_for_the_next_message() {
    let Scenario { db, smtp, mut app } = Scenario::new(&[]).await;
    // Gmail's, Microsoft 365's (after DATA, as Exchange Online refuses) and Postfix's own
    // replies, as their documentation gives them (tests/support/provider_replies.json).
    for (address, status) in [
        ("reply-gmail-5-1-1-bob@example.com", "5.1.1"),
        ("datareply-microsoft-5-1-10-kim@example.com", "5.1.10"),
        ("reply-postfix-local-lee@example.com", "5.1.1"),
    ] {
        let first = db.verification_to(address).await;
        one_step(&mut app).await;
        assert!(db.row(first).await.dead, "{address}: dead-lettered");
        assert_eq!(db.row(first).await.attempts, 1, "{address}: after one try");
        assert_eq!(
            state_of(&db, first).await.1.as_deref(),
            Some("hard_bounce"),
            "{address}"
        );
        let listed = db
            .suppression_of(address)
            .await
            .unwrap_or_else(|| panic!("{address} suppressed"));
        assert_eq!(listed.reason.0, SuppressionReason::HardBounce);
        assert_eq!(
            (listed.source.as_str(), listed.message_id),
            ("smtp", Some(first))
        );
        assert!(listed.detail.unwrap().contains(status), "{address}");

        let next = db
            .enqueue(
                "account_verification",
                verification(&address.to_uppercase()),
            )
            .await;
        one_step(&mut app).await;
        assert_eq!(
            state_of(&db, next).await.0.as_deref(),
            Some("suppressed"),
            "{address}"
        );
    }
    assert!(smtp.messages().is_empty());

    // A refusal for another reason (5.7.1: the mailbox exists, whatever its words say), or
    // one about our sender (Postfix's quoting another server's 5.1.1, Exim's sender
    // verification), suppresses nobody.
    for address in [
        "reply-postfix-policy-user-unknown-carol@example.com",
        "reply-gmail-5-7-1-spam-dora@example.com",
        "senderverify-erin@example.com",
        "reply-exim-sender-verify-fay@example.com",
    ] {
        let id = db.verification_to(address).await;
        one_step(&mut app).await;
        assert!(db.row(id).await.dead, "{address}");
        assert!(
            suppressions::get(
                &db.store,
                &outboxd::suppression::Address::parse(address).unwrap()
            )
            .await
            .unwrap()
            .is_empty(),
            "{address}"
        );
        assert_eq!(state_of(&db, id).await.1, None, "{address}");
    }
}

#[tokio::test]
async fn a_bounce_stops_the_rest_of_its_batch_to_the_same_address() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let mut ids = Vec::new();
    for to in [
        "unknown-amy@example.com",
        "Unknown-Amy@example.com",
        "unknown-amy@example.com",
    ] {
        ids.push(db.verification_to(to).await);
    }
    let mut app = app(&db, Some(&smtp.url()), &["--smtp-concurrency", "1"]).await;
    one_step(&mut app).await;
    assert!(db.row(ids[0]).await.dead);
    for id in &ids[1..] {
        assert_eq!(state_of(&db, *id).await.0.as_deref(), Some("suppressed"));
    }
}

#[tokio::test]
async fn a_message_to_several_recipients_of_which_one_is_unknown_reaches_the_others() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let mut payload = verification("unknown-zoe@example.com");
    payload["cc"] = json!(["kept-yan@example.com"]);
    let id = db.enqueue("account_verification", payload).await;
    let mut app = app(&db, Some(&smtp.url()), &["--retry-backoff", "0s"]).await;
    one_step(&mut app).await;
    let row = db.row(id).await;
    assert!(!row.dead && row.attempts == 1, "{row:?}");
    assert!(
        row.last_error
            .unwrap()
            .contains("trying the other recipients again")
    );
    one_step(&mut app).await;
    let received = smtp.messages();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].rcpt_tos, ["kept-yan@example.com"]);
    assert!(db.row(id).await.dispatched);
}

#[tokio::test]
async fn automatic_suppression_can_be_turned_off() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let id = db
        .enqueue(
            "account_verification",
            verification("unknown-dan@example.com"),
        )
        .await;
    let mut app = app(
        &db,
        Some(&smtp.url()),
        &["--suppress-hard-bounces", "false"],
    )
    .await;
    one_step(&mut app).await;
    assert!(db.row(id).await.dead);
    // Still a hard bounce on the row (and in the metrics), only not on the list.
    assert_eq!(state_of(&db, id).await.1.as_deref(), Some("hard_bounce"));
    let listed = suppressions::list(&db.store, None, None, 10).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn operators_list_add_and_remove_suppressions_through_the_api_with_an_audit_entry() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let added = api(
        &addr,
        "POST",
        "/api/v1/suppressions",
        Some(json!({"address": "Ada <ADA@example.com>", "reason": "unsubscribe", "detail": "asked by phone"})),
    )
    .await;
    assert_eq!(added.status, 201, "{}", added.body);
    assert_eq!(added.json()["address"], "ada@example.com");
    assert_eq!(added.json()["created_by"], "api:alice");
    for address in ["b1@example.com", "b2@example.com", "b3@example.com"] {
        let added = api(
            &addr,
            "POST",
            "/api/v1/suppressions",
            Some(json!({"address": address})),
        )
        .await;
        assert_eq!(added.status, 201);
        assert_eq!(added.json()["reason"], "manual");
    }
    let page = api_get(&addr, "/api/v1/suppressions?search=B&limit=2")
        .await
        .json();
    assert_eq!(page["suppressions"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after"], "b2@example.com");
    let rest = api_get(&addr, "/api/v1/suppressions?search=b&after=b2@example.com")
        .await
        .json();
    assert_eq!(rest["suppressions"][0]["address"], "b3@example.com");
    assert!(rest["next_after"].is_null());
    let one = api_get(&addr, "/api/v1/suppressions/ada@example.com").await;
    assert_eq!(one.json()["reason"], "unsubscribe");

    let removed = api(
        &addr,
        "DELETE",
        "/api/v1/suppressions/ADA@example.com",
        None,
    )
    .await;
    assert_eq!(removed.status, 204);
    let again = api(
        &addr,
        "DELETE",
        "/api/v1/suppressions/ada@example.com",
        None,
    )
    .await;
    assert_eq!(again.status, 404);
    let audit = outboxd::store::admin::audit_log(&db.store, 10)
        .await
        .unwrap();
    let actions: Vec<_> = audit
        .iter()
        .map(|a| (a.action.as_str(), a.target.as_str()))
        .collect();
    assert!(
        actions.contains(&("unsuppress", "ada@example.com")),
        "{actions:?}"
    );
    assert!(
        actions.contains(&("suppress", "ada@example.com")),
        "{actions:?}"
    );
    assert!(audit.iter().all(|a| a.actor == "api:alice"));
}

#[tokio::test]
async fn bad_suppression_requests_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    for (body, says) in [
        (json!({"address": "not an address"}), "not an email address"),
        (
            json!({"address": "a@b.example\r\nBcc: x@evil.test"}),
            "control",
        ),
        (
            json!({"address": "a@b.example", "reason": "bounce"}),
            "reason",
        ),
        (
            json!({"address": "a@b.example", "until": "2001-01-01T00:00:00Z"}),
            "future",
        ),
        (
            json!({"address": "a@b.example", "extra": 1}),
            "unknown field",
        ),
        (
            json!({"address": "a@b.example", "detail": "x".repeat(1001)}),
            "detail",
        ),
    ] {
        let refused = api(&addr, "POST", "/api/v1/suppressions", Some(body.clone())).await;
        assert_eq!(refused.status, 400, "{body}: {}", refused.body);
        assert!(refused.body.contains(says), "{body}: {}", refused.body);
    }
    for path in [
        "/api/v1/suppressions?limit=0",
        "/api/v1/suppressions?sort=address",
        "/api/v1/suppressions/nobody",
    ] {
        let refused = api_get(&addr, path).await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.body);
    }
    assert!(
        suppressions::list(&db.store, None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        outboxd::store::admin::audit_log(&db.store, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_cli_lists_adds_and_removes_suppressions() {
    let db = TestDb::new().await;
    let cli = |args: &[&str]| {
        said(
            outboxd()
                .args(["suppressions"])
                .args(args)
                .args(["--database-url", &db.url]),
            "outboxd suppressions",
        )
    };
    let (ok, out, _) = cli(&[
        "add",
        "Zed@Example.com",
        "--reason",
        "complaint",
        "--detail",
        "by hand",
    ]);
    assert!(ok);
    assert!(
        out.contains("suppressed zed@example.com (complaint)"),
        "{out}"
    );
    let (ok, out, _) = cli(&["list"]);
    assert!(
        ok && out.contains("zed@example.com") && out.contains("complaint"),
        "{out}"
    );
    let (ok, out, _) = cli(&["list", "--json", "--search", "ZED"]);
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["detail"], "by hand");
    let (ok, _, err) = cli(&["add", "nobody", "--reason", "manual"]);
    assert!(!ok && err.contains("not an email address"), "{err}");
    let (ok, _, err) = cli(&["add", "a@b.example", "--reason", "whim"]);
    assert!(!ok && err.contains("unknown reason"), "{err}");
    let (ok, out, _) = cli(&["remove", "zed@example.com"]);
    assert!(ok && out.contains("removed zed@example.com"), "{out}");
    let (ok, _, err) = cli(&["remove", "zed@example.com"]);
    assert!(!ok && err.contains("is not suppressed"), "{err}");
    let audit = outboxd::store::admin::audit_log(&db.store, 10)
        .await
        .unwrap();
    assert_eq!(
        audit.len(),
        3,
        "two changes and a removal of nothing: {audit:?}"
    );
}

#[tokio::test]
async fn the_page_searches_adds_and_removes_suppressions_with_the_csrf_token() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let auth = basic("ops", crate::admin::TOKEN);
    let get = |path: String| {
        let (addr, auth) = (addr.clone(), auth.clone());
        async move {
            http_full(&addr, "GET", &path, &[("Authorization", &auth)], "")
                .await
                .unwrap()
        }
    };
    let post = |path: &'static str, body: String| {
        let (addr, auth) = (addr.clone(), auth.clone());
        async move {
            http_full(
                &addr,
                "POST",
                path,
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                &body,
            )
            .await
            .unwrap()
        }
    };
    let page = get("/admin".into()).await;
    assert!(page.body.contains("Suppression list"), "{}", page.body);
    let csrf = csrf_in(&page.body);
    let forged = post(
        "/admin/suppressions",
        "csrf=forged&address=x%40example.com&reason=manual".into(),
    )
    .await;
    assert_eq!(forged.status, 403);
    let added = post(
        "/admin/suppressions",
        format!("csrf={csrf}&address=Page%40Example.com&reason=unsubscribe&detail=by+phone"),
    )
    .await;
    assert_eq!(added.status, 303);
    // The notice travels in the URL (history, proxies' logs): no address in it.
    let location = added.header("location").unwrap();
    assert!(location.contains("Suppressed+the+address"), "{location}");
    assert!(
        !location.to_ascii_lowercase().contains("page"),
        "{location}"
    );
    let refused = post(
        "/admin/suppressions",
        format!("csrf={csrf}&address=not+an+address&reason=manual"),
    )
    .await;
    assert!(
        refused
            .header("location")
            .unwrap()
            .contains("Could+not+suppress")
    );
    let found = get("/admin?suppressed=PAGE".into()).await;
    assert!(
        found.body.contains("<td>page@example.com</td>"),
        "{}",
        found.body
    );
    assert_eq!(get("/admin?suppressed=%01x".into()).await.status, 400);
    let none = get("/admin?suppressed=nobody".into()).await;
    assert!(!none.body.contains("<td>page@example.com</td>"));
    let removed = post(
        "/admin/suppressions/remove",
        format!("csrf={csrf}&address=page%40example.com"),
    )
    .await;
    let location = removed.header("location").unwrap();
    assert!(
        location.contains("Removed") && !location.contains("page"),
        "{location}"
    );
    assert!(
        suppressions::get(
            &db.store,
            &outboxd::suppression::Address::parse("page@example.com").unwrap()
        )
        .await
        .unwrap()
        .is_empty()
    );
    let page = get("/admin".into()).await;
    assert!(
        page.body.contains("</span></td><td>unsuppress</td>"),
        "audited"
    );

    // Fifty to a page, in address order, with a link to the next.
    for i in 0..55 {
        let address = format!("many{i:02}@example.com");
        suppress(&db, &address, SuppressionReason::Manual).await;
    }
    let first = get("/admin?suppressed=many".into()).await;
    assert!(first.body.contains("<td>many49@example.com</td>"));
    assert!(!first.body.contains("<td>many50@example.com</td>"));
    let next = first
        .body
        .split("id=\"suppressions-next\" href=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&");
    let second = get(next).await;
    assert!(
        second.body.contains("<td>many54@example.com</td>"),
        "{}",
        second.body
    );
    assert!(!second.body.contains("<td>many49@example.com</td>"));
    assert!(!second.body.contains("suppressions-next"));
}
