//! `outboxd doctor` against real set-ups: a healthy one, and one whose SMTP server is gone
//! while a transaction is left open, and one without its database.

use std::time::Duration;

use crate::helpers::{SmtpServer, TestDb, free_port, outboxd, poll_until, said};

/// Runs the doctor; returns whether it succeeded, its stdout and its stderr.
fn doctor(database_url: &str, smtp_url: &str, extra: &[&str]) -> (bool, String, String) {
    said(
        outboxd()
            .args(["doctor", "--database-url", database_url])
            .args(extra)
            .env("OUTBOXD_SMTP_URL", smtp_url)
            .env("OUTBOXD_FROM", "Acme <no-reply@acme.example>"),
        "outboxd doctor",
    )
}

fn line<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|line| line[4..].trim_start().starts_with(&format!("{check}:")))
        .unwrap_or_else(|| panic!("no {check} line:\n{out}"))
}

#[tokio::test]
async fn on_a_healthy_set_up_every_check_passes_and_it_exits_zero() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (ok, out, err) = doctor(&db.url, &smtp.url(), &[]);
    assert!(ok, "{out}{err}");
    for check in [
        "configuration",
        "smtp",
        "database",
        "schema",
        "indexes",
        "open transaction",
        "notifications",
    ] {
        assert!(line(&out, check).starts_with("ok "), "{out}");
    }
    // Every line says how it came out, first.
    assert!(
        out.lines()
            .all(|l| ["ok ", "warn ", "fail "].iter().any(|v| l.starts_with(v))),
        "{out}"
    );
    assert!(smtp.messages().is_empty(), "the doctor sends nothing");
}

#[tokio::test]
async fn with_the_smtp_server_gone_and_a_transaction_open_it_names_both_and_exits_one() {
    let db = TestDb::new().await;
    let (mut open, pid) = db.open_transaction().await;
    poll_until(
        Duration::from_secs(10),
        "the transaction a second old",
        || async {
            let age: Option<f64> = sqlx::query_scalar(
                "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8 \
             FROM pg_stat_activity WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            age.filter(|&age| age >= 1.5)
        },
    )
    .await;
    let gone = format!("smtp://127.0.0.1:{}", free_port());
    let (ok, out, err) = doctor(&db.url, &gone, &["--long-transaction", "1s"]);
    assert!(!ok, "{out}");
    assert!(line(&out, "smtp").starts_with("fail "), "{out}");
    let transaction = line(&out, "open transaction");
    assert!(transaction.starts_with("warn "), "{out}");
    assert!(transaction.contains(&format!("pid {pid} ")), "{out}");
    assert!(transaction.contains("pg_terminate_backend"), "{out}");
    assert!(err.contains("checks failed: smtp"), "{err}");
    sqlx::raw_sql("ROLLBACK").execute(&mut open).await.unwrap();
}

#[tokio::test]
async fn without_its_database_it_says_so_in_one_line_and_exits_one() {
    let smtp = SmtpServer::start();
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/outboxd", free_port());
    let (ok, out, err) = doctor(&nowhere, &smtp.url(), &[]);
    assert!(!ok, "{out}");
    assert!(line(&out, "database").starts_with("fail "), "{out}");
    assert!(line(&out, "smtp").starts_with("ok "), "{out}");
    assert!(err.contains("checks failed: database"), "{err}");
}

#[tokio::test]
async fn a_fallback_relay_that_does_not_answer_is_named_though_the_first_does() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let gone = free_port();
    let fallback = format!("smtp://127.0.0.1:{gone}");
    let (ok, out, _) = doctor(&db.url, &smtp.url(), &["--smtp-fallback-urls", &fallback]);
    assert!(!ok, "{out}");
    let said = line(&out, "smtp");
    assert!(
        said.starts_with("fail ")
            && said.contains(&format!("127.0.0.1:{gone} (transactional lane):")),
        "{out}"
    );
    assert!(
        !said.contains(&format!("127.0.0.1:{}:", smtp.port)),
        "the first answers: {out}"
    );

    let second = SmtpServer::start();
    let (ok, out, _) = doctor(
        &db.url,
        &smtp.url(),
        &["--smtp-fallback-urls", &second.url()],
    );
    assert!(ok, "{out}");
    assert!(line(&out, "smtp").contains("all 2 relays answer"), "{out}");
}
