//! Exposure: the unauthenticated HTTP port on the open internet, what reaches the logs, and
//! readiness that tells whether outboxd can do its work.

use outboxd::store::{AUTO_PAUSE_RIGHTS, RUN_RIGHTS, Rights};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::{
    Dispatching, Outboxd, Scenario, SmtpServer, TestDb, eventually, http_get, outboxd, poll_until,
    refusal_saying, verification,
};

/// Open file descriptors of a process.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// This process's soft limit on open files.
fn file_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(1024)
}

#[tokio::test]
async fn thousands_of_half_open_connections_leave_the_probes_metrics_and_delivery_working() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    // Half send nothing, half the start of a request head they never finish. 3 000 where
    // this process may open that many files; always well past outboxd's cap of 256.
    let connections = 3000.min(file_limit().saturating_sub(600)).max(500);
    let mut held = Vec::new();
    for i in 0..connections {
        let mut stream = TcpStream::connect(&outboxd.http).await.unwrap();
        if i % 2 == 0 {
            stream
                .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        held.push(stream);
    }
    for path in ["/livez", "/metrics", "/readyz"] {
        eventually(Duration::from_secs(30), path, || async {
            http_get(&outboxd.http, path).await.0 == 200
        })
        .await;
    }
    // Connections past the cap are accepted and closed: on a loaded machine a burst of
    // them may still be open for a moment, so the count is waited for, not sampled.
    let pid = outboxd.child.id();
    let files = crate::helpers::poll_until(
        Duration::from_secs(10),
        "outboxd under 400 files",
        || async {
            let files = open_files(pid);
            (files < 400).then_some(files)
        },
    )
    .await;
    assert!(files < 400);
    db.verification_to("through@example.com").await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    drop(held);
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let db = TestDb::new().await;
    let outboxd = Outboxd::start(&db.url, &[], &[]).await;
    let mut stream = TcpStream::connect(&outboxd.http).await.unwrap();
    stream.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
    let mut buffer = Vec::new();
    // The server closes it after its header timeout; the read ends instead of hanging.
    let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut buffer))
        .await
        .expect("the connection is closed");
    assert!(read.is_ok() || buffer.is_empty());
}

#[tokio::test]
async fn a_readyz_flood_with_the_database_stuck_cannot_take_the_dispatchers_connections() {
    let Scenario { db, smtp, app } = Scenario::new(&[]).await;
    let mut app = app;
    let http = app.http_addr().to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let _background = app.spawn_background(stop.clone());
    // Readiness reads the migrations table: lock it, so that every check hangs.
    let lock = db.lock_table("outbox_schema_migrations").await;
    let flood: Vec<_> = (0..50)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    http_get(&http, "/readyz").await;
                }
            })
        })
        .collect();
    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    db.verification_to("flood@example.com").await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    let (status, body) = http_get(&http, "/readyz?verbose").await;
    assert_eq!(status, 503, "{body}");
    lock.rollback().await.unwrap();
    for task in flood {
        task.await.unwrap();
    }
    running.stop().await;
    stop.cancel();
}

#[tokio::test]
async fn no_recipient_address_reaches_the_logs() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd = Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &["--max-attempts", "1", "--poll-interval", "100ms"],
        &[("RUST_LOG", "info,outboxd=debug")],
    )
    .await;
    // The server quotes the address in its 550 and 451 replies.
    db.enqueue(
        "account_verification",
        verification("reject-hush1@example.com"),
    )
    .await;
    db.enqueue(
        "account_verification",
        verification("defer-hush2@example.com"),
    )
    .await;
    db.verification_to("hush3@@example.com").await;
    db.verification_to("hush4@example.com").await;
    eventually(Duration::from_secs(30), "every row ends", || async {
        db.count("dead").await == 3 && db.count("dispatched").await == 1
    })
    .await;
    outboxd.sigterm();
    let (status, logs) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{logs}");
    assert!(logs.contains("dead-lettered"), "{logs}");
    for secret in ["hush1", "hush2", "hush3", "hush4"] {
        assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
    }
}

/// What a ready replica is then seen to do with the role's rights.
#[derive(Clone, Copy)]
enum Work<'a> {
    None,
    /// Dispatch a message (to the log: no SMTP is set).
    Deliver,
    /// Dispatch a message, and pause this kind, whose latest sends bounced.
    DeliverAndPause(&'a str),
}

/// `/readyz?verbose` of `outboxd run` on `url` with `flags`; when ready, the `work` done.
async fn readiness_of(db: &TestDb, url: &str, flags: &[&str], work: Work<'_>) -> (u16, String) {
    let http = format!("127.0.0.1:{}", crate::helpers::free_port());
    let mut child = outboxd()
        .args(["run", "--database-url", url, "--listen", &http])
        .args(flags)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (status, body) = poll_until(Duration::from_secs(30), "/readyz to answer", || async {
        let (status, body) = http_get(&http, "/readyz?verbose").await;
        (status == 200 || status == 503).then_some((status, body))
    })
    .await;
    if status == 200 && !matches!(work, Work::None) {
        let id = db
            .enqueue(
                "account_verification",
                serde_json::json!({"to": "a@example.com", "name": "A", "verify_url": "https://app.example/v"}),
            )
            .await;
        poll_until(
            Duration::from_secs(30),
            "the message ended (only logged: no SMTP server)",
            || async {
                let ended: bool = sqlx::query_scalar(
                    "SELECT end_reason = 'logged_only' FROM outbox_messages WHERE id = $1",
                )
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap_or(false);
                ended.then_some(())
            },
        )
        .await;
    }
    if let (200, Work::DeliverAndPause(kind)) = (status, work) {
        poll_until(Duration::from_secs(30), "the kind paused", || async {
            let paused: Option<bool> =
                sqlx::query_scalar("SELECT automatic FROM outbox_kind_pauses WHERE kind = $1")
                    .bind(kind)
                    .fetch_optional(&db.pool)
                    .await
                    .unwrap();
            paused.filter(|automatic| *automatic)
        })
        .await;
    }
    let _ = child.kill();
    let _ = child.wait();
    (status, body)
}

#[tokio::test]
async fn readiness_names_each_right_the_role_lacks() {
    let db = TestDb::new().await;
    let (role, url) = db
        .role(
            "short",
            "CREATE ROLE {role} LOGIN; \
             GRANT SELECT ON outbox_schema_migrations TO {role}; \
             REVOKE EXECUTE ON FUNCTION outbox_on_the_calendar(timestamptz) FROM PUBLIC; \
             REVOKE EXECUTE ON FUNCTION outbox_recipient_keys(jsonb) FROM PUBLIC; \
             REVOKE EXECUTE ON FUNCTION outbox_single_recipient_key(jsonb) FROM PUBLIC; \
             REVOKE EXECUTE ON FUNCTION outbox_masked(jsonb, text[]) FROM PUBLIC; \
             REVOKE EXECUTE ON FUNCTION outbox_secret_fields_of(text, text[]) FROM PUBLIC",
        )
        .await;
    let grant = |right: &outboxd::store::Right, verb: &str| {
        let what = if right.is_function { "FUNCTION " } else { "" };
        let (verb, to) = match verb {
            "GRANT" => ("GRANT", "TO"),
            _ => ("REVOKE", "FROM"),
        };
        format!(
            "{verb} {} ON {what}{} {to} {role}",
            right.privilege, right.object
        )
    };
    // Without the automatic pause, `run` needs RUN_RIGHTS; with it, AUTO_PAUSE_RIGHTS too,
    // and with them it pauses a kind whose latest hundred sends all bounced.
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, next_attempt_at, dispatched_at, feedback) \
         SELECT 'invoice_notice', jsonb_build_object('to', 'b' || g || '@example.com'), now(), \
                now(), 'hard_bounce' FROM generate_series(1, 100) AS g",
    )
    .await;
    let auto_pause: &[&str] = &[
        "--auto-pause-kinds",
        "invoice_notice",
        "--auto-pause-window",
        "100",
    ];
    for (flags, rights, each, work) in [
        (&[][..], Rights::default(), RUN_RIGHTS, Work::Deliver),
        (
            auto_pause,
            Rights {
                auto_pause: true,
                ..Rights::default()
            },
            AUTO_PAUSE_RIGHTS,
            Work::DeliverAndPause("invoice_notice"),
        ),
    ] {
        let all: Vec<String> = rights.iter().map(|r| grant(r, "GRANT")).collect();
        db.exec(all.join("; ")).await;
        // With every right, ready; without any one of them, not, and that one is named.
        for right in [None].into_iter().chain(each.iter().map(Some)) {
            if let Some(right) = right {
                db.exec(grant(right, "REVOKE")).await;
            }
            let work = if right.is_none() { work } else { Work::None };
            let (status, body) = readiness_of(&db, &url, flags, work).await;
            let Some(right) = right else {
                assert_eq!(status, 200, "{body}");
                continue;
            };
            assert_eq!(status, 503, "{body}");
            let says = format!(
                "[-]writable failed: the role {role} may not {} {}",
                right.privilege, right.object
            );
            assert!(body.contains(&says), "{says}:\n{body}");
            assert!(body.contains("[+]schema ok"), "{body}");
            db.exec(grant(right, "GRANT")).await;
        }
    }
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}

#[tokio::test]
async fn readiness_fails_when_the_table_is_dropped_or_the_database_is_read_only() {
    let db = TestDb::new().await;
    let outboxd = Outboxd::start(&db.url, &[], &[]).await;
    db.set_default("default_transaction_read_only", Some("on"))
        .await;
    // Pooled connections keep their setting; a new outboxd sees a read-only database.
    let fresh = Outboxd::start_unready(&db.url, &[], &[]);
    let body = poll_until(Duration::from_secs(30), "read-only readiness", || async {
        let (status, body) = http_get(&fresh.http, "/readyz?verbose").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("[-]writable failed: the database is read-only"),
        "{body}"
    );
    db.set_default("default_transaction_read_only", None).await;

    db.exec("DROP TABLE outbox_messages").await;
    let body = poll_until(
        Duration::from_secs(30),
        "dropped-table readiness",
        || async {
            let (status, body) = http_get(&outboxd.http, "/readyz?verbose").await;
            (status == 503).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains(
            "[-]schema failed: the migrations are recorded but the table outbox_messages is missing"
        ),
        "{body}"
    );
}

#[test]
fn a_database_url_that_is_not_postgresql_is_refused() {
    for command in ["run", "migrate", "stats"] {
        let output = outboxd()
            .args([command, "--database-url", "mysql://root@127.0.0.1/app"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.starts_with("error: invalid --database-url")
                && stderr.contains("outboxd needs PostgreSQL"),
            "{command}: {stderr}"
        );
    }
}

#[tokio::test]
async fn run_starts_on_a_newer_schema_that_leaves_it_able_to_run_and_says_so() {
    let db = TestDb::new().await;
    db.exec(FUTURE_MIGRATION).await;
    let running = Outboxd::start(&db.url, &[], &[]).await;
    assert!(
        running.stderr_so_far().contains(
            "the outbox schema is newer than this outboxd: running beside a newer release"
        ),
        "{}",
        running.stderr_so_far()
    );
}

#[tokio::test]
async fn run_refuses_a_newer_schema_that_runs_only_newer_releases() {
    let db = TestDb::new().await;
    db.exec(FUTURE_MIGRATION).await;
    db.exec("UPDATE outbox_installation SET runs_from_schema = 99990101000000")
        .await;
    let output = outboxd()
        .args(["run", "--database-url", &db.url, "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    refusal_saying(
        &output,
        "the outbox schema is at version 99990101000000, newer than this outboxd knows",
    );
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("runs only releases that know version 99990101000000: run a newer outboxd")
    );
}

/// A migration of a release from the future, recorded as `outboxd migrate` records one.
const FUTURE_MIGRATION: &str = "INSERT INTO outbox_schema_migrations \
     (version, description, success, checksum, execution_time) \
     VALUES (99990101000000, 'from the future', true, '\\x00', 0)";

#[tokio::test]
async fn an_applications_role_with_insert_alone_enqueues_though_it_may_execute_no_function_of_outboxd()
 {
    let db = TestDb::new().await;
    let (role, url) = db
        .role(
            "app",
            "CREATE ROLE {role} LOGIN; \
             GRANT INSERT ON outbox_messages TO {role}; \
             REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC",
        )
        .await;
    // The partial indexes' predicates are prepared at every insert: none may call a
    // function the application's role has no right to.
    let app = sqlx::PgPool::connect(&url).await.unwrap();
    let inserted = sqlx::query(
        "INSERT INTO outbox_messages (kind, payload) \
         VALUES ('account_verification', '{\"to\": \"ann@example.com\", \"cc\": [\"bo@example.com\"]}')",
    )
    .execute(&app)
    .await;
    // Tags too: the trigger that keeps them runs as its owner, and checks with built-ins.
    let tagged = sqlx::query(
        "INSERT INTO outbox_messages (kind, payload, tags)          VALUES ('account_verification', '{\"to\": \"cy@example.com\"}', ARRAY['tenant:7'])",
    )
    .execute(&app)
    .await;
    app.close().await;
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
    assert_eq!(
        inserted.expect("the application's insert").rows_affected(),
        1
    );
    assert_eq!(tagged.expect("the tagged insert").rows_affected(), 1);
    let kept: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_message_tags WHERE tag = $1",
            "tenant:7",
        )
        .await;
    assert_eq!(kept, 1);
}
