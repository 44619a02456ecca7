//! Pausing a kind: held on every replica and across restarts, sent on resume, out of the
//! lanes' gauges that page; and every request that cannot be meant refused, changing nothing.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::{TOKEN, api, basic, csrf_in};
use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, http_full, http_get, metric_value, outboxd, refusal,
};

const PAUSED: &str = "account_verification";
const FLOWING: &str = "workspace_invite";

async fn metric(replica: &Outboxd, series: &str) -> Option<f64> {
    metric_value(&http_get(&replica.http, "/metrics").await.1, series)
}

fn replica(db: &TestDb, smtp: &SmtpServer) -> impl Future<Output = Outboxd> {
    let (url, smtp_url) = (db.url.clone(), smtp.url());
    async move {
        let flags = [
            "--admin-token",
            TOKEN,
            "--sample-interval",
            "200ms",
            "--poll-interval",
            "200ms",
        ];
        Outboxd::sending_to(&url, &smtp_url, &flags, &[]).await
    }
}

#[tokio::test]
async fn a_paused_kind_is_held_on_every_replica_and_across_restarts_and_sent_on_resume() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let pause = outboxd()
        .args(["pause", "--database-url", &db.url, "--kind", PAUSED])
        .args(["--reason", "the template ships a broken link"])
        .output()
        .expect("outboxd pause");
    assert!(pause.status.success(), "{pause:?}");
    let (one, mut two) = (replica(&db, &smtp).await, replica(&db, &smtp).await);

    db.insert_many(PAUSED, 30).await;
    db.insert_many(FLOWING, 30).await;
    eventually(Duration::from_secs(30), "the other kind sent", || async {
        db.sent_of(FLOWING).await == 30
    })
    .await;
    assert_eq!(db.sent_of(PAUSED).await, 0, "a paused kind went out first");

    for replica in [&one, &two] {
        eventually(Duration::from_secs(10), "the pause exported", || async {
            let paused = format!("outbox_kind_paused{{kind=\"{PAUSED}\"}}");
            let ready = "outbox_lane_ready_messages{lane=\"transactional\"}";
            metric(replica, &paused).await == Some(1.0)
                && metric(replica, ready).await == Some(0.0)
                && metric(replica, "outbox_pending_messages").await == Some(30.0)
        })
        .await;
    }

    drop(two);
    two = replica(&db, &smtp).await;
    db.insert_many(FLOWING, 10).await;
    eventually(
        Duration::from_secs(30),
        "sent after the restart",
        || async { db.sent_of(FLOWING).await == 40 },
    )
    .await;
    assert_eq!(db.sent_of(PAUSED).await, 0, "the restarted replica sent it");

    let resumed = api(
        &two.http,
        "POST",
        &format!("/api/v1/kinds/{PAUSED}/resume"),
        None,
    )
    .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    eventually(Duration::from_secs(30), "the paused kind sent", || async {
        db.sent_of(PAUSED).await == 30
    })
    .await;
    eventually(Duration::from_secs(10), "the resume exported", || async {
        metric(&one, &format!("outbox_kind_paused{{kind=\"{PAUSED}\"}}")).await == Some(0.0)
    })
    .await;
    let audit: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT action, target, detail FROM outbox_admin_audit ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let reason = Some("the template ships a broken link".to_owned());
    assert_eq!(
        audit,
        [
            ("pause".to_owned(), PAUSED.to_owned(), reason),
            ("resume".to_owned(), PAUSED.to_owned(), None)
        ]
    );
}

#[tokio::test]
async fn pauses_are_listed_and_requests_that_cannot_be_meant_are_refused() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd_ = replica(&db, &smtp).await;
    let addr = &outboxd_.http;
    let pause = |kind: &str, body: Value| {
        let path = format!("/api/v1/kinds/{kind}/pause");
        async move { api(addr, "POST", &path, Some(body)).await }
    };
    for (kind, body) in [
        ("News", json!({"reason": "why"})),
        ("..", json!({"reason": "why"})),
        (PAUSED, json!({})),
        (PAUSED, json!({"reason": "  "})),
        (PAUSED, json!({"reason": "why", "until": "never"})),
        (PAUSED, json!({"reason": "x".repeat(501)})),
    ] {
        let refused = pause(kind, body.clone()).await;
        assert_eq!(refused.status, 400, "{kind} {body}: {}", refused.body);
    }
    let not_paused = api(
        addr,
        "POST",
        &format!("/api/v1/kinds/{PAUSED}/resume"),
        None,
    )
    .await;
    assert_eq!(not_paused.status, 404, "{}", not_paused.body);
    let listed = api(addr, "GET", "/api/v1/pauses", None).await;
    assert_eq!(listed.json(), json!({"pauses": []}));

    let paused = pause(PAUSED, json!({"reason": "campaign gone wrong"})).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    let listed = api(addr, "GET", "/api/v1/pauses", None).await.json();
    assert_eq!(listed["pauses"][0]["kind"], PAUSED);
    assert_eq!(listed["pauses"][0]["reason"], "campaign gone wrong");
    assert_eq!(listed["pauses"][0]["paused_by"], "api:alice");

    for args in [
        &["pause", "--kind", "Bad Kind", "--reason", "why"][..],
        &["pause", "--kind", FLOWING, "--reason", " "],
        &["resume", "--kind", "../x"],
    ] {
        let output = outboxd()
            .args(args)
            .args(["--database-url", &db.url])
            .output()
            .expect("outboxd");
        refusal(&output);
    }
    let output = outboxd()
        .args(["resume", "--kind", FLOWING, "--database-url", &db.url])
        .output()
        .expect("outboxd resume");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not paused"),
        "{output:?}"
    );
    let pauses: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_kind_pauses")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pauses, 1, "a refused request changed the pauses");
}

#[tokio::test]
async fn the_admin_page_pauses_and_resumes_a_kind() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd_ = replica(&db, &smtp).await;
    let addr = &outboxd_.http;
    let auth = basic("ops", TOKEN);
    let page = || async {
        http_full(addr, "GET", "/admin", &[("Authorization", &auth)], "")
            .await
            .unwrap()
            .body
    };
    let post = |path: &'static str, form: String| {
        let auth = auth.clone();
        async move {
            let origin = format!("http://{addr}");
            let headers = [
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Origin", origin.as_str()),
            ];
            http_full(addr, "POST", path, &headers, &form)
                .await
                .unwrap()
        }
    };
    let before = page().await;
    assert!(before.contains("No kind is paused"), "{before}");
    let csrf = csrf_in(&before);
    let paused = post(
        "/admin/kinds/pause",
        format!("csrf={csrf}&kind={PAUSED}&reason=broken+link"),
    )
    .await;
    assert_eq!(paused.status, 303, "{}", paused.body);
    let shown = page().await;
    assert!(
        shown.contains("id=\"pauses\"") && shown.contains("broken link"),
        "{shown}"
    );
    let resumed = post("/admin/kinds/resume", format!("csrf={csrf}&kind={PAUSED}")).await;
    assert_eq!(resumed.status, 303, "{}", resumed.body);
    assert!(page().await.contains("No kind is paused"));
}

/// What the automatic pause judges of `kind`: its latest 100 sends.
async fn recent_sends(db: &TestDb, kind: &str) -> outboxd::message::RecentSends {
    outboxd::store::pauses::recent_sends(&db.store, kind, 100, Duration::from_secs(5))
        .await
        .expect("the latest sends")
}

/// A replica that checks `FLOWING` for bounces, once `FLOWING` has paused itself: ten of
/// its first hundred invitations went to mailboxes that do not exist, 10% hard bounces.
async fn a_kind_paused_by_its_bounces(db: &TestDb, smtp: &SmtpServer) -> Outboxd {
    let (url, smtp_url) = (db.url.clone(), smtp.url());
    let flags = [
        "--sample-interval",
        "200ms",
        "--auto-pause-kinds",
        FLOWING,
        "--auto-pause-window",
        "100",
    ];
    let replica = Outboxd::sending_to(&url, &smtp_url, &flags, &[]).await;
    db.insert_many(FLOWING, 90).await;
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload) \
         SELECT $1, jsonb_build_object('to', 'unknown' || i || '@example.com', \
                'inviter_name', 'Ada', 'workspace_name', 'W', 'accept_url', 'u') \
         FROM generate_series(1, 10) AS i",
    )
    .bind(FLOWING)
    .execute(&db.pool)
    .await
    .unwrap();
    let auto_paused = format!("outbox_kind_auto_paused{{kind=\"{FLOWING}\"}}");
    eventually(
        Duration::from_secs(30),
        "the kind paused itself",
        || async { metric(&replica, &auto_paused).await == Some(1.0) },
    )
    .await;
    replica
}

#[tokio::test]
async fn a_kind_whose_recipients_bounce_pauses_itself_until_resumed_and_the_check_rearms() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let _replica = a_kind_paused_by_its_bounces(&db, &smtp).await;
    let (reason, by): (String, String) = db
        .one_row(
            "SELECT reason, paused_by FROM outbox_kind_pauses WHERE kind = $1",
            FLOWING,
        )
        .await;
    assert!(
        reason.contains("recipients who bounced hard were 10.00% of the last 100 sends"),
        "{reason}"
    );
    assert_eq!(by, "outboxd");
    // An operator discarding the dead letters does not hide the bounces from the check.
    let discard = outboxd()
        .args([
            "dead-letters",
            "--database-url",
            &db.url,
            "discard",
            "--kind",
            FLOWING,
        ])
        .output()
        .expect("outboxd dead-letters discard");
    assert!(discard.status.success(), "{discard:?}");
    let judged = recent_sends(&db, FLOWING).await;
    assert_eq!((judged.sends, judged.bounced_recipients), (100, 10));

    db.insert_many(FLOWING, 10).await;
    db.insert_many(PAUSED, 3).await;
    eventually(Duration::from_secs(30), "the other kind sent", || async {
        db.sent_of(PAUSED).await == 3
    })
    .await;
    assert_eq!(db.sent_of(FLOWING).await, 90, "a paused kind was sent");

    let resume = outboxd()
        .args(["resume", "--kind", FLOWING, "--database-url", &db.url])
        .output()
        .expect("outboxd resume");
    assert!(resume.status.success(), "{resume:?}");
    eventually(Duration::from_secs(30), "sent on resume", || async {
        db.sent_of(FLOWING).await == 100
    })
    .await;
    let judged = recent_sends(&db, FLOWING).await;
    assert_eq!(
        (judged.sends, judged.bounced_recipients),
        (10, 0),
        "the check judges only what was sent after the resume"
    );
}

#[tokio::test]
async fn a_resume_committed_while_the_check_judges_the_sends_before_it_stands() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let _replica = a_kind_paused_by_its_bounces(&db, &smtp).await;
    db.insert_many(FLOWING, 10).await;
    // Holding the audit log stops the resume between its delete of the pause and its audit
    // entry, while the check, still judging the bounces from before it, tries to pause the
    // kind again and waits on that delete.
    let mut hold = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_admin_audit IN SHARE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let resume = outboxd()
        .args(["resume", "--kind", FLOWING, "--database-url", &db.url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("outboxd resume");
    eventually(
        Duration::from_secs(30),
        "the check waits on the resume's delete",
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event = 'transactionid' \
                   AND query LIKE 'INSERT INTO outbox_kind_pauses%')",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    hold.commit().await.unwrap();
    let resume = resume.wait_with_output().expect("outboxd resume");
    assert!(resume.status.success(), "{resume:?}");

    eventually(Duration::from_secs(30), "sent on resume", || async {
        db.sent_of(FLOWING).await == 100
    })
    .await;
    let paused: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_kind_pauses")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        paused, 0,
        "the check paused the kind again on what the resume set aside"
    );
}

#[tokio::test]
async fn three_complaints_from_one_mailbox_are_one_voice_and_do_not_pause_a_kind() {
    let db = TestDb::new().await;
    // 500 sends; one outsider signed up three times with the same mailbox and marked each
    // email as spam: 0.6% of the sends, past the 0.5% threshold if counted by email.
    sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, dispatched_at, feedback) \
         SELECT $1, jsonb_build_object('to', CASE WHEN g <= 3 THEN 'Outsider@Example.com' \
                ELSE 'user' || g || '@example.com' END), now() - make_interval(secs => g), \
                CASE WHEN g <= 3 THEN 'complaint' END \
         FROM generate_series(1, 500) AS g",
    )
    .bind(FLOWING)
    .execute(&db.pool)
    .await
    .unwrap();
    let recent =
        outboxd::store::pauses::recent_sends(&db.store, FLOWING, 500, Duration::from_secs(5))
            .await
            .unwrap();
    assert_eq!((recent.sends, recent.complainers), (500, 1));
    let rule = outboxd::message::AutoPause {
        kinds: [outboxd_producer::Kind::parse(FLOWING).unwrap()].into(),
        hard_bounce_share: 0.10,
        complaint_share: 0.005,
        window: 500,
    };
    assert_eq!(rule.breach(&recent), None);
}

#[test]
fn a_kind_exempt_from_the_automatic_pause_cannot_be_listed_for_it() {
    // account_verification is exempt by default: sign-ups must not stop for everyone
    // because one outsider complained.
    let output = outboxd()
        .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
        .args(["--auto-pause-kinds", "account_verification,newsletter"])
        .output()
        .expect("outboxd run");
    let refusal = crate::helpers::refusal(&output);
    assert!(
        refusal.contains("account_verification is in both OUTBOXD_AUTO_PAUSE_KINDS and OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS"),
        "{refusal}"
    );
}

#[test]
fn automatic_pause_settings_that_cannot_be_meant_are_refused() {
    for bad in [
        &["--auto-pause-kinds", "Bad Kind"][..],
        &["--auto-pause-hard-bounce-rate", "0%"],
        &["--auto-pause-complaint-rate", "150%"],
        &["--auto-pause-window", "5"],
    ] {
        let output = outboxd()
            .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
            .args(bad)
            .output()
            .expect("outboxd run");
        assert!(!output.status.success(), "{bad:?} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(bad[0]), "{bad:?}: {stderr}");
    }
}
