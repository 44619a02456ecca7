use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use outboxd::telemetry::metrics::{self, MetricType};

use crate::helpers::succeeds;
use crate::helpers::{
    Dispatching, Outboxd, SmtpServer, TestDb, app, eventually, free_port, http_get, metric_value,
    poll_until, until_ready, verification,
};

fn manifest(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A real Prometheus scraping the given targets every second, with outboxd's alert rules.
struct Prometheus {
    addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(target: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rules = manifest("alerts/outboxd.rules.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\n\
             scrape_configs:\n  - job_name: outboxd\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (Debian package `prometheus`)");
        let this = Self {
            addr,
            child,
            _dir: dir,
        };
        until_ready(&this.addr, "/-/ready", "prometheus ready").await;
        this
    }

    /// An instant query's result vector.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let encoded: String = url::form_urlencoded::byte_serialize(expr.as_bytes()).collect();
        let (status, body) = http_get(&self.addr, &format!("/api/v1/query?query={encoded}")).await;
        assert_eq!(status, 200, "{expr}: {body}");
        let response: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(response["status"], "success", "{expr}: {body}");
        response["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The single value of a query that returns one series.
    async fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).await;
        let value = result.first()?["value"][1].as_str()?;
        value.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn prometheus_sees_what_the_database_holds_and_every_dashboard_query_returns_data() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let outboxd = Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &["--sample-interval", "1s"],
        &[
            ("OUTBOXD_RETRY_BACKOFF", "1h"),
            ("OUTBOXD_RETRY_BACKOFF_MAX", "2h"),
        ],
    )
    .await;
    let prometheus = Prometheus::start(&outboxd.http).await;
    eventually(Duration::from_secs(30), "first scrape", || async {
        prometheus.value(r#"up{job="outboxd"}"#).await == Some(1.0)
    })
    .await;

    // Some sent, some failing, one dead letter.
    for i in 0..5 {
        db.enqueue(
            "account_verification",
            verification(&format!("ok{i}@example.com")),
        )
        .await;
    }
    db.verification_to("defer1@example.com").await;
    db.enqueue(
        "workspace_invite",
        json!({"to": "defer2@example.com", "inviter_name": "A",
        "workspace_name": "W", "accept_url": "u"}),
    )
    .await;
    db.enqueue("invoice_notice", json!({"to": "reject@example.com", "customer_name": "C",
        "invoice_number": "1", "amount": "1", "currency": "EUR", "due_date": "d", "invoice_url": "u"}))
        .await;
    eventually(Duration::from_secs(30), "the scenario settles in the table", || async {
        db.count("dispatched").await == 5 && db.count("dead").await == 1
            && sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_messages WHERE attempts = 1 AND dead_lettered_at IS NULL")
                .fetch_one(&db.pool).await.unwrap() == 2
    })
    .await;

    let expected = [
        ("outbox_pending_messages", db.count("pending").await as f64),
        ("outbox_dead_letter_messages", db.count("dead").await as f64),
        (
            r#"sum(outbox_messages_sent_total{delivery="smtp"})"#,
            db.count("dispatched").await as f64,
        ),
        (r#"sum(outbox_send_failures_total{class="transient"})"#, 2.0),
        (r#"sum(outbox_send_failures_total{class="permanent"})"#, 1.0),
        (
            r#"sum(outbox_messages_dead_lettered_total{kind="invoice_notice",class="permanent"})"#,
            1.0,
        ),
        ("outbox_ready", 1.0),
        ("outbox_smtp_circuit_open", 0.0),
        (r#"outbox_build_info{smtp_enabled="true"}"#, 1.0),
    ];
    for (expr, want) in expected {
        eventually(Duration::from_secs(30), expr, || async {
            prometheus.value(expr).await == Some(want)
        })
        .await;
    }
    assert!(
        prometheus
            .value("outbox_oldest_pending_age_seconds")
            .await
            .unwrap()
            > 0.0
    );
    assert_eq!(
        prometheus.value("outbox_oldest_ready_age_seconds").await,
        Some(0.0)
    );
    let sent_by_kind = prometheus
        .query(r#"outbox_messages_sent_total{kind="account_verification",delivery="smtp"}"#)
        .await;
    assert_eq!(sent_by_kind[0]["value"][1], "5");

    // Every panel's query, with the dashboard's variables filled in, returns data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(manifest("dashboards/outboxd-overview.json")).unwrap(),
    )
    .unwrap();
    let mut queries = BTreeMap::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$job", "outboxd")
                .replace("$instance", ".*");
            queries.insert(expr, panel["title"].as_str().unwrap().to_owned());
        }
    }
    // A rate needs two scrapes after the scenario: give Prometheus a few seconds.
    for (expr, title) in queries {
        eventually(
            Duration::from_secs(20),
            &format!("data for panel {title:?}: {expr}"),
            || async { !prometheus.query(&expr).await.is_empty() },
        )
        .await;
    }
}

#[tokio::test]
async fn livez_fails_when_the_dispatch_loop_makes_no_progress_and_recovers_when_it_does() {
    let db = TestDb::new().await;
    let mut app = app(
        &db,
        None,
        &[
            "--poll-interval",
            "50ms",
            "--lease",
            "400ms",
            "--smtp-timeout",
            "100ms",
        ],
    )
    .await;
    let http = app.http_addr().to_string();
    let stop = tokio_util::sync::CancellationToken::new();
    let _background = app.spawn_background(stop.clone());
    app.metrics.cycle_completed();
    assert_eq!(http_get(&http, "/livez").await.0, 200);

    // Nobody runs the loop: past its bound (3 polls + lease + timeout) it is not live.
    let body = poll_until(Duration::from_secs(10), "/livez to fail", || async {
        let (status, body) = http_get(&http, "/livez").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("dispatch loop has made no progress"),
        "{body}"
    );
    // Readiness is about dependencies, not progress.
    assert_eq!(http_get(&http, "/readyz").await.0, 200);

    let running = Dispatching::start(app.dispatcher, &app.shutdown);
    eventually(Duration::from_secs(10), "live again", || async {
        http_get(&http, "/livez").await.0 == 200
    })
    .await;
    running.stop().await;
    stop.cancel();
}

#[tokio::test]
async fn readyz_explains_each_check_and_turns_false_first_on_sigterm() {
    let db = TestDb::new().await;
    let hole = crate::helpers::BlackHole::start().await;
    let id = db.verification_to("a@example.com").await;
    let outboxd = Outboxd::sending_to(
        &db.url,
        &hole.url(),
        &[
            "--smtp-timeout",
            "30s",
            "--lease",
            "2m",
            "--shutdown-timeout",
            "3s",
        ],
        &[],
    )
    .await;
    let (status, body) = http_get(&outboxd.http, "/readyz?verbose").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "[+]database ok\n[+]schema ok\n[+]writable ok\n[+]shutdown ok\nok\n"
    );
    assert_eq!(
        http_get(&outboxd.http, "/readyz").await,
        (200, "ok\n".to_owned())
    );
    // In flight once it has connected (the server never greets): the process cannot end
    // before the shutdown bound, so readiness is seen turning false while it is still up.
    eventually(Duration::from_secs(30), "a send in flight", || async {
        hole.accepted() > 0
    })
    .await;

    outboxd.sigterm();
    // The signal reaches the process a moment after kill(1) returns.
    let body = poll_until(Duration::from_secs(5), "readiness turns false", || async {
        let (status, body) = http_get(&outboxd.http, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("[-]shutdown failed: shutting down"), "{body}");
    assert_eq!(http_get(&outboxd.http, "/livez").await.0, 200);
    let (status, stderr) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(db.row(id).await.locked_by.is_none());
}

/// A sample held up (here by a table lock; in production by a transaction left open for
/// hours, whose dead entries the gauges walk) neither makes the replica unready nor stays
/// running: readiness has a connection of its own, and the server cancels a sample that
/// outlasts its interval. Before, the two shared one connection, and readiness timed out
/// behind the sample.
#[tokio::test]
async fn a_sample_held_up_in_the_database_neither_blocks_readiness_nor_keeps_running() {
    let db = TestDb::new().await;
    let outboxd = Outboxd::start(&db.url, &["--sample-interval", "1s"], &[]).await;
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(60),
        "three samples cancelled, readiness answering throughout",
        || async {
            let (status, body) = http_get(&outboxd.http, "/readyz?verbose").await;
            assert_eq!(status, 200, "{body}");
            metric_value(
                &http_get(&outboxd.http, "/metrics").await.1,
                r#"outbox_database_errors_total{operation="sample"}"#,
            )
            .is_some_and(|failures| failures >= 3.0)
        },
    )
    .await;
    let stuck: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
           AND pid <> pg_backend_pid() AND query LIKE '%AS oldest_ready_age%' \
           AND state = 'active' AND now() - query_start > interval '3 seconds'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(stuck, 0, "a sample left waiting on the lock");
    lock.rollback().await.unwrap();
    let series = "outbox_last_sample_timestamp_seconds";
    let before = metric_value(&http_get(&outboxd.http, "/metrics").await.1, series);
    eventually(Duration::from_secs(30), "sampling again", || async {
        metric_value(&http_get(&outboxd.http, "/metrics").await.1, series) > before
    })
    .await;
}

#[tokio::test]
async fn metrics_follow_prometheus_conventions() {
    let db = TestDb::new().await;
    // With a relay: its gauge and counter are each relay's.
    let smtp = SmtpServer::start();
    let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &[], &[]).await;
    // The database gauges appear with the sampler's first sample, not before.
    let body = poll_until(Duration::from_secs(10), "the first sample", || async {
        let (status, body) = http_get(&outboxd.http, "/metrics").await;
        assert_eq!(status, 200);
        body.contains("\noutbox_last_sample_timestamp_seconds ")
            .then_some(body)
    })
    .await;
    let page = std::fs::read_to_string(manifest("docs/src/metrics.md")).unwrap();
    for metric in metrics::ALL {
        let name = metric.name;
        let (type_name, suffix_ok) = match metric.metric_type {
            MetricType::Counter => ("counter", name.ends_with("_total")),
            MetricType::Gauge => ("gauge", !name.ends_with("_total")),
            MetricType::Histogram => ("histogram", !name.ends_with("_total")),
        };
        assert!(
            suffix_ok,
            "{name}: counters, and only counters, end in _total"
        );
        if metric.unit.is_some() {
            assert!(
                name.ends_with("_seconds"),
                "{name}: seconds are a base unit"
            );
        }
        // Histograms appear with their first observation.
        if metric.metric_type != MetricType::Histogram {
            assert!(
                body.lines().any(|l| l.starts_with(name)),
                "{name} missing:\n{body}"
            );
            assert!(
                body.contains(&format!("# TYPE {name} {type_name}\n")),
                "{name} is not a {type_name}:\n{body}"
            );
        }
        assert!(
            body.contains(&format!("# HELP {name} {}", metric.help)),
            "{name} has no HELP:\n{body}"
        );
        assert!(
            page.contains(name),
            "docs/src/metrics.md does not document {name}"
        );
    }
    // The page's table of label values lists every value of the labels outboxd defines.
    let values_of = |label: &str| {
        page.lines()
            .find(|line| line.starts_with(&format!("| `{label}` |")))
            .unwrap_or_else(|| panic!("docs/src/metrics.md has no row for `{label}`"))
            .to_owned()
    };
    let defined = [
        (
            "operation",
            metrics::DatabaseOperation::ALL.map(|o| o.as_str()).to_vec(),
        ),
        (
            "task",
            metrics::BackgroundTask::ALL.map(|t| t.as_str()).to_vec(),
        ),
        (
            "result",
            metrics::WebhookResult::ALL.map(|r| r.as_str()).to_vec(),
        ),
        (
            "result",
            metrics::LookupResult::ALL.map(|r| r.as_str()).to_vec(),
        ),
    ];
    for (label, values) in defined {
        let row = values_of(label);
        for value in values {
            assert!(
                row.contains(&format!("`{value}`")),
                "docs/src/metrics.md's `{label}` row lacks `{value}`: {row}"
            );
        }
    }
    assert!(
        body.contains(&format!(
            r#"outbox_build_info{{version="{}",smtp_enabled="true"}} 1"#,
            env!("CARGO_PKG_VERSION")
        )),
        "{body}"
    );
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(name.starts_with("outbox_"), "{line}");
    }
    // Counters exist at 0 from the start, for every kind and class, so rates have data.
    assert!(
        body.contains(r#"outbox_send_failures_total{kind="workspace_invite",class="permanent"} 0"#),
        "{body}"
    );
}

#[tokio::test]
async fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    succeeds(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(manifest("alerts/outboxd.rules.yml")),
        "promtool (Debian package `prometheus`)",
    );
    // The delivery objective's scenarios span days, evaluated every 5 minutes: a file of their own.
    let test_files = [
        manifest("tests/alerts/outboxd.rules.test.yml"),
        manifest("tests/alerts/slo.rules.test.yml"),
    ];
    succeeds(
        Command::new("promtool")
            .args(["test", "rules"])
            .args(&test_files),
        "promtool test rules",
    );
    // Every rule is in the runbook, and carries what a mixin's rule carries.
    let rules =
        alert_names(&std::fs::read_to_string(manifest("alerts/outboxd.rules.yml")).unwrap());
    assert!(rules.len() >= 11, "{rules:?}");
    let runbook = std::fs::read_to_string(manifest("alerts/RUNBOOK.md")).unwrap();
    for name in &rules {
        assert!(
            runbook.contains(&format!("\n## {name}\n")),
            "{name} has no runbook section"
        );
    }
    let test_file: String = test_files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for name in &rules {
        let fires = test_file.split("- eval_time:").any(|case| {
            case.contains(&format!("alertname: {name}\n")) && !case.contains("exp_alerts: []")
        });
        assert!(fires, "{name} is never shown firing");
    }
}

/// The alert names in the rule file (each `- alert: Name` line).
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_alertmanager_example_pages_for_critical_and_tickets_warnings() {
    let config = manifest("alerts/alertmanager.example.yml");
    let checked = succeeds(
        Command::new("amtool").arg("check-config").arg(&config),
        "amtool (Debian package `prometheus-alertmanager`)",
    );
    assert!(checked.contains("2 inhibit rules"));
    for (labels, receiver) in [
        (
            ["severity=critical", "alertname=OutboxDispatcherStalled"],
            "pager",
        ),
        (
            ["severity=critical", "alertname=OutboxDispatcherDown"],
            "pager",
        ),
        (
            ["severity=warning", "alertname=OutboxDeadLetters"],
            "ticket",
        ),
    ] {
        let routed = Command::new("amtool")
            .args(["config", "routes", "test"])
            .arg(format!("--config.file={}", config.display()))
            .args(labels)
            .output()
            .unwrap();
        assert!(routed.status.success());
        assert_eq!(
            String::from_utf8_lossy(&routed.stdout).trim(),
            receiver,
            "{labels:?}"
        );
    }
}

#[test]
fn the_dashboard_follows_the_dashboard_linter_rules() {
    let text = std::fs::read_to_string(manifest("dashboards/outboxd-overview.json")).unwrap();
    assert!(
        !text.contains("__inputs") && !text.contains("${DS_"),
        "breaks file provisioning"
    );
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dashboard["uid"], "outboxd-overview");
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "job", "instance"]);
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            !panel["description"].as_str().unwrap_or("").is_empty(),
            "{title} has no description"
        );
        assert!(
            panel["fieldConfig"]["defaults"]["unit"].is_string(),
            "{title} has no unit"
        );
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            assert!(
                expr.contains(r#"job=~"$job""#) && expr.contains(r#"instance=~"$instance""#),
                "{title}: {expr}"
            );
            if expr.contains("rate(") {
                assert!(expr.contains("[$__rate_interval]"), "{title}: {expr}");
            }
        }
    }
    let provisioning = std::fs::read_to_string(manifest("dashboards/provisioning.yaml")).unwrap();
    assert!(provisioning.contains("type: file"));
}

#[tokio::test]
async fn readiness_follows_a_database_restart_while_liveness_stays_up() {
    let cluster = crate::helpers::PrivateCluster::start();
    let url = cluster.url("outboxd");
    succeeds(
        crate::helpers::outboxd().args(["migrate", "--create-database", "--database-url", &url]),
        "outboxd migrate",
    );
    let smtp = SmtpServer::start();
    let outboxd = Outboxd::sending_to(
        &url,
        &smtp.url(),
        &["--poll-interval", "1s", "--sample-interval", "1s"],
        &[],
    )
    .await;
    assert_eq!(http_get(&outboxd.http, "/livez").await.0, 200);

    cluster.stop();
    eventually(Duration::from_secs(30), "readyz turns 503", || async {
        http_get(&outboxd.http, "/readyz").await.0 == 503
    })
    .await;
    let (_, body) = http_get(&outboxd.http, "/readyz?verbose").await;
    assert!(body.contains("[-]database failed"), "{body}");
    assert!(body.contains("[+]shutdown ok"), "{body}");
    // The loop fails a cycle on the database (a claim may wait out the pool's 10 s acquire
    // timeout first): liveness must not follow it.
    eventually(
        Duration::from_secs(60),
        "a claim failing on the database",
        || async {
            metric_value(
                &http_get(&outboxd.http, "/metrics").await.1,
                r#"outbox_database_errors_total{operation="claim"}"#,
            )
            .is_some_and(|failures| failures >= 1.0)
        },
    )
    .await;
    assert_eq!(http_get(&outboxd.http, "/livez").await.0, 200);
    let (_, metrics) = http_get(&outboxd.http, "/metrics").await;
    assert!(metrics.contains("outbox_ready 0"), "{metrics}");

    cluster.resume();
    eventually(
        Duration::from_secs(60),
        "readyz turns 200 again",
        || async { http_get(&outboxd.http, "/readyz").await.0 == 200 },
    )
    .await;
    assert_eq!(http_get(&outboxd.http, "/livez").await.0, 200);
    // And the same process delivers again, without a restart.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    outboxd_producer::enqueue(
        &pool,
        outboxd::NewMessage::new("account_verification", verification("back@example.com")).unwrap(),
    )
    .await
    .unwrap();
    smtp.wait_for(1, Duration::from_secs(30)).await;
    pool.close().await;
    outboxd.sigterm();
    let (status, stderr) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
}

/// An OTLP/HTTP receiver that keeps every request body it is sent.
async fn otlp_receiver() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = received.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(socket);
                loop {
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    sink.lock().unwrap().push(body);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if reader.get_mut().write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, received)
}

// Multi-threaded: the receiver must keep answering while the test blocks waiting for exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_and_link_to_the_request_that_enqueued_the_email() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (port, received) = otlp_receiver().await;
    // What a .NET producer writes: Activity.Current.Id is a W3C traceparent.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    sqlx::query("INSERT INTO outbox_messages (kind, payload, traceparent) VALUES ($1, $2, $3)")
        .bind("account_verification")
        .bind(verification("traced@example.com"))
        .bind(format!("00-{trace_id}-b7ad6b7169203331-01"))
        .execute(&db.pool)
        .await
        .unwrap();
    let outboxd = exporting_to(
        &db,
        &smtp,
        port,
        ("OTEL_SERVICE_NAME", "outboxd-under-test"),
    )
    .await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    outboxd.sigterm();
    let (status, stderr) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("exporting traces over OTLP"), "{stderr}");

    let body = received.lock().unwrap().concat();
    let contains = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    assert!(!body.is_empty(), "nothing was exported");
    for text in [
        "outboxd-under-test",
        "send account_verification",
        "process outbox_messages",
        "messaging.operation.type",
        "messaging.message.id",
    ] {
        assert!(
            contains(text.as_bytes()),
            "no {text:?} in the exported spans"
        );
    }
    let trace_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    assert!(
        contains(&trace_bytes),
        "the send span does not link to the producer's trace"
    );
}

/// The OTLP metrics a receiver got, decoded as a collector decodes them: each metric's
/// name, unit and the attribute sets of its data points.
fn otlp_metrics(bodies: &[Vec<u8>]) -> BTreeMap<String, (String, Vec<BTreeMap<String, String>>)> {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    use prost::Message as _;
    let mut metrics = BTreeMap::new();
    for body in bodies {
        let Ok(request) = ExportMetricsServiceRequest::decode(body.as_slice()) else {
            continue; // a span export
        };
        for metric in request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
        {
            let attributes = match &metric.data {
                Some(Data::Sum(sum)) => sum.data_points.iter().map(|p| &p.attributes).collect(),
                Some(Data::Gauge(gauge)) => {
                    gauge.data_points.iter().map(|p| &p.attributes).collect()
                }
                Some(Data::Histogram(h)) => h.data_points.iter().map(|p| &p.attributes).collect(),
                _ => Vec::new(),
            };
            let points = attributes
                .into_iter()
                .map(|attributes| {
                    attributes
                        .iter()
                        .map(|kv| {
                            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(Any::StringValue(s)) => s.clone(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), value)
                        })
                        .collect()
                })
                .collect();
            metrics.insert(metric.name.clone(), (metric.unit.clone(), points));
        }
    }
    metrics
}

// Multi-threaded: the receiver must keep answering while the test blocks waiting for exit.
/// outboxd exporting over OTLP to the receiver on `port`, with one more variable.
async fn exporting_to(db: &TestDb, smtp: &SmtpServer, port: u16, also: (&str, &str)) -> Outboxd {
    let endpoint = format!("http://127.0.0.1:{port}");
    let envs = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), also];
    Outboxd::sending_to(&db.url, &smtp.url(), &[], &envs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exported_over_otlp_with_the_names_units_and_labels_of_metrics() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (port, received) = otlp_receiver().await;
    let outboxd = exporting_to(&db, &smtp, port, ("OTEL_METRIC_EXPORT_INTERVAL", "500")).await;
    db.store
        .enqueue(
            &db.pool,
            outboxd::NewMessage::new("account_verification", verification("otlp@example.com"))
                .unwrap(),
        )
        .await
        .unwrap();
    smtp.wait_for(1, Duration::from_secs(30)).await;
    let histogram = metrics::DELIVERY_LATENCY;
    eventually(
        Duration::from_secs(30),
        "the send's latency exported",
        || async { otlp_metrics(&received.lock().unwrap()).contains_key(histogram) },
    )
    .await;
    outboxd.sigterm();
    let (status, stderr) = outboxd.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("exporting metrics over OTLP"), "{stderr}");

    let exported = otlp_metrics(&received.lock().unwrap());
    for metric in metrics::ALL {
        // Histograms appear with their first observation, in OTLP as in Prometheus.
        if metric.metric_type == MetricType::Histogram && metric.name != histogram {
            continue;
        }
        let Some((unit, _)) = exported.get(metric.name) else {
            panic!("{} was not exported: {:?}", metric.name, exported.keys());
        };
        let expected = if metric.unit.is_some() { "s" } else { "" };
        assert_eq!(unit, expected, "{}", metric.name);
    }
    let (_, points) = &exported[histogram];
    assert!(
        points
            .iter()
            .any(
                |labels| labels.get("kind").map(String::as_str) == Some("account_verification")
                    && labels.get("lane").map(String::as_str) == Some("transactional")
            ),
        "{points:?}"
    );
}

#[tokio::test]
async fn enqueue_records_the_callers_trace_context() {
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use tracing::Instrument as _;
    use tracing::instrument::WithSubscriber as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    let db = TestDb::new().await;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let pool = db.pool.clone();
    let (id, trace_id) = async move {
        let span = tracing::info_span!("POST /signup");
        let trace_id = span.context().span().span_context().trace_id();
        let id = outboxd_producer::enqueue(
            &pool,
            outboxd::NewMessage::new("account_verification", verification("a@example.com"))
                .unwrap(),
        )
        .instrument(span)
        .await
        .unwrap();
        (id, trace_id)
    }
    .with_subscriber(subscriber)
    .await;
    let traceparent: Option<String> = db
        .scalar("SELECT traceparent FROM outbox_messages WHERE id = $1", id)
        .await;
    let traceparent = traceparent.expect("a traceparent");
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "{traceparent}"
    );

    // Without a trace there is nothing to record.
    let untraced = db.verification_to("b@example.com").await;
    let none: Option<String> = db
        .scalar(
            "SELECT traceparent FROM outbox_messages WHERE id = $1",
            untraced,
        )
        .await;
    assert_eq!(none, None);
}

/// Prometheus's own linter reads a live `/metrics` after traffic of every kind: sends,
/// retries, dead letters, suppressions, expiries, cancels, callbacks, lookups.
#[tokio::test]
async fn promtool_finds_nothing_to_say_of_a_live_metrics_page() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let receiver = crate::helpers::CallbackReceiver::start();
    let url = receiver.url();
    let outboxd = Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &[
            "--callback-url",
            &url,
            "--sample-interval",
            "200ms",
            "--admin-token",
            crate::admin::TOKEN,
        ],
        &[("OUTBOXD_CALLBACK_SECRET", crate::helpers::CALLBACK_SECRET)],
    )
    .await;
    db.exec(
        "INSERT INTO outbox_suppressions (address, reason, source) VALUES ('gone@example.com', 'manual', 'operator')",
    )
    .await;
    for to in [
        "ada@example.com",
        "reject-1@example.com",
        "gone@example.com",
        "defer-1@example.com",
    ] {
        db.verification_to(to).await;
    }
    db.exec(
        "INSERT INTO outbox_messages (kind, payload, expires_at) \
         VALUES ('account_verification', '{\"to\": \"late@example.com\", \"name\": \"L\", \"verify_url\": \"u\"}', now() - interval '1 minute'); \
         INSERT INTO outbox_messages (kind, payload, idempotency_key, not_before) \
         VALUES ('account_verification', '{\"to\": \"cy@example.com\", \"name\": \"C\", \"verify_url\": \"u\"}', 'later', now() + interval '1 hour')",
    )
    .await;
    let cancelled: String = db.scalar("SELECT outbox_cancel($1)", "later").await;
    assert_eq!(cancelled, "cancelled");
    crate::admin::api(
        &outboxd.http,
        "GET",
        "/api/v1/messages?recipient=ada@example.com",
        None,
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "every kind of outcome recorded",
        || async {
            db.count("dispatched").await >= 1
                && db.count("dead").await >= 1
                && db.count("expired").await == 1
                && db
                    .scalar::<i64, _>(
                        "SELECT count(*) FROM outbox_messages WHERE end_reason = $1",
                        "suppressed",
                    )
                    .await
                    == 1
        },
    )
    .await;
    // The recorder's counters and the sampler's gauges have caught up.
    eventually(Duration::from_secs(10), "the counters read", || async {
        let (_, body) = http_get(&outboxd.http, "/metrics").await;
        body.contains("outbox_messages_cancelled_total")
            && body.contains("outbox_callbacks_pending")
    })
    .await;
    let (status, body) = http_get(&outboxd.http, "/metrics").await;
    assert_eq!(status, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`)");
    std::io::Write::write_all(&mut promtool.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let output = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.trim().is_empty(),
        "promtool says:\n{said}"
    );
}
