//! A kind's settings beside its templates (`kind.toml`): its lane, its own sender, what
//! `preview` and `doctor` show of it, and each way a file or a contradiction is refused.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, http_get, metric_value, outboxd, preview, run_refused,
    succeeds,
};

/// A templates directory with the kind `news` (subject and body) and its `kind.toml`.
fn news_kind(kind_toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    let news = dir.path().join("news");
    std::fs::create_dir(&news).unwrap();
    std::fs::write(news.join("subject.txt"), "News for {{ name }}").unwrap();
    std::fs::write(news.join("body.txt"), "Hello {{ name }}").unwrap();
    std::fs::write(news.join("kind.toml"), kind_toml).unwrap();
    dir
}

fn path(dir: &tempfile::TempDir) -> String {
    dir.path().display().to_string()
}

#[tokio::test]
async fn a_kind_in_the_bulk_lane_by_its_file_is_sent_from_its_own_sender_and_counted_as_bulk() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let templates = news_kind(
        "lane = \"bulk\"\nfrom = \"Acme News <news@example.com>\"\n\
         reply_to = \"editors@example.com\"\n",
    );
    let dir = path(&templates);
    let outboxd = Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &["--templates", &dir, "--sample-interval", "200ms"],
        &[],
    )
    .await;
    db.enqueue("news", json!({"to": "ada@example.com", "name": "Ada"}))
        .await;
    db.verification_to("bo@example.com").await;
    let received = smtp.wait_for(2, Duration::from_secs(30)).await;
    let news = received
        .iter()
        .find(|m| m.rcpt_tos == ["ada@example.com"])
        .expect("the news");
    assert_eq!(news.header("From"), Some("Acme News <news@example.com>"));
    assert_eq!(news.header("Reply-To"), Some("editors@example.com"));
    assert_eq!(
        news.mail_from, "news@example.com",
        "the envelope's sender too"
    );
    let verification = received
        .iter()
        .find(|m| m.rcpt_tos == ["bo@example.com"])
        .expect("the verification");
    assert_eq!(verification.header("From"), Some("a@example.com"));
    eventually(
        Duration::from_secs(30),
        "the bulk lane's send counted",
        || async {
            let body = http_get(&outboxd.http, "/metrics").await.1;
            metric_value(&body, "outbox_lane_sent_total{lane=\"bulk\"}") == Some(1.0)
        },
    )
    .await;
}

#[test]
fn preview_shows_a_kinds_settings_and_renders_it_from_its_own_sender() {
    let templates = news_kind(
        "lane = \"bulk\"\nfrom = \"Acme News <news@example.com>\"\nexpire_after = \"3d\"\n",
    );
    let payload = json!({"to": "ada@example.com", "name": "Ada"}).to_string();
    let shown = preview("news", &payload, &["--templates", &path(&templates)]);
    assert!(
        shown.contains("From: \"Acme News\" <news@example.com>"),
        "{shown}"
    );
    assert!(shown.contains("--- kind settings ---"), "{shown}");
    for line in [
        "lane: bulk",
        "essential: no",
        "expire_after: 3days",
        "news/kind.toml",
    ] {
        assert!(shown.contains(line), "{line}: {shown}");
    }
    // A built-in kind says its own.
    let shown = preview(
        "account_verification",
        r#"{"to": "a@example.com", "name": "A", "verify_url": "https://x.example/v"}"#,
        &[],
    );
    assert!(shown.contains("essential: no"), "{shown}");
    // OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS's default exempts it.
    assert!(shown.contains("never paused automatically"), "{shown}");
    // A built-in kind goes to the bulk lane by the variable, as before its file existed.
    let invoice = json!({"to": "a@example.com", "customer_name": "A", "invoice_number": "1",
                         "amount": "1", "currency": "EUR", "due_date": "2027-01-01",
                         "invoice_url": "https://x.example/i"});
    let shown = preview(
        "invoice_notice",
        &invoice.to_string(),
        &["--bulk-kinds", "invoice_notice"],
    );
    assert!(shown.contains("lane: bulk"), "{shown}");
}

#[tokio::test]
async fn doctor_reports_each_kinds_sender_and_a_bulk_kind_without_an_unsubscribe_link() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let templates = news_kind("lane = \"bulk\"\nfrom = \"Acme News <news@example.com>\"\n");
    let (_, out, err) = crate::helpers::said(
        outboxd()
            .args([
                "doctor",
                "--database-url",
                &db.url,
                "--templates",
                &path(&templates),
            ])
            .env("OUTBOXD_SMTP_URL", smtp.url())
            .env("OUTBOXD_FROM", "Acme <no-reply@example.com>"),
        "outboxd doctor",
    );
    let line = out
        .lines()
        .find(|line| line.contains("news: from Acme News <news@example.com>"))
        .unwrap_or_else(|| panic!("no line for news: {out}{err}"));
    assert!(line.contains("not signed (no DKIM key)"), "{line}");
    assert!(
        out.contains("account_verification: from Acme <no-reply@example.com>"),
        "{out}"
    );
    assert!(
        out.lines().any(
            |line| line.starts_with("warn unsubscribe: bulk kinds (news)")
                && line.contains("OUTBOXD_PUBLIC_URL")
        ),
        "{out}"
    );
}

#[test]
fn each_kind_of_bad_kind_file_and_each_contradiction_is_refused_at_start() {
    let smtp = [
        "--smtp-url",
        "smtp://127.0.0.1:2525",
        "--from",
        "Acme <no-reply@example.com>",
    ];
    let cases: [(&str, &[&str], &str); 11] = [
        (
            "secret_fields = [\"reset url\"]\n",
            &[],
            "a secret field must be a path",
        ),
        ("secret_fields = [\"code\", \"code\"]\n", &[], "code twice"),
        ("payload_retention = \"30s\"\n", &[], "at least 1m"),
        (
            "payload_retention = \"a day\"\n",
            &[],
            "says payload_retention",
        ),
        ("lanes = \"bulk\"\n", &[], "unknown field `lanes`"),
        (
            "lane = \"newsletter\"\n",
            &[],
            "unknown variant `newsletter`",
        ),
        ("from = \"not an address\"\n", &[], "says from"),
        (
            "lane = \"transactional\"\n",
            &["--bulk-kinds", "news"],
            "OUTBOXD_BULK_KINDS names news",
        ),
        (
            "expire_after = \"2d\"\n",
            &["--expire-after", "news=1d"],
            "OUTBOXD_EXPIRE_AFTER gives news 1day",
        ),
        (
            "from = \"News <news@elsewhere.example>\"\n",
            &[],
            "not in OUTBOXD_FROM_DOMAINS (example.com)",
        ),
        (
            "auto_pause = true\n",
            &["--auto-pause-exempt-kinds", "news"],
            "OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS names news",
        ),
    ];
    for (file, flags, says) in cases {
        let templates = news_kind(file);
        let dir = path(&templates);
        let mut all = vec!["--templates", dir.as_str()];
        all.extend(smtp);
        all.extend(flags);
        let refusal = run_refused(&all, says);
        assert!(
            refusal.contains("news/kind.toml"),
            "names the file: {refusal}"
        );
    }
    // The domain allowed by OUTBOXD_FROM_DOMAINS goes through to the next check: there is
    // no database there.
    let templates = news_kind("from = \"News <news@news.example.com>\"\n");
    let dir = path(&templates);
    let mut all = vec![
        "--templates",
        dir.as_str(),
        "--from-domains",
        "example.com,news.example.com",
    ];
    all.extend(smtp);
    let output = outboxd()
        .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
        .args(&all)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("kind.toml") && stderr.contains("127.0.0.1:1"),
        "refused for the database, not the kind: {stderr}"
    );
}

#[test]
fn a_kind_file_without_templates_or_too_large_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let lonely = dir.path().join("lonely");
    std::fs::create_dir(&lonely).unwrap();
    std::fs::write(lonely.join("kind.toml"), "lane = \"bulk\"\n").unwrap();
    std::fs::create_dir(dir.path().join("news")).unwrap();
    write_kind(dir.path(), "news", &"# padding\n".repeat(2000));
    let shown = dir.path().display().to_string();
    let refusal = run_refused(&["--templates", &shown], "lonely/kind.toml");
    assert!(refusal.contains("no subject.txt"), "{refusal}");
    std::fs::remove_dir_all(&lonely).unwrap();
    let refusal = run_refused(&["--templates", &shown], "news/kind.toml");
    assert!(refusal.contains("longer than"), "{refusal}");
}

fn write_kind(dir: &Path, kind: &str, kind_toml: &str) {
    let folder = dir.join(kind);
    std::fs::write(folder.join("subject.txt"), "S").unwrap();
    std::fs::write(folder.join("body.txt"), "B").unwrap();
    std::fs::write(folder.join("kind.toml"), kind_toml).unwrap();
}

#[test]
fn with_dkim_a_kinds_sender_must_align_with_the_signed_domain() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("dkim.pem");
    succeeds(
        std::process::Command::new("openssl")
            .args(["genrsa", "-traditional", "-out"])
            .arg(&key)
            .arg("2048"),
        "openssl genrsa",
    );
    let key = key.display().to_string();
    let run = |kind_toml: &str| {
        let templates = news_kind(kind_toml);
        let output = outboxd()
            .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
            .args([
                "--smtp-url",
                "smtp://127.0.0.1:2525",
                "--from",
                "a@example.com",
            ])
            .args([
                "--from-domains",
                "example.com,news.example.com,other.example",
            ])
            .args(["--dkim-domain", "example.com", "--dkim-selector", "s1"])
            .args([
                "--dkim-private-key-file",
                &key,
                "--templates",
                &path(&templates),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let refused = run("from = \"News <news@other.example>\"\n");
    assert!(
        refused.contains("DMARC alignment") && refused.contains("news/kind.toml"),
        "{refused}"
    );
    // A subdomain of the signed domain aligns (DMARC's relaxed alignment).
    let accepted = run("from = \"News <news@news.example.com>\"\n");
    assert!(
        !accepted.contains("DMARC") && accepted.contains("127.0.0.1:1"),
        "refused for the database only: {accepted}"
    );
}
