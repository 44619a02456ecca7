//! A database of its own for each test, copied from a migrated template, on the machine's
//! server or the one a test names.

use std::time::Duration;

use sqlx::{Connection as _, PgPool, Row};

use super::*;

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
            .enqueue(&self.pool, outboxd::NewMessage::new(kind, payload).unwrap())
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

    /// Waits until message `id` is sent or ended; its `end_reason` (none once sent) and
    /// `last_error`, which says why it ended.
    pub async fn ended(&self, id: i64) -> (Option<String>, Option<String>) {
        let what = format!("message {id} sent or ended");
        let row = poll_until(Duration::from_secs(30), &what, || async {
            let row = self.row(id).await;
            (row.dispatched || row.end_reason.is_some()).then_some(row)
        })
        .await;
        (row.end_reason, row.last_error)
    }

    pub async fn row(&self, id: i64) -> RowState {
        let row = sqlx::query(
            "SELECT attempts, last_error, dispatched_at IS NOT NULL AS dispatched, \
                    dead_lettered_at IS NOT NULL AS dead, locked_by, \
                    next_attempt_at > now() AS waiting, end_reason \
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
            end_reason: row.get("end_reason"),
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
    /// Why the message ended unsent (`suppressed`, `cancelled`, ...), if it did.
    pub end_reason: Option<String>,
}
