use std::time::Duration;

use base64::Engine as _;
use outboxd::app::App;
use outboxd::dispatch::Step;
use serde_json::{Value, json};

use crate::helpers::{
    Count, Dispatching, HttpResponse, SmtpServer, TestDb, app, batch, free_port, http_full,
    http_get, one_step, outboxd, outboxd_as, preview, said, verification,
};

pub(crate) const TOKEN: &str = "test-admin-token-0123456789";

/// A running app with the admin surface on, and its address.
pub(crate) async fn admin_app(
    db: &TestDb,
    smtp_url: Option<&str>,
    extra: &[&str],
) -> (App, String) {
    let mut flags = vec!["--admin-token", TOKEN];
    flags.extend(extra);
    let mut app = app(db, smtp_url, &flags).await;
    let addr = app.admin_addr().expect("admin on").to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    app.spawn_background(stop.clone());
    (app, addr)
}

pub(crate) async fn api(addr: &str, method: &str, path: &str, body: Option<Value>) -> HttpResponse {
    let auth = format!("Bearer {TOKEN}");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    http_full(
        addr,
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("X-Outboxd-Actor", "alice"),
        ],
        &body,
    )
    .await
    .unwrap()
}

/// `GET path` with this `Authorization` header.
pub(crate) async fn get_with(addr: &str, path: &str, authorization: &str) -> HttpResponse {
    http_full(addr, "GET", path, &[("Authorization", authorization)], "")
        .await
        .unwrap()
}

/// `GET path` on the admin API.
pub(crate) async fn api_get(addr: &str, path: &str) -> HttpResponse {
    api(addr, "GET", path, None).await
}

/// `POST path` on the admin API, without a body.
pub(crate) async fn api_post(addr: &str, path: &str) -> HttpResponse {
    api(addr, "POST", path, None).await
}

/// `n` verifications to `{prefix}{i}@example.com`, committed in one transaction.
async fn verifications_in_one_transaction(db: &TestDb, n: usize, prefix: &str) {
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..n {
        let to = format!("{prefix}{i}@example.com");
        let message = outboxd::NewMessage::new("account_verification", verification(&to));
        outboxd_producer::enqueue(&mut *tx, message.unwrap())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// The CSRF token the admin page's forms carry.
pub(crate) fn csrf_in(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form with a CSRF token")
        .to_owned()
}

pub(crate) fn basic(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// A dead letter as the dispatcher leaves one, written directly for speed.
pub(crate) async fn dead_letter(db: &TestDb, kind: &str, error_class: &str, to: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_messages (kind, payload, attempts, last_error, error_class, dead_lettered_at) \
         VALUES ($1, $2, 1, 'permanent error (550): no such user', $3, now()) RETURNING id",
    )
    .bind(kind)
    .bind(verification(to))
    .bind(error_class)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

fn error_code(response: &HttpResponse) -> String {
    response.json()["error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn the_admin_surface_is_off_without_a_token() {
    let db = TestDb::new().await;
    let mut app = app(&db, None, &[]).await;
    assert_eq!(app.admin_addr(), None);
    let addr = app.http_addr().to_string();
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    for path in ["/api/v1/stats", "/api/v1/dead-letters", "/admin"] {
        let response = get_with(&addr, path, "Bearer anything").await;
        assert_eq!(response.status, 404, "{path}");
    }
    assert_eq!(http_get(&addr, "/metrics").await.0, 200);
}

#[tokio::test]
async fn the_api_and_the_page_require_the_token() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;

    let none = http_full(&addr, "GET", "/api/v1/stats", &[], "")
        .await
        .unwrap();
    assert_eq!(none.status, 401);
    assert_eq!(error_code(&none), "unauthorized");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Bearer realm=\"outboxd\"")
    );
    let wrong = get_with(&addr, "/api/v1/stats", "Bearer not-the-token").await;
    assert_eq!(wrong.status, 401);
    let prefix = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let almost = get_with(&addr, "/api/v1/stats", &prefix).await;
    assert_eq!(almost.status, 401);
    assert_eq!(api_get(&addr, "/api/v1/stats").await.status, 200);
    // The page takes HTTP Basic, not the API's scheme.
    let bearer_on_page = http_full(
        &addr,
        "GET",
        "/admin",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        "",
    )
    .await
    .unwrap();
    assert_eq!(bearer_on_page.status, 401);

    let none = http_full(&addr, "GET", "/admin", &[], "").await.unwrap();
    assert_eq!(none.status, 401);
    assert!(
        none.header("www-authenticate")
            .unwrap()
            .starts_with("Basic realm=")
    );
    let wrong = http_full(
        &addr,
        "GET",
        "/admin",
        &[("Authorization", &basic("ops", "wrong"))],
        "",
    )
    .await
    .unwrap();
    assert_eq!(wrong.status, 401);
    let right = http_full(
        &addr,
        "GET",
        "/admin",
        &[("Authorization", &basic("ops", TOKEN))],
        "",
    )
    .await
    .unwrap();
    assert_eq!(right.status, 200);
    assert!(right.body.contains("signed in as ops"));
    // Probes and metrics stay open.
    assert_eq!(http_get(&addr, "/readyz").await.0, 200);
}

#[tokio::test]
async fn dead_letters_are_listed_newest_first_page_by_page_and_by_kind() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            dead_letter(
                &db,
                "invoice_notice",
                "smtp_550",
                &format!("r{i}@example.com"),
            )
            .await,
        );
    }
    let other = dead_letter(&db, "workspace_invite", "address", "x@example.com").await;
    db.verification_to("pending@example.com").await;

    let first = api_get(&addr, "/api/v1/dead-letters?limit=4").await.json();
    let listed: Vec<i64> = first["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, [other, ids[4], ids[3], ids[2]]);
    assert_eq!(first["next_after"], ids[2]);
    let item = &first["dead_letters"][1];
    assert_eq!(item["recipients"], json!(["r4@example.com"]));
    assert_eq!(item["error_class"], "smtp_550");
    assert_eq!(item["last_error"], "permanent error (550): no such user");
    assert!(item.get("payload").is_none(), "the list carries no payload");
    for field in ["kind", "attempts", "created_at", "dead_lettered_at"] {
        assert!(item.get(field).is_some(), "{field}");
    }
    let second = api_get(
        &addr,
        &format!("/api/v1/dead-letters?limit=4&after={}", ids[2]),
    )
    .await
    .json();
    let listed: Vec<i64> = second["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, [ids[1], ids[0]]);
    assert_eq!(second["next_after"], Value::Null);

    let by_kind = api_get(&addr, "/api/v1/dead-letters?kind=workspace_invite")
        .await
        .json();
    assert_eq!(by_kind["dead_letters"].as_array().unwrap().len(), 1);

    for bad in [
        "?limit=0",
        "?limit=501",
        "?limit=ten",
        "?after=-1",
        "?after=x",
        "?colour=red",
    ] {
        let response = api_get(&addr, &format!("/api/v1/dead-letters{bad}")).await;
        assert_eq!(response.status, 400, "{bad}");
        assert_eq!(error_code(&response), "bad_request", "{bad}");
    }
}

#[tokio::test]
async fn one_dead_letter_comes_with_its_payload_and_unknown_ids_are_404() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let id = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    let pending = db.verification_to("p@example.com").await;

    let one = api_get(&addr, &format!("/api/v1/dead-letters/{id}")).await;
    assert_eq!(one.status, 200);
    let one = one.json();
    assert_eq!(one["payload"]["to"], "a@example.com");
    assert_eq!(one["state"], "dead_lettered");

    let missing = api_get(&addr, "/api/v1/dead-letters/999999").await;
    assert_eq!(
        (missing.status, error_code(&missing).as_str()),
        (404, "not_found")
    );
    let not_dead = api_get(&addr, &format!("/api/v1/dead-letters/{pending}")).await;
    assert_eq!(not_dead.status, 404);
    let bad = api_get(&addr, "/api/v1/dead-letters/abc").await;
    assert_eq!(
        (bad.status, error_code(&bad).as_str()),
        (400, "bad_request")
    );
}

#[tokio::test]
async fn a_retried_dead_letter_is_delivered_and_cannot_be_retried_twice() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (mut app, addr) = admin_app(
        &db,
        Some(&smtp.url()),
        &["--max-attempts", "1", "--poll-interval", "10m"],
    )
    .await;
    // Greylisted once: with one attempt allowed, that is a dead letter.
    let id = db.verification_to("flaky1@example.com").await;
    let step = one_step(&mut app).await;
    assert_eq!(step, batch(&[Count::Claimed(1), Count::DeadLettered(1)]));
    assert_eq!(db.row(id).await.attempts, 1);

    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    let retried = api_post(&addr, &format!("/api/v1/dead-letters/{id}/retry")).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(
        retried.json(),
        json!({"id": id, "requeued": 1, "warnings": []})
    );
    // The retry wakes the dispatcher: the poll interval is ten minutes.
    smtp.wait_for(1, Duration::from_secs(30)).await;
    crate::helpers::eventually(Duration::from_secs(10), "recorded as sent", || async {
        db.row(id).await.dispatched
    })
    .await;
    assert_eq!(db.row(id).await.attempts, 0);

    let again = api_post(&addr, &format!("/api/v1/dead-letters/{id}/retry")).await;
    assert_eq!(
        (again.status, error_code(&again).as_str()),
        (409, "not_dead_lettered")
    );
    assert!(
        again.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("dispatched")
    );
    let missing = api_post(&addr, "/api/v1/dead-letters/999999/retry").await;
    assert_eq!(missing.status, 404);
    running.stop().await;
}

#[tokio::test]
async fn a_discarded_dead_letter_is_kept_but_leaves_the_view_and_the_gauge() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let id = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    let kept = dead_letter(&db, "invoice_notice", "smtp_550", "b@example.com").await;

    let discarded = api_post(&addr, &format!("/api/v1/dead-letters/{id}/discard")).await;
    assert_eq!(discarded.status, 200, "{}", discarded.body);
    assert_eq!(
        discarded.json(),
        json!({"id": id, "discarded": 1, "warnings": []})
    );
    let (by, discarded_at): (Option<String>, bool) = db
        .one_row(
            "SELECT discarded_by, discarded_at IS NOT NULL FROM outbox_messages WHERE id = $1",
            id,
        )
        .await;
    assert_eq!((by.as_deref(), discarded_at), (Some("api:alice"), true));
    let listed = api_get(&addr, "/api/v1/dead-letters").await.json();
    assert_eq!(listed["dead_letters"].as_array().unwrap().len(), 1);
    assert_eq!(listed["dead_letters"][0]["id"], kept);
    assert_eq!(
        outboxd::store::sample(&db.store, Duration::from_secs(10), None)
            .await
            .unwrap()
            .totals
            .dead_letters,
        1
    );
    assert_eq!(
        api_get(&addr, "/api/v1/stats").await.json()["dead_letters"],
        1
    );

    for action in ["discard", "retry"] {
        let again = api_post(&addr, &format!("/api/v1/dead-letters/{id}/{action}")).await;
        assert_eq!(
            (again.status, error_code(&again).as_str()),
            (409, "not_dead_lettered"),
            "{action}"
        );
    }
    let shown = api_get(&addr, &format!("/api/v1/dead-letters/{id}"))
        .await
        .json();
    assert_eq!(shown["state"], "discarded");
    let audit: Vec<(String, String, String, i32)> =
        sqlx::query_as("SELECT actor, action, target, rows FROM outbox_admin_audit ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        audit[0],
        (
            "api:alice".to_owned(),
            "discard".to_owned(),
            format!("id {id}"),
            1
        )
    );
}

#[tokio::test]
async fn groups_show_dead_letters_by_kind_and_cause_and_bulk_actions_take_a_group() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    for i in 0..3 {
        dead_letter(
            &db,
            "invoice_notice",
            "smtp_550",
            &format!("i{i}@example.com"),
        )
        .await;
    }
    let newest_unknown = {
        dead_letter(&db, "welcome", "unknown_kind", "w1@example.com").await;
        dead_letter(&db, "welcome", "unknown_kind", "w2@example.com").await
    };
    dead_letter(&db, "invoice_notice", "address", "bad@example.com").await;

    let groups = api_get(&addr, "/api/v1/dead-letters/groups").await.json();
    let summary: Vec<(String, String, i64)> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["kind"].as_str().unwrap().into(),
                g["error_class"].as_str().unwrap().into(),
                g["count"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("invoice_notice".into(), "smtp_550".into(), 3),
            ("welcome".into(), "unknown_kind".into(), 2),
            ("invoice_notice".into(), "address".into(), 1)
        ]
    );
    assert_eq!(groups["groups"][1]["newest"]["id"], newest_unknown);

    let discarded = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/discard",
        Some(json!({"group": {"kind": "welcome", "error_class": "unknown_kind"}})),
    )
    .await;
    assert_eq!(discarded.json(), json!({"discarded": 2, "warnings": []}));
    let retried = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/retry",
        Some(json!({"kind": "invoice_notice"})),
    )
    .await;
    assert_eq!(retried.json(), json!({"requeued": 4, "warnings": []}));
    assert_eq!(
        api_get(&addr, "/api/v1/dead-letters/groups").await.json()["groups"],
        json!([])
    );
    assert_eq!(db.count("pending").await, 4);
}

#[tokio::test]
async fn bulk_requests_need_exactly_one_filter() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let id = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    for body in [
        "{}",
        r#"{"kind": "invoice_notice", "all": true}"#,
        r#"{"all": false}"#,
        r#"{"ids": []}"#,
        r#"{"kind": ""}"#,
        r#"{"ids": "1"}"#,
        r#"{"colour": "red"}"#,
        "not json",
        "",
    ] {
        for action in ["retry", "discard"] {
            let auth = format!("Bearer {TOKEN}");
            let response = http_full(
                &addr,
                "POST",
                &format!("/api/v1/dead-letters/{action}"),
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                body,
            )
            .await
            .unwrap();
            assert_eq!(response.status, 400, "{action} {body}: {}", response.body);
            assert_eq!(error_code(&response), "bad_request", "{action} {body}");
        }
    }
    assert!(db.row(id).await.dead, "nothing changed");
    let by_ids = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/retry",
        Some(json!({"ids": [id, 999999]})),
    )
    .await;
    assert_eq!(by_ids.json(), json!({"requeued": 1, "warnings": []}));
}

#[tokio::test]
async fn bulk_retry_after_an_smtp_outage_delivers_a_thousand_dead_letters() {
    let db = TestDb::new().await;
    let port = free_port();
    let url = format!("smtp://127.0.0.1:{port}");
    let (mut app, addr) = admin_app(
        &db,
        Some(&url),
        &[
            "--max-attempts",
            "1",
            "--batch-size",
            "200",
            "--smtp-concurrency",
            "8",
        ],
    )
    .await;
    verifications_in_one_transaction(&db, 1000, "u").await;

    // The mail server is up but refuses everything with 451: every message gives up.
    let refusing = SmtpServer::start_deferring_all(port);
    let step = app.dispatcher.drain().await.unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.dead_lettered == 1000),
        "{step:?}"
    );
    drop(refusing);
    let groups = api_get(&addr, "/api/v1/dead-letters/groups").await.json();
    assert_eq!(groups["groups"][0]["count"], 1000);
    assert_eq!(groups["groups"][0]["error_class"], "smtp_451");

    // Fixed: retry the whole group, and everything goes out.
    let smtp = SmtpServer::start_on(port);
    let retried = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/retry",
        Some(json!({"group": {"kind": "account_verification", "error_class": "smtp_451"}})),
    )
    .await;
    assert_eq!(retried.json(), json!({"requeued": 1000, "warnings": []}));
    let mut sent = 0;
    for _ in 0..20 {
        if let Step::Batch(report) = app.dispatcher.drain().await.unwrap() {
            sent += report.sent;
        }
        if sent == 1000 {
            break;
        }
    }
    assert_eq!(sent, 1000);
    assert_eq!(smtp.messages().len(), 1000);
    assert_eq!(db.count("dead").await, 0);
}

#[tokio::test]
async fn stats_count_pending_due_in_flight_dead_letters_and_recent_sends_per_kind() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    db.verification_to("due@example.com").await;
    let later = outboxd::NewMessage::new("account_verification", verification("later@example.com"))
        .unwrap()
        .with_not_before(chrono::Utc::now() + chrono::Duration::hours(1))
        .unwrap();
    db.store.enqueue(&db.pool, later).await.unwrap();
    let leased = db
        .enqueue("invoice_notice", verification("leased@example.com"))
        .await;
    sqlx::query("UPDATE outbox_messages SET locked_until = now() + interval '1 minute', next_attempt_at = now() + interval '1 minute' WHERE id = $1")
        .bind(leased).execute(&db.pool).await.unwrap();
    dead_letter(&db, "invoice_notice", "smtp_550", "dead@example.com").await;
    db.exec("INSERT INTO outbox_messages (kind, payload, dispatched_at) VALUES ('account_verification', '{}', now()), ('account_verification', '{}', now() - interval '2 hours')").await;

    let stats = api_get(&addr, "/api/v1/stats").await.json();
    assert_eq!(stats["pending"], 3);
    assert_eq!(stats["due"], 1);
    assert_eq!(stats["in_flight"], 1);
    assert_eq!(stats["dead_letters"], 1);
    assert_eq!(stats["sent_last_hour"], 1);
    assert_eq!(stats["kinds"]["account_verification"]["pending"], 2);
    assert_eq!(stats["kinds"]["invoice_notice"]["in_flight"], 1);
    assert!(stats["oldest_pending_age_seconds"].as_f64().unwrap() >= 0.0);
}

#[tokio::test]
async fn admin_listen_keeps_the_admin_surface_off_the_metrics_address() {
    let db = TestDb::new().await;
    let admin_port = free_port();
    let admin_listen = format!("127.0.0.1:{admin_port}");
    let (app, addr) = admin_app(&db, None, &["--admin-listen", &admin_listen]).await;
    assert_eq!(addr, admin_listen);
    let main = app.http_addr().to_string();
    assert_eq!(api(&main, "GET", "/api/v1/stats", None).await.status, 404);
    assert_eq!(api_get(&addr, "/api/v1/stats").await.status, 200);
    assert_eq!(
        http_full(&addr, "GET", "/metrics", &[], "")
            .await
            .unwrap()
            .status,
        404
    );
    assert_eq!(
        http_full(&main, "GET", "/metrics", &[], "")
            .await
            .unwrap()
            .status,
        200
    );
}

#[tokio::test]
async fn the_page_lists_dead_letters_and_its_forms_need_the_csrf_token() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let long_error = format!("permanent error (550): {}", "x".repeat(300));
    let id = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    sqlx::query("UPDATE outbox_messages SET last_error = $1 WHERE id = $2")
        .bind(&long_error)
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let auth = basic("ops", TOKEN);
    let page = get_with(&addr, "/admin", &auth).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(&format!("id=\"dead-letter-{id}\"")));
    assert!(page.body.contains("<details>"), "long errors are folded");
    let csrf = csrf_in(&page.body);

    let forged = http_full(
        &addr,
        "POST",
        &format!("/admin/dead-letters/{id}/retry"),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "csrf=forged",
    )
    .await
    .unwrap();
    assert_eq!(forged.status, 403);
    assert!(db.row(id).await.dead);

    let retried = http_full(
        &addr,
        "POST",
        &format!("/admin/dead-letters/{id}/retry"),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("csrf={csrf}"),
    )
    .await
    .unwrap();
    assert_eq!(retried.status, 303);
    assert!(
        retried
            .header("location")
            .unwrap()
            .starts_with("/admin?notice=Retried+message")
    );
    assert!(!db.row(id).await.dead);
    let page = get_with(&addr, "/admin", &auth).await;
    assert!(
        page.body.contains("<td>ops <span class=\"muted\">admin#")
            && page.body.contains("</span></td><td>retry</td>"),
        "the audit shows the action"
    );
    let bad_page = get_with(&addr, "/admin?limit=0", &auth).await;
    assert_eq!(bad_page.status, 400);
}

#[tokio::test]
async fn retention_prunes_old_sent_and_discarded_rows_but_never_dead_letters() {
    let db = TestDb::new().await;
    db.exec("INSERT INTO outbox_messages (kind, payload, dispatched_at) \
         SELECT 'account_verification', '{}', now() - interval '8 days' FROM generate_series(1, 2500)").await;
    db.exec("INSERT INTO outbox_messages (kind, payload, dispatched_at) VALUES ('k', '{}', now() - interval '6 days'); \
         INSERT INTO outbox_messages (kind, payload, dead_lettered_at, discarded_at) VALUES ('k', '{}', now() - interval '9 days', now() - interval '8 days'); \
         INSERT INTO outbox_messages (kind, payload, dead_lettered_at) VALUES ('k', '{}', now() - interval '30 days');").await;
    // Each row has an event in its timeline; retention deletes those of the rows it deletes.
    db.exec(
        "INSERT INTO outbox_message_events (message_id, event) \
         SELECT id, 'retry' FROM outbox_messages",
    )
    .await;
    let app = app(&db, None, &[]).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let pruned = outboxd::background::retention::prune_once(
        &db.store,
        Duration::from_secs(7 * 86400),
        &app.metrics,
        &stop,
    )
    .await
    .unwrap();
    assert_eq!(
        pruned,
        outboxd::background::retention::Pruned {
            dispatched: 2500,
            discarded: 1,
            callbacks: 0,
        }
    );
    assert_eq!(
        db.count("all").await,
        2,
        "the recent sent row and the dead letter stay"
    );
    assert_eq!(db.count("dead").await, 1);
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_message_events e \
         WHERE NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.id = e.message_id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_message_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (orphans, kept),
        (0, 2),
        "the kept rows keep their timelines"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_a_large_table_does_not_hold_up_the_dispatcher() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    db.exec("INSERT INTO outbox_messages (kind, payload, dispatched_at) \
         SELECT 'account_verification', '{}', now() - interval '30 days' + g * interval '1 ms' FROM generate_series(1, 200000) g").await;
    let mut app = app(&db, Some(&smtp.url()), &["--batch-size", "50"]).await;
    verifications_in_one_transaction(&db, 300, "n").await;

    let pool = db.store.clone();
    let metrics = app.metrics.clone();
    let pruning = tokio::spawn(async move {
        let stop = tokio_util::sync::CancellationToken::new();
        outboxd::background::retention::prune_once(
            &pool,
            Duration::from_secs(7 * 86400),
            &metrics,
            &stop,
        )
        .await
    });
    let step = app.dispatcher.drain().await.unwrap();
    assert!(
        matches!(step, Step::Batch(ref r) if r.sent == 300),
        "{step:?}"
    );
    let pruned = pruning.await.unwrap().unwrap();
    assert_eq!(pruned.dispatched, 200_000);
    assert_eq!(db.count("dispatched").await, 300);
    assert_eq!(smtp.messages().len(), 300);
}

#[tokio::test]
async fn what_producers_wrote_reaches_an_operators_terminal_escaped() {
    let db = TestDb::new().await;
    // A kind, a recipient and an error that would clear the screen, colour it, or reorder
    // what it shows.
    let hostile = "x\u{1b}[2J\u{1b}[31mred\u{202E}";
    dead_letter(&db, hostile, hostile, &format!("{hostile}@example.com")).await;
    for args in [&["dead-letters", "list"][..], &["stats"][..]] {
        let output = outboxd()
            .args(args)
            .args(["--database-url", &db.url])
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}");
        let shown = String::from_utf8_lossy(&output.stdout);
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{202E}'),
            "{args:?}: {shown:?}"
        );
        assert!(shown.contains("\\u{1b}[2J"), "{args:?}: {shown}");
    }
    let payload = json!({"to": "a@example.com", "name": "\u{1b}]0;owned\u{7}", "verify_url": "u"});
    let shown = preview("account_verification", &payload.to_string(), &[]);
    assert!(
        !shown.contains('\u{1b}') && shown.contains("\\u{1b}]0;owned"),
        "{shown}"
    );
}

#[tokio::test]
async fn the_cli_lists_shows_retries_and_discards_dead_letters() {
    let db = TestDb::new().await;
    let a = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    let b = dead_letter(&db, "invoice_notice", "smtp_550", "b@example.com").await;
    let c = dead_letter(&db, "welcome", "unknown_kind", "c@example.com").await;
    let run = |args: &[&str]| said(&mut outboxd_as("carol", &db.url, args), "outboxd");

    let (ok, table, _) = run(&["dead-letters", "list"]);
    assert!(ok);
    // The first line names the database read, the host, port and name.
    let (database, table) = table.split_once('\n').unwrap();
    assert_eq!(database, format!("database 127.0.0.1:5432/{}", db.name));
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table.contains("smtp_550") && table.contains("c@example.com"),
        "{table}"
    );
    // Only a full page says where the next one starts.
    assert!(!table.contains("older:"), "{table}");
    let (ok, table, _) = run(&["dead-letters", "list", "--limit", "2"]);
    assert!(ok);
    assert!(
        table.contains(&format!("(2 shown; older: --after {b})")),
        "{table}"
    );
    let (ok, table, _) = run(&["dead-letters", "list", "--after", &b.to_string()]);
    assert!(
        ok && table.contains("a@example.com") && !table.contains("older:"),
        "{table}"
    );
    let (ok, json, _) = run(&["dead-letters", "list", "--kind", "invoice_notice", "--json"]);
    assert!(ok);
    let listed: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    let (ok, shown, _) = run(&["dead-letters", "show", &a.to_string()]);
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["payload"]["to"],
        "a@example.com"
    );

    let (ok, out, _) = run(&["dead-letters", "retry", &a.to_string()]);
    assert!(ok, "{out}");
    assert!(
        out.trim().ends_with(&format!("\nrequeued message {a}")),
        "{out}"
    );
    let (ok, out, _) = run(&["dead-letters", "discard", "--group", "welcome/unknown_kind"]);
    assert!(ok);
    assert!(
        out.trim()
            .ends_with("\ndiscarded 1 dead letters (group welcome/unknown_kind)"),
        "{out}"
    );
    assert!(!db.row(a).await.dead && db.row(b).await.dead);
    let discarded_by: Option<String> = db
        .scalar("SELECT discarded_by FROM outbox_messages WHERE id = $1", c)
        .await;
    assert_eq!(discarded_by.as_deref(), Some("cli:carol"));

    let (ok, stats, _) = run(&["stats", "--json"]);
    assert!(ok);
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(
        (stats["pending"].as_i64(), stats["dead_letters"].as_i64()),
        (Some(1), Some(1))
    );
    let (ok, table, _) = run(&["stats"]);
    assert!(ok && table.contains("total"), "{table}");

    for (args, expected) in [
        (vec!["dead-letters", "retry"], "required"),
        (
            vec!["dead-letters", "retry", "--group", "nogroup"],
            "--group must be KIND/ERROR_CLASS",
        ),
        (
            vec!["dead-letters", "retry", "--all", "--kind", "k"],
            "cannot be used with",
        ),
        (vec!["dead-letters", "show", "999999"], "no message 999999"),
        (
            vec!["dead-letters", "retry", &a.to_string()],
            "is pending, not dead-lettered",
        ),
        (vec!["dead-letters", "list", "--limit", "0"], "--limit"),
    ] {
        let (ok, _, err) = run(&args);
        assert!(!ok, "{args:?} accepted");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn bad_admin_options_are_refused() {
    let db = TestDb::new().await;
    for (flags, expected) in [
        (vec!["--admin-token", "short"], "too short"),
        (
            vec!["--admin-listen", "127.0.0.1:9999"],
            "neither OUTBOXD_ADMIN_TOKEN nor OUTBOXD_ADMIN_READ_TOKEN is",
        ),
        (vec!["--retention", "a week"], "--retention"),
    ] {
        let output = outboxd()
            .args(["run", "--database-url", &db.url])
            .args(&flags)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

#[tokio::test]
async fn every_admin_response_carries_defensive_headers_and_the_page_a_strict_policy() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let auth = basic("ops", TOKEN);
    let page = get_with(&addr, "/admin", &auth).await;
    assert_eq!(page.status, 200);
    let policy = page.header("content-security-policy").unwrap().to_owned();
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("default-src 'none'"), "{policy}");
    let nonce = policy
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap();
    assert!(page.body.contains(&format!("<style nonce=\"{nonce}\">")));
    assert!(
        !page.body.contains("style=\""),
        "no inline style attributes"
    );
    let api = api_get(&addr, "/api/v1/stats").await;
    let refused = http_full(&addr, "GET", "/admin", &[], "").await.unwrap();
    for response in [&page, &api, &refused] {
        assert_eq!(response.header("cache-control"), Some("no-store"));
        assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(response.header("referrer-policy"), Some("same-origin"));
        assert_eq!(response.header("x-frame-options"), Some("DENY"));
        assert!(response.header("content-security-policy").is_some());
    }
    // A fresh nonce on every page.
    let again = get_with(&addr, "/admin", &auth).await;
    assert_ne!(
        again.header("content-security-policy"),
        Some(policy.as_str())
    );
}

#[tokio::test]
async fn a_cross_origin_post_or_another_actors_csrf_token_is_refused() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let id = dead_letter(&db, "invoice_notice", "smtp_550", "a@example.com").await;
    let csrf_of = |user: &'static str| {
        let addr = addr.clone();
        async move {
            let auth = basic(user, TOKEN);
            let page = get_with(&addr, "/admin", &auth).await;
            csrf_in(&page.body)
        }
    };
    let (ops, eve) = (csrf_of("ops").await, csrf_of("eve").await);
    assert_ne!(ops, eve, "tokens are bound to the actor");
    let post = |origin: Option<String>, csrf: String| {
        let addr = addr.clone();
        async move {
            let auth = basic("ops", TOKEN);
            let mut headers = vec![
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ];
            if let Some(origin) = &origin {
                headers.push(("Origin", origin.as_str()));
            }
            http_full(
                &addr,
                "POST",
                &format!("/admin/dead-letters/{id}/discard"),
                &headers,
                &format!("csrf={csrf}"),
            )
            .await
            .unwrap()
            .status
        }
    };
    let evil = Some("https://evil.example".to_owned());
    assert_eq!(post(evil, ops.clone()).await, 403);
    assert_eq!(post(Some("null".to_owned()), ops.clone()).await, 403);
    assert_eq!(post(None, eve).await, 403);
    assert!(db.row(id).await.dead, "nothing changed");
    assert_eq!(post(Some(format!("http://{addr}")), ops).await, 303);
}

#[tokio::test]
async fn control_characters_in_admin_input_are_a_bad_request_not_a_database_error() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let auth = basic("ops", TOKEN);
    let page = get_with(&addr, "/admin?kind=a%00b", &auth).await;
    assert_eq!(page.status, 400, "{}", page.body);
    let listed = api_get(&addr, "/api/v1/dead-letters?kind=a%00b").await;
    assert_eq!(listed.status, 400);
    let bulk = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/retry",
        Some(json!({"kind": "a\u{0}b"})),
    )
    .await;
    assert_eq!(bulk.status, 400);
    let group = api(
        &addr,
        "POST",
        "/api/v1/dead-letters/discard",
        Some(json!({"group": {"kind": "k", "error_class": "x\u{7}"}})),
    )
    .await;
    assert_eq!(group.status, 400);
}
