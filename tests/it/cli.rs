use std::process::{Child, Output, Stdio};
use std::time::Duration;

use clap::CommandFactory as _;
use outboxd::cli::Cli;
use serde_json::json;

use crate::helpers::{BlackHole, SmtpServer, TestDb, assert_refused, eventually, outboxd};

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn sigterm(child: &Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for `child` to exit while reading its output: a child whose piped output
/// nobody reads blocks once the pipe is full (64 KiB), and debug logs fill it.
fn wait_with_timeout(child: Child, within: Duration) -> Output {
    let pid = child.id().to_string();
    let (exited, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || exited.send(child.wait_with_output()));
    match output.recv_timeout(within) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
            panic!("outboxd did not exit within {within:?} of being asked to");
        }
    }
}

#[tokio::test]
async fn bad_options_are_refused_with_a_clear_error() {
    let db = TestDb::new().await;
    let cases: &[(&[&str], &str)] = &[
        (&["--batch-size", "0"], "--batch-size"),
        (&["--batch-size", "many"], "--batch-size"),
        (
            &["--poll-interval", "15"],
            "expected a duration such as 15s",
        ),
        (
            &["--poll-interval", "0s"],
            "--poll-interval / OUTBOXD_POLL_INTERVAL must be more than 0s",
        ),
        (&["--max-attempts", "0"], "--max-attempts"),
        (&["--max-recipients", "0"], "--max-recipients"),
        (&["--max-message-bytes", "10"], "from 1KiB to 100MiB"),
        (&["--max-message-bytes", "4GiB"], "unknown unit"),
        (
            &["--poll-interval", "18446744073709551615s"],
            "--poll-interval",
        ),
        (&["--smtp-timeout", "300000y"], "too long: at most 10m"),
        (&["--linger", "2s"], "too long: at most 1s"),
        (&["--linger", "soon"], "expected a duration such as 15s"),
        (&["--lease", "300000y"], "too long: at most 1day"),
        (&["--retry-backoff", "300000y"], "too long: at most 7days"),
        (&["--retry-backoff-max", "300000y"], "too long"),
        (&["--retention", "300000y"], "too long"),
        (&["--sample-interval", "300000y"], "too long"),
        (&["--shutdown-timeout", "300000y"], "too long"),
        (
            &[
                "--smtp-url",
                "smtp://user:secret@mail.example:587",
                "--from",
                "a@example.com",
            ],
            "credentials would cross the network in plain text",
        ),
        (&["--max-recipients", "1000000"], "--max-recipients"),
        (&["--smtp-concurrency", "0"], "--smtp-concurrency"),
        (
            &["--smtp-url", "smtp://127.0.0.1:2525"],
            "OUTBOXD_FROM is required",
        ),
        (
            &[
                "--smtp-url",
                "http://mail.example",
                "--from",
                "a@example.com",
            ],
            "invalid --smtp-url",
        ),
        (&["--from", "not an address"], "invalid --from"),
        (
            &["--lease", "10s", "--smtp-timeout", "10s"],
            "--lease / OUTBOXD_LEASE (10s) must be more than three times",
        ),
        (
            &["--retry-backoff", "2h", "--retry-backoff-max", "1h"],
            "shorter than --retry-backoff",
        ),
        (
            &["--templates", "/nonexistent/templates"],
            "is not a directory",
        ),
        (&["--listen", "nowhere"], "--listen"),
        (
            &["--message-id-domain", "bad domain"],
            "invalid --message-id-domain",
        ),
        (&["--worker-id", " "], "must not be empty"),
        (
            &["--suppress-hard-bounces", "maybe"],
            "--suppress-hard-bounces",
        ),
        (
            &["--max-attachment-bytes", "lots"],
            "--max-attachment-bytes",
        ),
        (&["--max-attachment-bytes", "10"], "from 1KiB to 100MiB"),
        (&["--rate-limit", "0/s"], "the rate must be more than 0"),
        (
            &["--rate-limit", "14"],
            "expected messages per unit, like 14/s",
        ),
        (&["--rate-limit", "5/day"], "expected messages per unit"),
        (&["--max-batch-size", "0"], "--max-batch-size"),
        (
            &["--expire-after", "account_verification"],
            "expected kind=duration",
        ),
        (
            &["--expire-after", "account_verification=0s"],
            "the lifetime must be more than 0s",
        ),
        (&["--expire-after", "a=1h,a=2h"], "\"a\" is given twice"),
        (&["--log-format", "xml"], "--log-format"),
        (
            &["--smtp-ca-file", "/etc/hostname"],
            "OUTBOXD_SMTP_CA_FILE is set but OUTBOXD_SMTP_URL is not",
        ),
        (
            &[
                "--smtp-url",
                "smtp://127.0.0.1:2525?tls=required",
                "--from",
                "a@example.com",
                "--smtp-ca-file",
                "/nonexistent/ca.pem",
            ],
            "cannot read --smtp-ca-file / OUTBOXD_SMTP_CA_FILE /nonexistent/ca.pem",
        ),
        (
            &[
                "--smtp-url",
                "smtp://127.0.0.1:2525?tls=required",
                "--from",
                "a@example.com",
                "--smtp-ca-file",
                "/etc/hostname",
            ],
            "the CA file holds no PEM certificate",
        ),
        (
            &[
                "--smtp-url",
                "smtp://u:hunter2@127.0.0.1:2525",
                "--from",
                "a@example.com",
                "--smtp-ca-file",
                "/etc/hostname",
            ],
            "a CA file was given for a server reached without TLS",
        ),
    ];
    for (flags, expected) in cases {
        let output = outboxd()
            .args(["run", "--database-url", &db.url])
            .args(*flags)
            .output()
            .unwrap();
        assert_refused(&output, expected);
    }
    // The same checks apply to environment variables.
    let output = outboxd()
        .args(["run", "--database-url", &db.url])
        .env("OUTBOXD_BATCH_SIZE", "-3")
        .output()
        .unwrap();
    assert_refused(&output, "--batch-size");
    let output = outboxd()
        .args(["run", "--database-url", &db.url])
        .env("OUTBOXD_RETRY_BACKOFF", "soon")
        .output()
        .unwrap();
    assert_refused(&output, "expected a duration");
}

#[tokio::test]
async fn a_broken_template_directory_is_refused_before_anything_starts() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("welcome")).unwrap();
    std::fs::write(dir.path().join("welcome/subject.txt"), "Hi {{ name ").unwrap();
    std::fs::write(dir.path().join("welcome/body.txt"), "x").unwrap();
    let output = outboxd()
        .args(["run", "--database-url", &db.url, "--templates"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_refused(&output, "template welcome/subject.txt does not parse");

    std::fs::write(dir.path().join("welcome/subject.txt"), "Hi").unwrap();
    std::fs::remove_file(dir.path().join("welcome/body.txt")).unwrap();
    let output = outboxd()
        .args(["run", "--database-url", &db.url, "--templates"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_refused(&output, "has subject.txt but no body.txt");
}

#[tokio::test]
async fn an_unreachable_database_gives_one_clear_error_line() {
    let output = outboxd()
        .args([
            "run",
            "--database-url",
            "postgres://postgres:hunter2@127.0.0.1:1/outboxd",
        ])
        .output()
        .unwrap();
    assert_refused(
        &output,
        "could not connect to PostgreSQL at 127.0.0.1:1/outboxd",
    );
    let err = stderr(&output);
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test]
async fn a_database_that_refuses_or_a_role_that_does_not_exist_is_said_at_once_in_its_words() {
    let db = TestDb::new().await;
    let nobody = db.url.replacen("postgres@", "nobody_here@", 1);
    for (url, says) in [
        ("postgres://postgres@127.0.0.1:1/app", "Connection refused"),
        (nobody.as_str(), "role \"nobody_here\" does not exist"),
    ] {
        let started = std::time::Instant::now();
        let output = outboxd()
            .args(["stats", "--database-url", url])
            .output()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(2), "{url}");
        assert_refused(&output, says);
        assert!(!stderr(&output).contains("at line"), "{}", stderr(&output));
    }
}

#[tokio::test]
async fn every_command_a_person_reads_names_the_database_and_only_demo_has_a_default() {
    let db = TestDb::new().await;
    let output = outboxd()
        .args(["stats", "--database-url", &db.url])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        said.lines().next(),
        Some(format!("database 127.0.0.1:5432/{}", db.name).as_str()),
        "{said}"
    );
    // For scripts, JSON alone.
    let json = outboxd()
        .args(["stats", "--json", "--database-url", &db.url])
        .output()
        .unwrap();
    assert!(serde_json::from_slice::<serde_json::Value>(&json.stdout).is_ok());
    // Without DATABASE_URL nothing falls back to a database nobody meant.
    for command in [
        &["stats"][..],
        &["dead-letters", "list"],
        &["pauses"],
        &["run"],
    ] {
        let output = outboxd().args(command).output().unwrap();
        assert_refused(&output, "DATABASE_URL is not set");
    }
}

#[tokio::test]
async fn a_missing_schema_gives_one_clear_error_line() {
    let db = TestDb::empty().await;
    let output = outboxd()
        .args(["run", "--database-url", &db.url])
        .output()
        .unwrap();
    assert_refused(
        &output,
        "the outbox schema is missing (from OUTBOXD_SCHEMA, or the search path without it): \
         run `outboxd migrate` first",
    );
    let output = outboxd()
        .args([
            "enqueue",
            "--database-url",
            &db.url,
            "--kind",
            "k",
            "--payload",
            "{}",
        ])
        .output()
        .unwrap();
    assert_refused(&output, "run `outboxd migrate` first");
}

#[tokio::test]
async fn migrate_creates_the_database_and_the_schema_and_enqueue_inserts_a_row() {
    let db = TestDb::empty().await;
    // `migrate` creates a database that does not exist yet only when told to: a mistyped
    // name must not make a new, empty one.
    let fresh_url = db.url.replace(&db.name, &format!("{}_new", db.name));
    let refused = outboxd()
        .args(["migrate", "--database-url", &fresh_url])
        .output()
        .unwrap();
    assert_refused(&refused, "does not exist on 127.0.0.1:5432: create it");
    assert!(stderr(&refused).contains("--create-database"));
    let output = outboxd()
        .args(["migrate", "--create-database", "--database-url", &fresh_url])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // Each migration applied is logged, so a first run does not read like one with nothing
    // to do.
    let logged = |output: &std::process::Output| {
        let text = String::from_utf8_lossy(&output.stdout).into_owned() + &stderr(output);
        text.matches("applied migration").count()
    };
    assert_eq!(logged(&output), outboxd::store::MIGRATOR.iter().count());
    let output = outboxd()
        .args(["migrate", "--database-url", &fresh_url])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "migrate twice: {}",
        stderr(&output)
    );
    assert_eq!(logged(&output), 0, "{}", stderr(&output));

    let output = outboxd()
        .args([
            "enqueue",
            "--database-url",
            &fresh_url,
            "--kind",
            "account_verification",
        ])
        .args([
            "--payload",
            r#"{"to": "a@example.com", "name": "A", "verify_url": "u"}"#,
        ])
        .args(["--not-before", "2030-01-01T00:00:00Z"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let id: i64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pool = sqlx::PgPool::connect(&fresh_url).await.unwrap();
    let (kind, year): (String, f64) = sqlx::query_as(
        "SELECT kind, extract(year FROM not_before)::float8 FROM outbox_messages WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((kind.as_str(), year), ("account_verification", 2030.0));
    pool.close().await;
    db.exec(format!("DROP DATABASE {}_new WITH (FORCE)", db.name))
        .await;
}

#[tokio::test]
async fn bad_enqueue_input_is_refused_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let cases: &[(&[&str], &str)] = &[
        (
            &["--kind", "account_verification", "--payload", "{not json"],
            "--payload is not valid JSON",
        ),
        (
            &["--kind", "account_verification", "--payload", "[1, 2]"],
            "payload must be a JSON object",
        ),
        (&["--kind", "Bad Kind", "--payload", "{}"], "kind must be"),
        (&["--kind", "", "--payload", "{}"], "kind must be"),
        (
            &["--kind", "k", "--payload", "{}", "--not-before", "tomorrow"],
            "--not-before",
        ),
        (&["--payload", "{}"], "--kind"),
        (
            &["--kind", "k", "--payload", "{}", "--priority=-1"],
            "priority must be between 0 and 10000",
        ),
        (
            &["--kind", "k", "--payload", "{}", "--priority", "70000"],
            "--priority",
        ),
        (
            &["--kind", "k", "--payload", "{}", "--idempotency-key", ""],
            "an idempotency key must be 1 to 200 characters",
        ),
        (
            &["--kind", "k", "--payload", "{}", "--expires-at", "soon"],
            "--expires-at",
        ),
    ];
    for (flags, expected) in cases {
        let output = outboxd()
            .args(["enqueue", "--database-url", &db.url])
            .args(*flags)
            .output()
            .unwrap();
        assert_refused(&output, expected);
    }
    assert_eq!(db.count("all").await, 0);
    // The table refuses the same from a producer that bypasses outboxd.
    for refused in [
        "INSERT INTO outbox_messages (kind, payload) VALUES ('k', '[1]')",
        "INSERT INTO outbox_messages (kind, payload, priority) VALUES ('k', '{}', -1)",
        "INSERT INTO outbox_messages (kind, payload, idempotency_key) VALUES ('k', '{}', '')",
        "INSERT INTO outbox_messages (kind, payload, end_reason) VALUES ('k', '{}', 'expired')",
    ] {
        let result = sqlx::query(refused).execute(&db.pool).await;
        assert!(result.is_err(), "{refused}");
    }
}

#[tokio::test]
async fn sigterm_stops_a_running_dispatcher_cleanly() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let child = outboxd()
        .args([
            "run",
            "--database-url",
            &db.url,
            "--smtp-url",
            &smtp.url(),
            "--from",
            "a@example.com",
        ])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    db.enqueue(
        "account_verification",
        json!({"to": "a@example.com", "name": "A", "verify_url": "u"}),
    )
    .await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    sigterm(&child);
    let output = wait_with_timeout(child, Duration::from_secs(15));
    assert!(output.status.success(), "{}", stderr(&output));
    let logged = stderr(&output);
    assert!(logged.contains("dispatcher stopped"));
    // Its start says, in words, which database it reads and the kinds it knows.
    let start = logged
        .lines()
        .find(|l| l.contains("reading the outbox"))
        .unwrap_or_else(|| panic!("{logged}"));
    assert!(
        start.contains(&format!("database=127.0.0.1:5432/{}", db.name))
            && start.contains("kinds=account_verification, invoice_notice, workspace_invite"),
        "{start}"
    );
    assert!(!logged.contains("SmtpSettings {"), "a Debug dump: {logged}");
}

#[tokio::test]
async fn sigterm_releases_a_send_that_does_not_finish_within_the_shutdown_bound() {
    let db = TestDb::new().await;
    let hole = BlackHole::start().await;
    let id = db
        .enqueue(
            "account_verification",
            json!({"to": "a@example.com", "name": "A", "verify_url": "u"}),
        )
        .await;
    let child = outboxd()
        .args([
            "run",
            "--database-url",
            &db.url,
            "--smtp-url",
            &hole.url(),
            "--from",
            "a@example.com",
        ])
        .args([
            "--smtp-timeout",
            "60s",
            "--lease",
            "5m",
            "--shutdown-timeout",
            "1s",
        ])
        .args(["--worker-id", "leaving", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The send is under way once it has connected (the server never greets).
    eventually(Duration::from_secs(30), "the send is under way", || async {
        hole.accepted() > 0
    })
    .await;
    sigterm(&child);
    let output = wait_with_timeout(child, Duration::from_secs(20));
    assert!(output.status.success(), "{}", stderr(&output));
    let row = db.row(id).await;
    assert!(
        row.locked_by.is_none() && !row.dispatched && row.attempts == 0 && !row.waiting,
        "{row:?}"
    );
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.contains("abandoned at shutdown")),
        "{row:?}\n{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn secrets_never_appear_in_the_logs() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    // Trust authentication ignores the password, so the run really starts with it.
    let database_url = db.url.replace("postgres@", "postgres:db-hunter2@");
    let smtp_url = format!("smtp://mailer:smtp-hunter2@127.0.0.1:{}", smtp.port);
    let child = outboxd()
        .args([
            "--log-format",
            "json",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--from",
            "a@example.com",
        ])
        .env("DATABASE_URL", &database_url)
        .env("OUTBOXD_SMTP_URL", &smtp_url)
        .env("OUTBOXD_ADMIN_TOKEN", "admin-hunter2-0123456789")
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    db.wait_for_listener().await;
    sigterm(&child);
    let output = wait_with_timeout(child, Duration::from_secs(15));
    let logs = format!(
        "{}{}",
        stderr(&output),
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(logs.contains("delivering over SMTP"), "{logs}");
    assert!(!logs.contains("hunter2"), "{logs}");

    let help = outboxd()
        .args(["run", "--help"])
        .env("DATABASE_URL", &database_url)
        .env("OUTBOXD_SMTP_URL", &smtp_url)
        .env("OUTBOXD_ADMIN_TOKEN", "admin-hunter2-0123456789")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("hunter2"));
}

#[tokio::test]
async fn the_help_documents_every_option_with_its_environment_variable() {
    let output = outboxd().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/configuration.md");
    let page = std::fs::read_to_string(path).unwrap();
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("a run subcommand");
    // The global options (the log format) are declared on the top-level command.
    let options: Vec<_> = cli
        .get_arguments()
        .chain(run.get_arguments())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    assert!(options.len() >= 20, "{} options", options.len());
    for option in options {
        let var = option
            .get_env()
            .unwrap_or_else(|| panic!("--{} has no environment variable", option.get_id()))
            .to_str()
            .unwrap();
        assert!(help.contains(&format!("[env: {var}")), "--help lacks {var}");
        assert!(
            option.get_help().is_some(),
            "--{} has no help",
            option.get_id()
        );
        assert!(
            page.contains(var),
            "docs/src/configuration.md does not document {var}"
        );
    }
}

#[test]
fn output_cut_short_by_its_reader_ends_quietly() {
    use std::io::Read as _;
    // 100 KB: more than a pipe holds (64 KiB), so the write is still going when the
    // reader leaves; and less than one argument may be (128 KiB).
    let name = "Ada ".repeat(25_000);
    let payload =
        serde_json::json!({"to": "ada@example.com", "name": name, "verify_url": "https://x/v"});
    let mut child = outboxd()
        .args(["preview", "--kind", "account_verification", "--text"])
        .args(["--payload", &payload.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut start = [0_u8; 16];
    child.stdout.take().unwrap().read_exact(&mut start).unwrap();
    // The pipe's read end is dropped here, as `| head -c 16` would.
    let output = wait_with_timeout(child, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
