//! outboxd's schema in an application's database that runs sqlx migrations of its own:
//! each side keeps its own record of what it applied.

use std::path::Path;

use sqlx::migrate::Migrator;

use std::time::Duration;

use crate::helpers::succeeds;
use crate::helpers::{Outboxd, SmtpServer, TestDb, outboxd, verification};

/// The application's migrations: a directory of sqlx migrations, one file each.
async fn app_migrations(dir: &Path, files: &[(&str, &str)]) -> Migrator {
    for (name, sql) in files {
        std::fs::write(dir.join(name), sql).expect("a migration file");
    }
    Migrator::new(dir)
        .await
        .expect("the application's migrations")
}

fn outboxd_migrate(db: &TestDb) {
    succeeds(
        outboxd().args(["migrate", "--database-url", &db.url]),
        "outboxd migrate",
    );
}

async fn versions(db: &TestDb, table: &str) -> Vec<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} ORDER BY version"
    )))
    .fetch_all(&db.pool)
    .await
    .expect("the versions")
}

/// outboxd's first `n` migrations, recorded where `outboxd migrate` records them.
fn ours_up_to(n: usize) -> Migrator {
    let mut migrator = Migrator {
        migrations: outboxd::store::MIGRATOR.migrations[..n].to_vec().into(),
        ..Migrator::DEFAULT
    };
    migrator.dangerous_set_table_name(outboxd::store::MIGRATIONS_TABLE);
    migrator
}

/// Applies outboxd's migrations up to the one described as `description`, not included;
/// its index.
async fn migrated_up_to(db: &TestDb, description: &str) -> usize {
    let index = outboxd::store::MIGRATOR
        .iter()
        .position(|m| m.description.contains(description))
        .unwrap_or_else(|| panic!("no migration {description:?}"));
    ours_up_to(index)
        .run(&db.pool)
        .await
        .expect("the migrations before it");
    index
}

/// Migrates `db` up to the migration described as `description`, then runs that one while
/// an application's migration holds all of `outbox_messages` (ACCESS EXCLUSIVE, as a long
/// ALTER would), and checks it did not wait on it; its index.
async fn beside_a_held_outbox_table(db: &TestDb, description: &str) -> usize {
    let index = migrated_up_to(db, description).await;
    let mut held = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), ours_up_to(index + 1).run(&db.pool))
        .await
        .expect("the migration waited on the outbox table")
        .unwrap_or_else(|e| panic!("the {description} migration: {e}"));
    held.rollback().await.unwrap();
    index
}

/// Leaves an application's insert uncommitted, runs `outboxd migrate` on `db` (migrated up
/// to `applied`), and checks that it gave up on its lock timeout with nothing changed; the
/// open transaction, for the caller to end.
async fn refused_behind_an_open_insert(
    db: &TestDb,
    applied: usize,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut open = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO outbox_messages (kind, payload) VALUES ('welcome', '{}')")
        .execute(&mut *open)
        .await
        .unwrap();
    let refused = outboxd()
        .args(["migrate", "--database-url", &db.url])
        .output()
        .expect("outboxd migrate");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("lock timeout"),
        "{said}"
    );
    assert_eq!(
        versions(db, "outbox_schema_migrations").await.len(),
        applied,
        "nothing changed"
    );
    open
}

/// Ends the insert held `open`, then migrates: every migration applied, and
/// `outbox_messages` still in the file it had (no rewrite).
async fn migrates_once_it_ends_without_rewriting(
    db: &TestDb,
    open: sqlx::Transaction<'static, sqlx::Postgres>,
) {
    open.commit().await.unwrap();
    let file = "SELECT relfilenode::bigint FROM pg_class WHERE relname = $1";
    let before: i64 = db.scalar(file, "outbox_messages").await;
    outboxd_migrate(db);
    assert_eq!(versions(db, "outbox_schema_migrations").await, ours());
    let after: i64 = db.scalar(file, "outbox_messages").await;
    assert_eq!(before, after, "the table was not rewritten");
}

fn ours() -> Vec<i64> {
    outboxd::store::MIGRATOR.iter().map(|m| m.version).collect()
}

#[tokio::test]
async fn an_applications_own_sqlx_migrations_before_and_after_outboxd_migrate_keep_working() {
    let db = TestDb::empty().await;
    let dir = tempfile::tempdir().unwrap();
    let first = app_migrations(
        dir.path(),
        &[("1_users.sql", "CREATE TABLE app_users (id int)")],
    )
    .await;
    first
        .run(&db.pool)
        .await
        .expect("the application migrates first");
    outboxd_migrate(&db);
    let both = app_migrations(
        dir.path(),
        &[("2_orders.sql", "CREATE TABLE app_orders (id int)")],
    )
    .await;
    both.run(&db.pool)
        .await
        .expect("the application migrates after outboxd");
    // Each side records only its own.
    assert_eq!(versions(&db, "_sqlx_migrations").await, [1, 2]);
    assert_eq!(versions(&db, "outbox_schema_migrations").await, ours());
    // And `run` is not put off by the application's migrations, nor `migrate` again.
    outboxd_migrate(&db);
    let running = Outboxd::start(&db.url, &[], &[]).await;
    drop(running);
}

#[tokio::test]
pub(crate) async fn a_database_an_older_outboxd_migrated_is_carried_over_to_its_own_table() {
    let db = TestDb::empty().await;
    // What outboxd 0.2 did: its migrations recorded in sqlx's default table.
    let older = Migrator {
        migrations: outboxd::store::MIGRATOR.migrations.clone(),
        ..Migrator::DEFAULT
    };
    older.run(&db.pool).await.expect("the older migration");
    outboxd_migrate(&db);
    assert_eq!(versions(&db, "outbox_schema_migrations").await, ours());
    let same: bool = sqlx::query_scalar(
        "SELECT bool_and(o.checksum = s.checksum AND o.success AND s.success) \
         FROM outbox_schema_migrations o JOIN _sqlx_migrations s USING (version)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(same, "copied as they were");
    // Left where they were: older replicas read them during a rolling upgrade.
    assert_eq!(versions(&db, "_sqlx_migrations").await, ours());
    let running = Outboxd::start(&db.url, &[], &[]).await;
    let (status, _) = crate::helpers::http_get(&running.http, "/readyz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
pub(crate) async fn rows_written_under_the_first_schema_are_delivered_after_migrate() {
    let db = TestDb::empty().await;
    // outboxd 0.1's schema, as its first migration left it, with rows of each state in it.
    let first = Migrator {
        migrations: outboxd::store::MIGRATOR.migrations[..1].to_vec().into(),
        ..Migrator::DEFAULT
    };
    first.run(&db.pool).await.expect("the first migration");
    sqlx::query(
        "INSERT INTO outbox_messages \
             (kind, payload, attempts, last_error, dispatched_at, dead_lettered_at) VALUES \
         ('account_verification', $1, 0, NULL, NULL, NULL), \
         ('account_verification', $2, 0, NULL, NULL, NULL), \
         ('account_verification', $3, 0, NULL, now() - interval '1 day', NULL), \
         ('account_verification', $4, 8, '550 no such user', NULL, now())",
    )
    .bind(verification("pending1@example.com"))
    .bind(verification("pending2@example.com"))
    .bind(verification("sent@example.com"))
    .bind(verification("dead@example.com"))
    .execute(&db.pool)
    .await
    .unwrap();

    outboxd_migrate(&db);
    assert_eq!(versions(&db, "outbox_schema_migrations").await, ours());

    let smtp = SmtpServer::start();
    let running = Outboxd::start(
        &db.url,
        &[
            "--smtp-url",
            &smtp.url(),
            "--from",
            "Example <noreply@example.com>",
        ],
        &[],
    )
    .await;
    let mut sent: Vec<String> = smtp
        .wait_for(2, Duration::from_secs(30))
        .await
        .into_iter()
        .flat_map(|m| m.rcpt_tos)
        .collect();
    sent.sort();
    assert_eq!(sent, ["pending1@example.com", "pending2@example.com"]);
    // The rows already finished stay as they were: shown, never sent again. The outcomes
    // of the two sent are written just after the server took them.
    let dead = crate::helpers::poll_until(Duration::from_secs(30), "both outcomes", || async {
        let (dispatched, dead): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL), \
                    count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) FROM outbox_messages",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (dispatched == 3).then_some(dead)
    })
    .await;
    assert_eq!(dead, 1);
    assert_eq!(smtp.messages().len(), 2, "nothing finished was sent again");
    let (status, body) = crate::helpers::http_get(&running.http, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("outbox_dead_letter_messages 1"), "{body}");
}

#[tokio::test]
async fn the_installation_tag_migration_runs_while_an_application_holds_the_outbox_table() {
    let db = TestDb::empty().await;
    let tag_migration = beside_a_held_outbox_table(&db, "installation tag").await;
    assert_eq!(
        versions(&db, "outbox_schema_migrations").await.len(),
        tag_migration + 1
    );
    assert_eq!(db.installation_tag().await.len(), 10);
}

#[tokio::test]
async fn the_runs_from_schema_migration_runs_while_an_application_holds_the_outbox_table() {
    let db = TestDb::empty().await;
    beside_a_held_outbox_table(&db, "runs from schema").await;
    let runs_from: Option<i64> =
        sqlx::query_scalar("SELECT runs_from_schema FROM outbox_installation")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(runs_from, None, "every migration so far is additive");
}

#[tokio::test]
async fn the_lane_suppressions_migration_runs_while_an_application_holds_the_suppression_list() {
    let db = TestDb::empty().await;
    let lanes_migration = migrated_up_to(&db, "lane suppressions").await;
    // Someone holds the whole list, as a long ALTER or an operator's bulk edit would.
    let held = db.lock_table("outbox_suppressions").await;
    let with_lanes = ours_up_to(lanes_migration + 1);
    tokio::time::timeout(Duration::from_secs(30), with_lanes.run(&db.pool))
        .await
        .expect("the migration waited on the suppression list")
        .expect("the lane suppressions migration");
    held.rollback().await.unwrap();
    let lanes: i64 = db
        .scalar(
            "SELECT count(*) FROM pg_class WHERE relname = $1",
            "outbox_lane_suppressions",
        )
        .await;
    assert_eq!(lanes, 1);
}

#[tokio::test]
async fn the_lane_suppressions_migration_gives_each_role_its_rights_on_the_list() {
    let db = TestDb::empty().await;
    let lanes_migration = migrated_up_to(&db, "lane suppressions").await;
    let (role, _) = db
        .role(
            "lanes",
            "CREATE ROLE {role} LOGIN; GRANT SELECT, INSERT ON outbox_suppressions TO {role}",
        )
        .await;
    ours_up_to(lanes_migration + 1)
        .run(&db.pool)
        .await
        .expect("the lane suppressions migration");
    let held: Vec<String> = db
        .scalar(
            "SELECT ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p \
             WHERE has_table_privilege($1, 'outbox_lane_suppressions', p))",
            role.clone(),
        )
        .await;
    assert_eq!(
        held,
        ["SELECT", "INSERT"],
        "the rights it had on the list, no more"
    );
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}

#[tokio::test]
async fn the_logged_only_migration_gives_up_behind_an_open_insert_and_goes_through_after() {
    let db = TestDb::empty().await;
    let logged_only = migrated_up_to(&db, "logged only").await;
    let started = std::time::Instant::now();
    let open = refused_behind_an_open_insert(&db, logged_only).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it waited {:?}",
        started.elapsed()
    );
    open.commit().await.unwrap();
    outboxd_migrate(&db);
    assert_eq!(versions(&db, "outbox_schema_migrations").await, ours());
}

#[tokio::test]
async fn the_tags_migration_gives_up_behind_an_open_insert_and_goes_through_after() {
    let db = TestDb::empty().await;
    let before_tags = migrated_up_to(&db, "message tags").await;
    let open = refused_behind_an_open_insert(&db, before_tags).await;
    migrates_once_it_ends_without_rewriting(&db, open).await;
}

#[tokio::test]
async fn the_cancel_migration_gives_up_behind_an_open_insert_and_rewrites_nothing() {
    let db = TestDb::empty().await;
    let before_cancel = migrated_up_to(&db, "cancel").await;
    let open = refused_behind_an_open_insert(&db, before_cancel).await;
    migrates_once_it_ends_without_rewriting(&db, open).await;
    // PUBLIC may not run the functions: an application's role is granted them.
    let public: bool = db
        .scalar(
            "SELECT has_function_privilege('public', $1, 'EXECUTE')",
            "outbox_cancel(text, text)",
        )
        .await;
    assert!(!public);
}

#[tokio::test]
async fn the_callbacks_migration_runs_while_an_application_holds_the_outbox_table() {
    let db = TestDb::empty().await;
    let callbacks_migration = migrated_up_to(&db, "callbacks").await;
    // A role that records outcomes, as the book grants it before this migration.
    let role = format!("recorder_{}", std::process::id());
    db.exec(format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT UPDATE ON outbox_messages TO {role}; \
         GRANT SELECT, INSERT, DELETE ON outbox_message_events TO {role}"
    ))
    .await;
    let held = db.lock_table("outbox_messages").await;
    let with_callbacks = ours_up_to(callbacks_migration + 1);
    tokio::time::timeout(Duration::from_secs(30), with_callbacks.run(&db.pool))
        .await
        .expect("the migration waited on the outbox table")
        .expect("the callbacks migration");
    held.rollback().await.unwrap();
    let rights: (bool, bool, bool, bool) = sqlx::query_as(
        "SELECT has_table_privilege($1, 'outbox_callbacks', 'INSERT'), \
                has_table_privilege($1, 'outbox_callbacks', 'UPDATE'), \
                has_table_privilege($1, 'outbox_callbacks', 'DELETE'), \
                has_column_privilege($1, 'outbox_installation', 'callbacks', 'UPDATE')",
    )
    .bind(&role)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rights, (true, true, true, true));
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}

#[tokio::test]
async fn the_secret_fields_migration_gives_up_behind_an_open_insert_and_rewrites_nothing() {
    let db = TestDb::empty().await;
    let before = migrated_up_to(&db, "secret fields").await;
    // A role that records outcomes, as the book grants it before this migration.
    let role = format!("scrubber_{}", std::process::id());
    db.exec(format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; GRANT UPDATE ON outbox_messages TO {role}"
    ))
    .await;
    let open = refused_behind_an_open_insert(&db, before).await;
    migrates_once_it_ends_without_rewriting(&db, open).await;
    // Whoever records outcomes writes the kinds' policies at start; everyone reads them.
    let rights: (bool, bool, bool, bool) = sqlx::query_as(
        "SELECT has_table_privilege($1, 'outbox_kind_policies', 'INSERT'), \
                has_table_privilege($1, 'outbox_kind_policies', 'UPDATE'), \
                has_table_privilege($1, 'outbox_kind_policies', 'DELETE'), \
                has_table_privilege('public', 'outbox_kind_policies', 'SELECT')",
    )
    .bind(&role)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rights, (true, true, true, true));
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}
