//! outboxd's objects in a schema of their own (`OUTBOXD_SCHEMA`), beside an application's
//! tables in `public`, and reached as production often reaches them: through PgBouncer in
//! transaction mode, where no `search_path` a session sets survives its transaction.

use std::time::Duration;

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, http_get, outboxd, poll_until, refusal_saying, verification,
};
use crate::poolers::{PgBouncer, Running, each_once, no_error_lines};

pub(crate) const SCHEMA: &str = "mail";

/// Runs an `outboxd` subcommand in the schema; its stdout, after asserting it succeeded.
pub(crate) fn in_schema(database_url: &str, args: &[&str]) -> String {
    let output = outboxd()
        .args(args)
        .args(["--database-url", database_url])
        .env("OUTBOXD_SCHEMA", SCHEMA)
        .output()
        .expect("outboxd");
    assert!(
        output.status.success(),
        "outboxd {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// outboxd's relations and functions in `schema`.
async fn objects_in(db: &TestDb, schema: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace($1) \
                   AND relname LIKE 'outbox\\_%') \
              + (SELECT count(*) FROM pg_proc WHERE pronamespace = to_regnamespace($1) \
                   AND proname LIKE 'outbox\\_%')",
    )
    .bind(schema)
    .fetch_one(&db.pool)
    .await
    .expect("the catalog")
}

#[tokio::test]
async fn in_a_schema_of_its_own_through_a_transaction_pooler_everything_outboxd_does_works() {
    let db = TestDb::empty().await;
    let bouncer = PgBouncer::start("transaction", 4);
    bouncer.wait_until_up().await;
    let smtp = SmtpServer::start();
    in_schema(&db.url, &["migrate"]);
    assert_eq!(
        objects_in(&db, "public").await,
        0,
        "nothing of outboxd's in public"
    );
    assert!(
        objects_in(&db, SCHEMA).await > 10,
        "outboxd's objects in {SCHEMA}"
    );

    let smtp_url = smtp.url();
    let pooled = bouncer.url(&db);
    let outboxd = Running::start(
        &pooled,
        &[
            ("OUTBOXD_SMTP_URL", &smtp_url),
            ("OUTBOXD_SCHEMA", SCHEMA),
            ("OUTBOXD_LISTEN_DATABASE_URL", &db.url),
            // The shared pace lives in a table of the schema too.
            ("OUTBOXD_RATE_LIMIT", "1000/s"),
        ],
    )
    .await;
    // Producers name the schema; one kind has no template and is dead-lettered.
    db.exec(
        "INSERT INTO mail.outbox_messages (kind, payload) \
         SELECT 'account_verification', jsonb_build_object('to', 'user' || i || '@example.com', \
                'name', 'User', 'verify_url', 'https://app.example/v/' || i) \
         FROM generate_series(1, 200) AS i",
    )
    .await;
    let payload = verification("nobody@example.com").to_string();
    let unknown = in_schema(
        &pooled,
        &["enqueue", "--kind", "no_such_kind", "--payload", &payload],
    );
    smtp.wait_for(200, Duration::from_secs(60)).await;
    each_once(&smtp, 200);

    let unknown: i64 = unknown.trim().parse().expect("enqueue prints the id");
    let dead = poll_until(Duration::from_secs(30), "the dead letter", || async {
        let listed: serde_json::Value =
            serde_json::from_str(&in_schema(&pooled, &["dead-letters", "list", "--json"]))
                .expect("JSON");
        (listed.to_string().contains(&format!("\"id\":{unknown}"))).then_some(listed)
    })
    .await;
    assert!(dead.to_string().contains("no_such_kind"), "{dead}");
    in_schema(&pooled, &["dead-letters", "retry", &unknown.to_string()]);

    // The suppression list is the schema's: an address on it is not mailed.
    in_schema(&pooled, &["suppressions", "add", "blocked@example.com"]);
    let payload = verification("blocked@example.com").to_string();
    let blocked = in_schema(
        &pooled,
        &[
            "enqueue",
            "--kind",
            "account_verification",
            "--payload",
            &payload,
        ],
    );
    let blocked: i64 = blocked.trim().parse().expect("enqueue prints the id");
    let ended_by: String = poll_until(
        Duration::from_secs(30),
        "the suppressed row ended",
        || async {
            db.scalar(
                "SELECT discarded_by FROM mail.outbox_messages WHERE id = $1",
                blocked,
            )
            .await
        },
    )
    .await;
    assert_eq!(ended_by, "outboxd");
    each_once(&smtp, 200);

    // The recipient lookup reads the schema's indexes and functions.
    let found = in_schema(
        &pooled,
        &["messages", "--recipient", "User7@example.com", "--json"],
    );
    assert!(found.contains("user7@example.com"), "{found}");
    let stats = in_schema(&pooled, &["stats", "--json"]);
    assert!(stats.contains("account_verification"), "{stats}");
    assert_eq!(
        objects_in(&db, "public").await,
        0,
        "still nothing in public"
    );
    let log = outboxd.log();
    let others: Vec<&str> = log
        .lines()
        .filter(|line| !line.contains(&format!("dead-lettered outbox.id={unknown} ")))
        .collect();
    no_error_lines(&others.join("\n"));
}

#[tokio::test]
async fn a_schema_name_outboxd_cannot_use_is_refused_with_one_line() {
    for name in ["Mail", "mail;drop", "pg_mail"] {
        let output = outboxd()
            .args(["migrate"])
            .env("OUTBOXD_SCHEMA", name)
            .output()
            .expect("outboxd");
        let stderr = refusal_saying(&output, "invalid OUTBOXD_SCHEMA: ");
        assert!(stderr.starts_with("error: invalid OUTBOXD_SCHEMA: "));
    }
}

#[tokio::test]
async fn a_role_without_usage_on_the_schema_is_refused_at_start_and_told_why() {
    let db = TestDb::empty().await;
    in_schema(&db.url, &["migrate"]);
    let role = format!("mailer_{}", &db.name[db.name.len() - 8..]);
    let grants: Vec<String> = outboxd::store::RUN_RIGHTS
        .iter()
        .map(|right| {
            let what = if right.is_function { "FUNCTION " } else { "" };
            format!(
                "GRANT {} ON {what}{SCHEMA}.{} TO {role}",
                right.privilege, right.object
            )
        })
        .collect();
    db.exec(format!(
        "CREATE ROLE {role} LOGIN; GRANT SELECT ON {SCHEMA}.outbox_schema_migrations TO {role}; {}",
        grants.join("; ")
    ))
    .await;
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let envs = [("OUTBOXD_SCHEMA", SCHEMA)];
    let (status, stderr) = Outboxd::start_unready(&url, &[], &envs).wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        stderr.contains("error: ") && stderr.contains("permission denied for schema mail"),
        "{stderr}"
    );
    db.exec(format!("GRANT USAGE ON SCHEMA {SCHEMA} TO {role}"))
        .await;
    let outboxd = Outboxd::start(&url, &[], &envs).await;
    assert_eq!(http_get(&outboxd.http, "/readyz").await.0, 200);
    drop(outboxd);
    db.exec(format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}

#[tokio::test]
async fn migrate_in_a_schema_through_a_transaction_pooler_is_refused_with_one_line() {
    let db = TestDb::empty().await;
    let bouncer = PgBouncer::start("transaction", 4);
    bouncer.wait_until_up().await;
    let output = outboxd()
        .args(["migrate", "--database-url", &bouncer.url(&db)])
        .env("OUTBOXD_SCHEMA", SCHEMA)
        .output()
        .expect("outboxd");
    refusal_saying(
        &output,
        "a transaction pooler is in the way of DATABASE_URL",
    );
    assert_eq!(objects_in(&db, SCHEMA).await, 0, "nothing was created");
}

#[tokio::test]
async fn a_schema_made_by_a_dba_is_migrated_by_its_owner_without_create_on_the_database() {
    let db = TestDb::empty().await;
    let role = format!("migrator_{}", &db.name[db.name.len() - 8..]);
    db.exec(format!(
        "CREATE ROLE {role} LOGIN; CREATE SCHEMA {SCHEMA} AUTHORIZATION {role}"
    ))
    .await;
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    in_schema(&url, &["migrate"]);
    assert!(objects_in(&db, SCHEMA).await > 10);
    db.exec(format!(
        "DROP SCHEMA {SCHEMA} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"
    ))
    .await;
}
