//! What an email carries beyond its templates: a DKIM signature an independent verifier
//! accepts, the headers a kind declares, and attachments; and the refusals of each.

use std::process::Command;

use base64::Engine as _;
use serde_json::json;

use crate::helpers::said;
use crate::helpers::{
    Outboxd, SmtpServer, TestDb, app, assert_refused, bytes_from, one_step, outboxd, python,
    refusal_saying,
};

/// An RSA private key of `bits` made with openssl, in PKCS#1 PEM.
fn rsa_key(path: &std::path::Path, bits: &str) {
    let made = Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(path)
        .arg(bits)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
}

/// An RSA key made with openssl, in the PKCS#1 PEM DKIM wants, and its public half as the
/// base64 DER a DKIM TXT record carries.
pub(crate) struct DkimKeyPair {
    dir: tempfile::TempDir,
    pub public_der_base64: String,
}

impl DkimKeyPair {
    pub fn new() -> Self {
        Self::of_bits("2048")
    }

    fn of_bits(bits: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("dkim.pem");
        rsa_key(&key, bits);
        let public = bytes_from(
            Command::new("openssl")
                .args(["rsa", "-pubout", "-outform", "DER", "-in"])
                .arg(&key),
            "openssl rsa",
        );
        Self {
            dir,
            public_der_base64: base64::engine::general_purpose::STANDARD.encode(public),
        }
    }

    pub fn key_path(&self) -> String {
        self.dir.path().join("dkim.pem").display().to_string()
    }
}

/// An Ed25519 key made with openssl, in PKCS#8 PEM, and its public half as the raw base64
/// an RFC 8463 TXT record carries (the last 32 bytes of the SubjectPublicKeyInfo).
fn ed25519_key(dir: &std::path::Path) -> (String, String) {
    let key = dir.join("dkim-ed25519.pem");
    bytes_from(
        Command::new("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&key),
        "openssl genpkey",
    );
    let public = bytes_from(
        Command::new("openssl")
            .args(["pkey", "-pubout", "-outform", "DER", "-in"])
            .arg(&key),
        "openssl pkey",
    );
    let raw = &public[public.len() - 32..];
    (
        key.display().to_string(),
        base64::engine::general_purpose::STANDARD.encode(raw),
    )
}

fn pdf() -> Vec<u8> {
    let mut bytes = b"%PDF-1.4\n".to_vec();
    bytes.extend((0..=255u8).cycle().take(3000));
    bytes
}

fn invoice_with(attachments: serde_json::Value) -> serde_json::Value {
    let mut payload = outboxd::app::sample_messages().unwrap()[2]
        .payload()
        .clone();
    payload["attachments"] = attachments;
    payload
}

#[tokio::test]
async fn every_built_in_kind_arrives_with_a_dkim_signature_an_independent_verifier_accepts() {
    // 2048 bits and more are signed by ring; 1024 to 2047 by the rsa crate; Ed25519, beside
    // RSA, by ring.
    for (bits, ed25519) in [("2048", false), ("1024", false), ("2048", true)] {
        signed_and_verified(bits, ed25519).await;
    }
}

async fn signed_and_verified(bits: &str, with_ed25519: bool) {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let keys = DkimKeyPair::of_bits(bits);
    for message in outboxd::app::sample_messages().unwrap() {
        db.store.enqueue(&db.pool, message).await.unwrap();
    }
    let pdf = base64::engine::general_purpose::STANDARD.encode(pdf());
    db.enqueue(
        "invoice_notice",
        invoice_with(json!([
            {"filename": "INV-2026-0042.pdf", "content_type": "application/pdf", "content_base64": pdf},
            // Text with bare line feeds: sent as it is, it would break the body hash.
            {"filename": "notes.txt", "content_type": "text/plain",
             "content_base64": base64::engine::general_purpose::STANDARD.encode("hello\nworld\n")},
        ])),
    )
    .await;
    let key = keys.key_path();
    let mut flags = vec![
        "--dkim-domain",
        "example.test",
        "--dkim-selector",
        "s2026",
        "--dkim-private-key-file",
        &key,
    ];
    let (ed_key, ed_public) = ed25519_key(keys.dir.path());
    let mut ed_args: Vec<&str> = Vec::new();
    if with_ed25519 {
        flags.extend([
            "--dkim-ed25519-selector",
            "e2026",
            "--dkim-ed25519-private-key-file",
            &ed_key,
        ]);
        ed_args = vec!["e2026", &ed_public];
    }
    let mut app = app(&db, Some(&smtp.url()), &flags).await;
    one_step(&mut app).await;
    assert_eq!(smtp.messages().len(), 4);

    let verified = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/dkim_verify.py"
        ))
        .arg(smtp.spool())
        .args(["s2026", "example.test", &keys.public_der_base64])
        .args(&ed_args)
        .output()
        .unwrap();
    assert!(verified.status.success(), "{verified:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&verified.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for line in &lines {
        assert_eq!(
            line["verified"],
            true,
            "{line}\n{}",
            String::from_utf8_lossy(&verified.stderr)
        );
        assert_eq!(line["tampered_verified"], false, "{line}");
        let algorithms: &[&str] = if with_ed25519 {
            &["rsa-sha256", "ed25519-sha256"]
        } else {
            &["rsa-sha256"]
        };
        assert_eq!(line["algorithms"], json!(algorithms), "{line}");
        let signature = line["signature"].as_str().unwrap();
        assert!(signature.contains("d=example.test"), "{signature}");
        assert!(signature.contains("s=s2026"), "{signature}");
        assert!(signature.contains("a=rsa-sha256"), "{signature}");
    }
}

#[tokio::test]
async fn a_dkim_key_that_cannot_sign_stops_outboxd_before_it_starts() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----\n",
    )
    .unwrap();
    let bad = bad.display().to_string();
    let missing = dir.path().join("missing.pem").display().to_string();
    let small = dir.path().join("small.pem");
    rsa_key(&small, "512");
    let small = small.display().to_string();
    let good = dir.path().join("good.pem");
    rsa_key(&good, "2048");
    let good = good.display().to_string();
    let rsa_signing = |extra: &[&'static str]| {
        let mut flags: Vec<&str> = vec![
            "--dkim-domain",
            "example.test",
            "--dkim-selector",
            "s1",
            "--dkim-private-key-file",
            &good,
        ];
        flags.extend(extra);
        flags
    };
    let rsa_as_ed25519 = [
        rsa_signing(&["--dkim-ed25519-selector", "e1"]),
        vec!["--dkim-ed25519-private-key-file", &good],
    ]
    .concat();
    for (flags, says) in [
        (
            rsa_signing(&["--dkim-ed25519-selector", "e1"]),
            "needs both OUTBOXD_DKIM_ED25519_SELECTOR and OUTBOXD_DKIM_ED25519_PRIVATE_KEY_FILE",
        ),
        (
            vec![
                "--dkim-ed25519-selector",
                "e1",
                "--dkim-ed25519-private-key-file",
                &good,
            ],
            "an Ed25519 signature goes beside an RSA one",
        ),
        (
            rsa_as_ed25519,
            "expected an Ed25519 private key in PKCS#8 PEM",
        ),
        (
            vec![
                "--dkim-domain",
                "example.test",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                &bad,
            ],
            "RSA private key in PKCS#1 PEM",
        ),
        (
            vec![
                "--dkim-domain",
                "example.test",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                &missing,
            ],
            "cannot read --dkim-private-key-file",
        ),
        (
            vec![
                "--dkim-domain",
                "example.test",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                "/dev/zero",
            ],
            "not a regular file",
        ),
        (vec!["--dkim-domain", "example.test"], "DKIM needs all of"),
        (
            vec!["--max-attachment-bytes", "4MiB"],
            "OUTBOXD_MAX_ATTACHMENT_BYTES (4194304) cannot be reached",
        ),
        (
            vec![
                "--dkim-domain",
                "example.test",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                &small,
            ],
            "the RSA key has 512 bits",
        ),
        (
            vec![
                "--dkim-domain",
                "bad domain",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                &bad,
            ],
            "not a DNS name",
        ),
    ] {
        let output = outboxd()
            .args(["run", "--database-url", &db.url])
            .args(&flags)
            .output()
            .unwrap();
        assert_refused(&output, says);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}

#[tokio::test]
async fn a_dkim_key_every_user_may_read_is_used_with_a_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TestDb::new().await;
    let keys = DkimKeyPair::new();
    let key = keys.key_path();
    for (mode, warned) in [(0o600, false), (0o644, true)] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let outboxd = Outboxd::start(
            &db.url,
            &[
                "--dkim-domain",
                "example.test",
                "--dkim-selector",
                "s1",
                "--dkim-private-key-file",
                &key,
            ],
            &[],
        )
        .await;
        outboxd.sigterm();
        let (_, stderr) = outboxd.wait(std::time::Duration::from_secs(30));
        assert_eq!(
            stderr.contains("readable by every user"),
            warned,
            "{mode:o}: {stderr}"
        );
    }
}

/// A template directory with a `newsletter` kind that declares the one-click unsubscribe
/// headers Gmail wants.
/// The newsletter templates with `file` of the kind's folder written as `text`.
fn newsletter_templates_with(file: &str, text: &str) -> tempfile::TempDir {
    let templates = newsletter_templates();
    std::fs::write(templates.path().join("newsletter").join(file), text).unwrap();
    templates
}

fn newsletter_templates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let kind = dir.path().join("newsletter");
    std::fs::create_dir(&kind).unwrap();
    std::fs::write(kind.join("subject.txt"), "News for {{ name }}").unwrap();
    std::fs::write(kind.join("body.txt"), "Hello {{ name }}").unwrap();
    std::fs::write(
        kind.join("headers.txt"),
        "# RFC 8058 one-click unsubscribe\n\
         List-Unsubscribe: <{{ unsubscribe_url }}>\n\
         List-Unsubscribe-Post: List-Unsubscribe=One-Click\n\
         X-Campaign: {% if campaign %}{{ campaign }}{% endif %}\n",
    )
    .unwrap();
    dir
}

#[tokio::test]
async fn declared_headers_arrive_intact_and_a_line_break_through_them_is_refused() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let templates = newsletter_templates();
    let newsletter = |to: &str, unsubscribe_url: &str| {
        let payload = json!({"to": to, "name": "Ada", "campaign": null,
                             "unsubscribe_url": unsubscribe_url});
        db.enqueue("newsletter", payload)
    };
    let sent = newsletter(
        "ada@example.com",
        "https://app.example/unsubscribe?u=42&t=abc",
    )
    .await;
    let injected = newsletter(
        "eve@example.com",
        "https://app.example/u\r\nBcc: victim@example.net",
    )
    .await;
    let dir = templates.path().display().to_string();
    let mut app = app(&db, Some(&smtp.url()), &["--templates", &dir]).await;
    one_step(&mut app).await;

    let received = smtp.messages();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].outbox_id, sent.to_string());
    assert_eq!(
        received[0].header("List-Unsubscribe"),
        Some("<https://app.example/unsubscribe?u=42&t=abc>")
    );
    assert_eq!(
        received[0].header("List-Unsubscribe-Post"),
        Some("List-Unsubscribe=One-Click")
    );
    assert_eq!(
        received[0].header("X-Campaign"),
        None,
        "an empty header is left out"
    );
    assert!(db.row(injected).await.dead);
    assert_eq!(
        db.error_class(injected).await.as_deref(),
        Some("header_injection")
    );
    assert!(
        !received
            .iter()
            .any(|r| r.rcpt_tos.iter().any(|t| t.contains("victim")))
    );
}

#[test]
fn a_template_that_does_not_parse_stops_outboxd_with_one_line_naming_it() {
    let templates = newsletter_templates_with("subject.txt", "News {{ oops");
    let output = outboxd()
        .args([
            "preview",
            "--kind",
            "newsletter",
            "--payload",
            "{}",
            "--templates",
        ])
        .arg(templates.path())
        .output()
        .unwrap();
    let stderr = refusal_saying(&output, "template newsletter/subject.txt does not parse");
    assert!(stderr.contains("on line 1"), "{stderr}");
}

#[tokio::test]
async fn a_kind_may_not_declare_a_header_outboxd_writes() {
    let db = TestDb::new().await;
    let templates = newsletter_templates_with("headers.txt", "From: someone@else.example\n");
    let output = outboxd()
        .args(["run", "--database-url", &db.url, "--templates"])
        .arg(templates.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("newsletter/headers.txt line 1: From is written by outboxd"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_attachment_arrives_intact_and_bad_ones_are_dead_lettered_with_a_clear_reason() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let bytes = pdf();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let attached = db
        .enqueue(
            "invoice_notice",
            invoice_with(json!([{"filename": "Rechnung März.pdf",
                                  "content_type": "application/pdf", "content_base64": b64}])),
        )
        .await;
    let large = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 5000]);
    let refused = [
        (
            json!([{"filename": "a.pdf\r\nBcc: victim@example.net", "content_type": "application/pdf",
                    "content_base64": b64}]),
            "header_injection",
        ),
        (
            json!([{"filename": "a.pdf", "content_type": "application/pdf\r\nX-Evil: 1",
                    "content_base64": b64}]),
            "header_injection",
        ),
        (
            json!([{"filename": "big.bin", "content_type": "application/octet-stream",
                    "content_base64": large}]),
            "attachment_too_large",
        ),
        (
            json!([{"filename": "a.pdf", "content_type": "application/pdf", "content_base64": "%%%"}]),
            "attachment",
        ),
        (json!([{"filename": "a.pdf"}]), "attachment"),
        (json!("a.pdf"), "attachment"),
    ];
    let mut ids = Vec::new();
    for (attachments, class) in &refused {
        ids.push((
            db.enqueue("invoice_notice", invoice_with(attachments.clone()))
                .await,
            *class,
        ));
    }
    let mut app = app(&db, Some(&smtp.url()), &["--max-attachment-bytes", "4KiB"]).await;
    one_step(&mut app).await;

    let received = smtp.messages();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].outbox_id, attached.to_string());
    let attachment = &received[0].attachments[0];
    assert_eq!(attachment.filename.as_deref(), Some("Rechnung März.pdf"));
    assert_eq!(attachment.content_type, "application/pdf");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&attachment.content_base64)
            .unwrap(),
        bytes
    );
    assert!(
        received[0]
            .text
            .as_deref()
            .unwrap()
            .contains("INV-2026-0042")
    );
    for (id, class) in ids {
        assert!(db.row(id).await.dead, "{class}");
        assert_eq!(
            db.error_class(id).await.as_deref(),
            Some(class),
            "message {id}"
        );
    }
    let too_large = db
        .row(ids_last_error(&db, "attachment_too_large").await)
        .await;
    assert!(
        too_large
            .last_error
            .unwrap()
            .contains("OUTBOXD_MAX_ATTACHMENT_BYTES"),
        "the reason names the option"
    );
}

async fn ids_last_error(db: &TestDb, class: &str) -> i64 {
    db.scalar(
        "SELECT id FROM outbox_messages WHERE error_class = $1",
        class,
    )
    .await
}

#[test]
fn preview_renders_an_email_as_it_would_be_sent_without_a_database_or_a_server() {
    let preview = |args: &[&str]| {
        said(
            outboxd()
                .arg("preview")
                .args(args)
                .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
            "outboxd preview",
        )
    };
    let invoice = invoice_with(
        json!([{"filename": "INV.pdf", "content_type": "application/pdf",
                                       "content_base64": "JVBERi0xLjQK"}]),
    )
    .to_string();
    let (ok, shown, _) = preview(&["--kind", "invoice_notice", "--payload", &invoice]);
    assert!(ok);
    assert!(shown.contains("Subject: Invoice INV-2026-0042"), "{shown}");
    assert!(
        shown.contains("Message-ID: <outbox-0.preview@localhost>"),
        "{shown}"
    );
    assert!(
        shown.contains("(RCPT TO, not a header) ---\nbilling@example.com, ada@example.com"),
        "{shown}"
    );
    assert!(
        shown.contains("--- text/plain ---\nHello Analytical Engines Ltd"),
        "{shown}"
    );
    assert!(shown.contains("--- text/html ---"), "{shown}");
    let (ok, raw, _) = preview(&["--kind", "invoice_notice", "--payload", &invoice, "--raw"]);
    assert!(ok);
    assert!(
        raw.contains("\r\nContent-Disposition: attachment; filename=\"INV.pdf\"\r\n"),
        "{raw}"
    );
    let (ok, text, _) = preview(&["--kind", "invoice_notice", "--payload", &invoice, "--text"]);
    assert!(
        ok && text.starts_with("Hello Analytical Engines Ltd,"),
        "{text}"
    );
    let (ok, html, _) = preview(&["--kind", "invoice_notice", "--payload", &invoice, "--html"]);
    assert!(ok && html.starts_with("<!doctype html>"), "{html}");

    let templates = newsletter_templates();
    let dir = templates.path().display().to_string();
    let (ok, shown, _) = preview(&[
        "--templates",
        &dir,
        "--kind",
        "newsletter",
        "--payload",
        r#"{"to": "a@example.com", "name": "A", "campaign": "winter", "unsubscribe_url": "https://u"}"#,
    ]);
    assert!(
        ok && shown.contains("List-Unsubscribe: <https://u>"),
        "{shown}"
    );

    for (args, says) in [
        (
            vec![
                "--kind",
                "invoice_notice",
                "--payload",
                r#"{"to": "a@example.com"}"#,
            ],
            "`invoice_number` is undefined",
        ),
        (
            vec!["--kind", "nope", "--payload", "{}"],
            "unknown kind \"nope\"",
        ),
        (
            vec!["--kind", "invoice_notice", "--payload", "{not json"],
            "--payload is not valid JSON",
        ),
        (
            vec!["--kind", "invoice_notice", "--payload", "[1]"],
            "not a JSON object",
        ),
        (
            vec![
                "--kind",
                "workspace_invite",
                "--payload",
                r#"{"to": "a@example.com", "inviter_name": "E\r\nBcc: x@evil.test", "workspace_name": "W", "accept_url": "u"}"#,
            ],
            "header_injection",
        ),
    ] {
        let (ok, out, err) = preview(&args);
        assert!(!ok, "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
}
