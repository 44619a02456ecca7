//! One-click unsubscribe (RFC 8058) against the binary: a bulk email carries both headers
//! inside a DKIM signature dkimpy verifies; the POST a mailbox provider sends suppresses
//! later bulk mail to that address only; a GET changes nothing; a token changed by one
//! character records nothing; a flood of forgeries leaves the probes and a real click
//! answered. And a kind with its own `from` is signed for its own domain.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::content::DkimKeyPair;
use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, http_full, http_get, metric_value, outboxd, preview,
    python, refusal_saying,
};

const SECRET: &str = "unsubscribe-secret-0123456789abcdef0123";
const PUBLIC_URL: &str = "https://mail.example.test";
const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");
const ONE_CLICK: &str = "List-Unsubscribe=One-Click";

pub(crate) fn invoice(to: &str) -> Value {
    json!({"to": to, "customer_name": "Ada", "invoice_number": "INV-1", "amount": "1.00",
           "currency": "EUR", "due_date": "2027-01-01",
           "invoice_url": "https://app.example/invoices/1"})
}

/// The path of the one-click link in a received `List-Unsubscribe` value.
pub(crate) fn link_path(list_unsubscribe: &str) -> String {
    let start = list_unsubscribe.find(PUBLIC_URL).expect("outboxd's link") + PUBLIC_URL.len();
    let end = start + list_unsubscribe[start..].find('>').expect("the link's end");
    list_unsubscribe[start..end].to_owned()
}

/// What dkimpy says of each received message, given the main key and `more` keys' records.
fn dkim_verified(smtp: &SmtpServer, main: &DkimKeyPair, more: &[(&str, &str, &str)]) -> Vec<Value> {
    let more: Vec<String> = more
        .iter()
        .map(|(s, d, k)| format!("{s}:{d}:{k}"))
        .collect();
    let verified = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/dkim_verify.py"
        ))
        .arg(smtp.spool())
        .args(["s2026", "example.test", &main.public_der_base64])
        .env("DKIM_MORE_KEYS", more.join(","))
        .output()
        .expect("dkim_verify.py");
    assert!(verified.status.success(), "{verified:?}");
    String::from_utf8_lossy(&verified.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A database, an SMTP server, and outboxd sending invoice notices in the bulk lane, with
/// one-click unsubscribe and DKIM.
pub(crate) struct BulkSending {
    pub db: TestDb,
    pub smtp: SmtpServer,
    pub key: DkimKeyPair,
    pub outboxd: Outboxd,
}

impl BulkSending {
    pub async fn start() -> Self {
        let (db, smtp, key) = (TestDb::new().await, SmtpServer::start(), DkimKeyPair::new());
        let key_path = key.key_path();
        let flags = [
            "--bulk-kinds",
            "invoice_notice",
            "--public-url",
            PUBLIC_URL,
            "--unsubscribe-secret",
            SECRET,
            "--dkim-domain",
            "example.test",
            "--dkim-selector",
            "s2026",
            "--dkim-private-key-file",
            &key_path,
        ];
        let outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
        Self {
            db,
            smtp,
            key,
            outboxd,
        }
    }

    /// Sends `to` an invoice notice: its one-click link's path.
    pub async fn a_link_to(&self, to: &str) -> String {
        a_link_to(&self.db, &self.smtp, to).await
    }
}

/// Sends `to` an invoice notice (a bulk kind here): its one-click link's path.
async fn a_link_to(db: &TestDb, smtp: &SmtpServer, to: &str) -> String {
    db.enqueue("invoice_notice", invoice(to)).await;
    let sent =
        crate::helpers::poll_until(Duration::from_secs(30), "the invoice notice", || async {
            smtp.messages()
                .into_iter()
                .find(|m| m.rcpt_tos.iter().any(|r| r == to))
        })
        .await;
    link_path(sent.header("List-Unsubscribe").expect("List-Unsubscribe"))
}

/// How many lane entries the list holds for `address`.
pub(crate) async fn lane_entries(db: &TestDb, address: &str) -> i64 {
    db.scalar(
        "SELECT count(*) FROM outbox_lane_suppressions WHERE address = $1",
        address,
    )
    .await
}

async fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let response = http_full(addr, "POST", path, headers, body)
        .await
        .expect("a response");
    (response.status, response.body)
}

#[tokio::test]
async fn a_bulk_email_carries_a_signed_one_click_link_that_stops_bulk_mail_to_its_recipient_only() {
    let sending = BulkSending::start().await;
    let BulkSending {
        db,
        smtp,
        key,
        outboxd,
    } = &sending;
    let addr = outboxd.http.clone();

    db.enqueue("invoice_notice", invoice("Ada@Example.com"))
        .await;
    db.verification_to("bo@example.com").await;
    let received = smtp.wait_for(2, Duration::from_secs(30)).await;
    let bulk = received
        .iter()
        .find(|m| m.subject.contains("Invoice"))
        .expect("the invoice");
    let transactional = received
        .iter()
        .find(|m| !m.subject.contains("Invoice"))
        .expect("the other");
    let list_unsubscribe = bulk.header("List-Unsubscribe").expect("List-Unsubscribe");
    assert_eq!(bulk.header("List-Unsubscribe-Post"), Some(ONE_CLICK));
    assert_eq!(
        transactional.header("List-Unsubscribe"),
        None,
        "transactional mail has none"
    );
    let path = link_path(list_unsubscribe);
    assert!(path.starts_with("/unsubscribe/"), "{path}");
    assert!(
        !path.to_lowercase().contains("ada"),
        "the address cannot be read off the link"
    );

    // Both headers are inside the signature, which an independent verifier accepts.
    for line in dkim_verified(smtp, key, &[]) {
        assert_eq!(line["verified"], true, "{line}");
        assert_eq!(line["tampered_verified"], false, "{line}");
        let signature = line["signature"].as_str().unwrap().to_lowercase();
        let signed: String = signature.split_whitespace().collect();
        assert!(
            signed.contains("list-unsubscribe:list-unsubscribe-post"),
            "{signature}"
        );
    }

    // A mail scanner follows the link: a page with a button, nothing recorded.
    let (status, page) = http_get(&addr, &path).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<form method=\"post\"") && page.contains("Unsubscribe"),
        "{page}"
    );
    assert_eq!(
        lane_entries(db, "ada@example.com").await,
        0,
        "a GET changes nothing"
    );

    // A token changed in one character: the same answer as any junk, nothing recorded.
    let mut forged = path.clone().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let refused = post(&addr, &forged, &[FORM], ONE_CLICK).await;
    assert_eq!(refused.0, 404);
    assert_eq!(
        post(&addr, "/unsubscribe/junk", &[FORM], ONE_CLICK).await,
        refused
    );
    let not_text = post(&addr, "/unsubscribe/%FF%FE", &[FORM], ONE_CLICK).await;
    assert_eq!(not_text, refused);
    assert_eq!(http_get(&addr, &forged).await, refused);
    assert_eq!(lane_entries(db, "ada@example.com").await, 0);

    // The mailbox provider's POST: 200, no redirect; again, the same.
    for _ in 0..2 {
        let (status, body) = post(&addr, &path, &[FORM], ONE_CLICK).await;
        assert_eq!(status, 200, "{body}");
    }
    let entry: (String, String, String) = db
        .one_row(
            "SELECT lane, reason, source FROM outbox_lane_suppressions WHERE address = $1",
            "ada@example.com",
        )
        .await;
    assert_eq!(
        entry,
        ("bulk".into(), "unsubscribe".into(), "one-click".into())
    );

    // Her next invoice notice is not sent; her account verification is.
    let invoice_id = db
        .enqueue("invoice_notice", invoice("ada@example.com"))
        .await;
    let verification_id = db.verification_to("ada@example.com").await;
    assert_eq!(db.ended(invoice_id).await.0.as_deref(), Some("suppressed"));
    assert_eq!(db.ended(verification_id).await.0, None, "sent");
    assert!(db.row(verification_id).await.dispatched);

    let metrics = http_get(&addr, "/metrics").await.1;
    let count = |result: &str| {
        metric_value(
            &metrics,
            &format!("outbox_unsubscribes_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("recorded"), Some(1.0));
    assert_eq!(count("already_recorded"), Some(1.0));
    assert_eq!(count("refused"), Some(3.0));
}

#[tokio::test]
async fn the_rfc_bodies_are_taken_in_both_encodings_and_any_other_body_changes_nothing() {
    let sending = BulkSending::start().await;
    let BulkSending { db, outboxd, .. } = &sending;
    let addr = outboxd.http.clone();
    let ada = sending.a_link_to("ada@example.com").await;
    sending.a_link_to("bo@example.com").await;

    // Not RFC 8058's body, or too large: refused, nothing recorded.
    assert_eq!(post(&addr, &ada, &[FORM], "").await.0, 400);
    assert_eq!(
        post(&addr, &ada, &[FORM], "List-Unsubscribe=Yes").await.0,
        400
    );
    assert_eq!(post(&addr, &ada, &[FORM], &"x".repeat(5000)).await.0, 413);
    assert_eq!(lane_entries(db, "ada@example.com").await, 0);

    // The RFC prefers multipart/form-data.
    let boundary = "b0undary";
    let multipart = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\n\
         One-Click\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let (status, body) = post(&addr, &ada, &[("Content-Type", &content_type)], &multipart).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(lane_entries(db, "ada@example.com").await, 1);
    assert_eq!(
        lane_entries(db, "bo@example.com").await,
        0,
        "only the link's address"
    );
}

#[tokio::test]
async fn a_flood_of_forged_links_leaves_the_probes_and_a_real_click_answered() {
    let sending = BulkSending::start().await;
    let path = sending.a_link_to("ada@example.com").await;
    let BulkSending { db, outboxd, .. } = sending;
    let addr = outboxd.http.clone();

    let flood: Vec<_> = (0..2000)
        .map(|i| {
            let addr = addr.clone();
            let forged = format!("{}{i:04}", &path[..path.len() - 4]);
            // A connection the server closed to make room answers nothing: 0.
            tokio::spawn(async move {
                let answer = http_full(&addr, "POST", &forged, &[FORM], ONE_CLICK).await;
                answer.map_or(0, |r| r.status)
            })
        })
        .collect();
    assert_eq!(
        http_get(&addr, "/livez").await.0,
        200,
        "the probe is answered meanwhile"
    );
    // The real click gets through, as a browser's would (it opens a connection again when
    // one is closed to make room).
    eventually(
        Duration::from_secs(10),
        "the real click answered",
        || async {
            let answer = http_full(&addr, "POST", &path, &[FORM], ONE_CLICK).await;
            answer.is_ok_and(|r| r.status == 200)
        },
    )
    .await;
    for answer in flood {
        let status = answer.await.unwrap();
        // 404 from the route; or, from the listener, a closed connection or a 503 when
        // every connection is at work: neither records anything.
        assert!(matches!(status, 0 | 404 | 503), "a forgery got {status}");
    }
    assert_eq!(lane_entries(&db, "ada@example.com").await, 1);
    outboxd.sigterm();
    let (_, log) = outboxd.wait(Duration::from_secs(30));
    assert!(
        !log.to_lowercase().contains("ada@example.com"),
        "the log holds no address"
    );
}

#[tokio::test]
async fn a_kind_with_its_own_from_is_signed_with_its_own_domains_key() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (main, news) = (DkimKeyPair::new(), DkimKeyPair::new());
    let templates = tempfile::tempdir().unwrap();
    let folder = templates.path().join("news");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("subject.txt"), "News for {{ name }}").unwrap();
    std::fs::write(folder.join("body.txt"), "Hello {{ name }}").unwrap();
    std::fs::write(
        folder.join("kind.toml"),
        "lane = \"bulk\"\nfrom = \"News <hello@news.other.test>\"\n",
    )
    .unwrap();
    let (main_key, news_key) = (main.key_path(), news.key_path());
    let more = format!("news.other.test:n2026:{news_key}");
    let dir = templates.path().display().to_string();
    let flags = [
        "--from-domains",
        "example.com,news.other.test",
        "--templates",
        &dir,
        "--dkim-domain",
        "example.test",
        "--dkim-selector",
        "s2026",
        "--dkim-private-key-file",
        &main_key,
        "--dkim-keys",
        &more,
    ];
    let _outboxd = Outboxd::sending_to(&db.url, &smtp.url(), &flags, &[]).await;
    let news_id = db
        .enqueue("news", json!({"to": "ada@example.com", "name": "Ada"}))
        .await;
    db.verification_to("bo@example.com").await;
    smtp.wait_for(2, Duration::from_secs(30)).await;

    let lines = dkim_verified(
        &smtp,
        &main,
        &[("n2026", "news.other.test", &news.public_der_base64)],
    );
    assert_eq!(lines.len(), 2);
    for line in lines {
        assert_eq!(line["verified"], true, "{line}");
        let signature = line["signature"].as_str().unwrap();
        let expected = if line["outbox_id"].as_str().and_then(|id| id.parse().ok()) == Some(news_id)
        {
            "d=news.other.test"
        } else {
            "d=example.test"
        };
        assert!(signature.contains(expected), "{signature}");
        assert_eq!(
            signature.matches("d=").count(),
            1,
            "one domain's signature: {signature}"
        );
    }
}

#[test]
fn each_kind_of_bad_unsubscribe_or_dkim_setting_is_refused_at_start() {
    let run_refused = |flags: &[&str], says: &str| {
        let output = outboxd()
            .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
            .args(flags)
            .output()
            .expect("outboxd run");
        refusal_saying(&output, says);
    };
    let secret = ["--unsubscribe-secret", SECRET];
    run_refused(&["--public-url", "http://mail.example.test"], "needs both");
    run_refused(&secret, "needs both");
    run_refused(
        &[&secret[..], &["--public-url", "http://mail.example.test"]].concat(),
        "HTTPS",
    );
    run_refused(
        &["--public-url", PUBLIC_URL, "--unsubscribe-secret", "short"],
        "at least 32",
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{SECRET}\n")).unwrap();
    let file = file.path().display().to_string();
    run_refused(
        &[
            &secret[..],
            &[
                "--public-url",
                PUBLIC_URL,
                "--unsubscribe-secret-file",
                &file,
            ],
        ]
        .concat(),
        "give one",
    );
    run_refused(
        &["--dkim-keys", "news.example.test:n1:/k.pem"],
        "needs OUTBOXD_DKIM_DOMAIN",
    );
    let key = DkimKeyPair::new();
    let main_key = key.key_path();
    let twice = format!("example.test:s1:{main_key}");
    for (more, says) in [
        ("news.example.test:n1", "DOMAIN:SELECTOR:KEY_FILE"),
        (
            "news.example.test:n1:/nonexistent.pem",
            "cannot read OUTBOXD_DKIM_KEYS",
        ),
        (twice.as_str(), "given twice"),
    ] {
        let main = ["--dkim-domain", "example.test", "--dkim-selector", "s1"];
        let key_file = ["--dkim-private-key-file", main_key.as_str()];
        run_refused(
            &[&main[..], &key_file, &["--dkim-keys", more]].concat(),
            says,
        );
    }
}

#[test]
fn preview_shows_a_bulk_kinds_one_click_headers() {
    let payload = invoice("ada@example.com").to_string();
    let flags = [
        "--raw",
        "--bulk-kinds",
        "invoice_notice",
        "--public-url",
        PUBLIC_URL,
        "--unsubscribe-secret",
        SECRET,
    ];
    let raw = preview("invoice_notice", &payload, &flags);
    assert!(
        raw.contains(&format!("List-Unsubscribe: <{PUBLIC_URL}/unsubscribe/")),
        "{raw}"
    );
    assert!(
        raw.contains("List-Unsubscribe-Post: List-Unsubscribe=One-Click"),
        "{raw}"
    );
    let transactional = preview("invoice_notice", &payload, &flags[..1]);
    assert!(
        !transactional.contains("List-Unsubscribe"),
        "{transactional}"
    );
}

#[test]
fn a_bulk_kinds_declared_mailto_follows_outboxds_link_and_its_other_uris_give_way() {
    let templates = tempfile::tempdir().unwrap();
    let folder = templates.path().join("news");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("subject.txt"), "News").unwrap();
    std::fs::write(folder.join("body.txt"), "Hello").unwrap();
    std::fs::write(folder.join("kind.toml"), "lane = \"bulk\"\n").unwrap();
    std::fs::write(
        folder.join("headers.txt"),
        "List-Unsubscribe: <https://app.example/u?t={{ token }}>, <mailto:{{ unsubscribe_mailbox }}>\n\
         List-Unsubscribe-Post: List-Unsubscribe=One-Click\n",
    )
    .unwrap();
    let dir = templates.path().display().to_string();
    let payload = json!({"to": "ada@example.com", "token": "t1",
                         "unsubscribe_mailbox": "unsub@example.com?subject=ada"})
    .to_string();
    let raw = preview(
        "news",
        &payload,
        &[
            "--raw",
            "--templates",
            &dir,
            "--public-url",
            PUBLIC_URL,
            "--unsubscribe-secret",
            SECRET,
        ],
    );
    let unfolded = raw.replace("\r\n ", " ");
    let header = unfolded
        .lines()
        .find(|line| line.starts_with("List-Unsubscribe:"))
        .expect("List-Unsubscribe");
    assert!(
        header.starts_with(&format!("List-Unsubscribe: <{PUBLIC_URL}/unsubscribe/")),
        "{header}"
    );
    assert!(
        header.ends_with(", <mailto:unsub@example.com?subject=ada>"),
        "{header}"
    );
    assert!(
        !header.contains("app.example"),
        "outboxd's link replaces the kind's: {header}"
    );
    assert_eq!(raw.matches("List-Unsubscribe-Post:").count(), 1, "{raw}");
}
