//! Through PgBouncer (Debian's `pgbouncer`), as production databases are often reached: in
//! transaction mode, where no session outlives a transaction (prepared statements and LISTEN
//! included), and in session mode with few server connections.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::{
    SmtpServer, TestDb, eventually, free_port, http_get, outboxd, poll_until, refusal_saying,
};

/// A PgBouncer of the test's own, on a port of its own, in front of the machine's
/// PostgreSQL, with `pool_size` server connections per database.
pub(crate) struct PgBouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    pub(crate) fn start(mode: &str, pool_size: u32) -> Self {
        let dir = tempfile::tempdir().expect("a directory for pgbouncer");
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").expect("users.txt");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port=5432\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 500\n\
                 unix_socket_dir =\nlogfile = {log}\n",
                users = users.display(),
                log = dir.path().join("pgbouncer.log").display(),
            ),
        )
        .expect("pgbouncer.ini");
        // PgBouncer refuses to run as root; `-u` drops to the server's own user.
        let mut command = Command::new("pgbouncer");
        if is_root() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer (Debian package `pgbouncer`)");
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    /// `db` through this PgBouncer.
    pub(crate) fn url(&self, db: &TestDb) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }

    pub(crate) async fn wait_until_up(&self) {
        let address = format!("127.0.0.1:{}", self.port);
        eventually(Duration::from_secs(20), "pgbouncer listening", || {
            let address = address.clone();
            async move { tokio::net::TcpStream::connect(&address).await.is_ok() }
        })
        .await;
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `outboxd run` against `database_url`, its log in a file the test reads at the end.
pub(crate) struct Running {
    child: Child,
    http: String,
    log: tempfile::NamedTempFile,
}

impl Running {
    pub(crate) async fn start(database_url: &str, envs: &[(&str, &str)]) -> Self {
        let http = format!("127.0.0.1:{}", free_port());
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let child = outboxd()
            .args(["run", "--database-url", database_url, "--listen", &http])
            // Only a notification, or the fallback poll, can make a commit leave in time.
            .env("OUTBOXD_POLL_INTERVAL", "60s")
            .env("OUTBOXD_FROM", "Acme <no-reply@acme.example>")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("the log file"))
            .spawn()
            .expect("start outboxd");
        let mut running = Self { child, http, log };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while http_get(&running.http, "/readyz").await.0 != 200 {
            let exited = running.child.try_wait().expect("wait");
            assert!(
                exited.is_none() && tokio::time::Instant::now() < deadline,
                "outboxd not ready ({exited:?}):\n{}",
                running.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        running
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = http_get(&self.http, "/metrics").await;
        body.lines()
            .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn enqueue_many(db: &TestDb, n: usize) {
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..n {
        sqlx::query(
            "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', $1)",
        )
        .bind(serde_json::json!({
            "to": format!("user{i}@example.com"),
            "name": format!("User {i}"),
            "verify_url": format!("https://app.example/v/{i}"),
        }))
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Every message arrived exactly once.
pub(crate) fn each_once(smtp: &SmtpServer, n: usize) {
    let ids: Vec<String> = smtp
        .messages()
        .iter()
        .filter_map(|m| m.header("X-Outbox-Id").map(str::to_owned))
        .collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), n, "{} messages for {n} rows", ids.len());
    assert_eq!(distinct.len(), n, "a message arrived twice");
}

/// One commit after the backlog: with a 60 s poll, it arrives in time only by a
/// notification or the fallback poll.
async fn one_more_arrives(db: &TestDb, smtp: &SmtpServer, after: usize, within: Duration) {
    db.enqueue(
        "account_verification",
        serde_json::json!({"to": "late@example.com", "name": "Late", "verify_url": "https://app.example/v/late"}),
    )
    .await;
    smtp.wait_for(after + 1, within).await;
}

/// A database behind a PgBouncer of its own, in `mode` with 4 server connections, and an
/// SMTP server. Bind them `Through { db, bouncer, smtp }`: locals drop in reverse, so the
/// pooler lets go of the database before it is dropped.
struct Through {
    smtp: SmtpServer,
    bouncer: PgBouncer,
    db: TestDb,
}

impl Through {
    async fn pooler(mode: &str) -> Self {
        let db = TestDb::new().await;
        let bouncer = PgBouncer::start(mode, 4);
        bouncer.wait_until_up().await;
        Self {
            smtp: SmtpServer::start(),
            bouncer,
            db,
        }
    }
}

/// 500 messages committed at once, then one more: each arrives once, the last through a
/// notification or the fallback poll (the poll interval is 60 s).
async fn each_of_501_arrives_once(db: &TestDb, smtp: &SmtpServer) {
    enqueue_many(db, 500).await;
    smtp.wait_for(500, Duration::from_secs(120)).await;
    one_more_arrives(db, smtp, 500, Duration::from_secs(20)).await;
    each_once(smtp, 501);
}

/// No error, and no warning but the one that says a transaction pooler is in the way.
pub(crate) fn no_error_lines(log: &str) {
    let errors: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(" ERROR ") || line.contains(" WARN "))
        .filter(|line| !line.contains("a transaction pooler is in the way"))
        .collect();
    assert!(errors.is_empty(), "error lines:\n{}", errors.join("\n"));
}

#[tokio::test]
async fn through_a_transaction_pooler_with_a_direct_listen_url_each_message_goes_once() {
    let Through { db, bouncer, smtp } = Through::pooler("transaction").await;
    let smtp_url = smtp.url();
    let outboxd = Running::start(
        &bouncer.url(&db),
        &[
            ("OUTBOXD_SMTP_URL", &smtp_url),
            ("OUTBOXD_LISTEN_DATABASE_URL", &db.url),
        ],
    )
    .await;
    each_of_501_arrives_once(&db, &smtp).await;
    assert_eq!(
        outboxd.metric("outbox_notifications_working").await,
        Some(1.0)
    );
    no_error_lines(&outboxd.log());
}

#[tokio::test]
async fn through_a_transaction_pooler_alone_notifications_are_missed_and_polling_takes_over() {
    let Through { db, bouncer, smtp } = Through::pooler("transaction").await;
    let smtp_url = smtp.url();
    let outboxd = Running::start(&bouncer.url(&db), &[("OUTBOXD_SMTP_URL", &smtp_url)]).await;
    let working = poll_until(
        Duration::from_secs(30),
        "the notification check",
        || async { outboxd.metric("outbox_notifications_working").await },
    )
    .await;
    assert_eq!(working, 0.0);
    each_of_501_arrives_once(&db, &smtp).await;
    let log = outboxd.log();
    no_error_lines(&log);
    let warned = log
        .lines()
        .filter(|line| line.contains("notifications do not come back"))
        .count();
    assert_eq!(warned, 1, "said once:\n{log}");
}

#[tokio::test]
async fn through_a_session_pooler_of_four_connections_a_budget_of_four_delivers_everything() {
    let Through { db, bouncer, smtp } = Through::pooler("session").await;
    let smtp_url = smtp.url();
    let outboxd = Running::start(
        &bouncer.url(&db),
        &[
            ("OUTBOXD_SMTP_URL", &smtp_url),
            ("OUTBOXD_DATABASE_MAX_CONNECTIONS", "4"),
        ],
    )
    .await;
    each_of_501_arrives_once(&db, &smtp).await;
    // Session mode keeps each connection's session: notifications work through it.
    assert_eq!(
        outboxd.metric("outbox_notifications_working").await,
        Some(1.0)
    );
    no_error_lines(&outboxd.log());
    // PgBouncer's four server connections were enough: outboxd's never numbered more.
    let servers: i64 = db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'outboxd'", &db.name).await;
    assert!((1..=4).contains(&servers), "{servers} server connections");
}

#[tokio::test]
async fn a_connection_budget_under_four_is_refused_with_one_line() {
    let output = outboxd()
        .args(["run", "--database-max-connections", "3"])
        .output()
        .expect("outboxd");
    let stderr = refusal_saying(&output, "OUTBOXD_DATABASE_MAX_CONNECTIONS is 3");
    assert!(
        stderr
            .starts_with("error: OUTBOXD_DATABASE_MAX_CONNECTIONS is 3: outboxd needs at least 4")
    );
}
