//! The intake held against anyone on the internet, with the real binary: requests that
//! cost outboxd more than they cost the caller, bodies trickled to hold connections, and
//! reports crafted to suppress someone else. Each test is bounded in time; none asserts
//! on a duration (the benchmark measures the floods).

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use outboxd::http::server::BODY_TIMEOUT;
use outboxd::suppression::SuppressionReason;

use crate::helpers::{Outboxd, SmtpServer, TestDb, eventually, free_port, http_get, verification};
use crate::webhooks::{post, post_standard, suppressed};

const SECRET: [u8; 32] = [42; 32];
const ADMIN_TOKEN: &str = "intake-test-admin-token-0123456789";

fn whsec() -> String {
    use base64::Engine as _;
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SECRET)
    )
}

/// outboxd with the Standard Webhooks endpoint, on its main listener or, with
/// `admin_listen`, on an admin listener of its own (whose address is returned).
async fn with_webhooks(db: &TestDb, smtp: &SmtpServer, admin_listen: bool) -> (Outboxd, String) {
    let admin = format!("127.0.0.1:{}", free_port());
    let secret = whsec();
    let smtp_url = smtp.url();
    let mut flags = vec!["--webhook-secret", &secret];
    if admin_listen {
        flags.extend(["--admin-listen", &admin, "--admin-token", ADMIN_TOKEN]);
    }
    let outboxd = Outboxd::sending_to(&db.url, &smtp_url, &flags, &[]).await;
    let webhooks = if admin_listen {
        admin
    } else {
        outboxd.http.clone()
    };
    (outboxd, webhooks)
}

/// A signed Standard Webhooks POST of `body`.
async fn signed(addr: &str, id: &str, body: &serde_json::Value) -> crate::helpers::HttpResponse {
    post_standard(addr, &SECRET, id, &body.to_string()).await
}

/// Sends a request head (and `body_start`), then reads the answer that comes without the
/// rest of the body, within `within`.
async fn answer_before_the_body(
    addr: &str,
    head: &str,
    body_start: &[u8],
    within: Duration,
) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body_start).await.unwrap();
    let mut answer = vec![0_u8; 4096];
    let n = tokio::time::timeout(within, stream.read(&mut answer))
        .await
        .expect("an answer before the body is sent")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// Connections that each send a POST head announcing a body, then a byte of it every
/// second, until dropped.
struct Tricklers(tokio::task::JoinHandle<()>);

impl Tricklers {
    async fn open(addr: &str, path: &str, count: usize) -> Self {
        let mut streams = Vec::new();
        for _ in 0..count {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 webhook-id: t\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1,{}\r\n\
                 Content-Length: 100000\r\n\r\n{{",
                chrono::Utc::now().timestamp(),
                "A".repeat(43) + "="
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            streams.push(stream);
        }
        Self(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                for stream in &mut streams {
                    let _ = stream.write_all(b" ").await;
                }
            }
        }))
    }
}

impl Drop for Tricklers {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test]
async fn a_stuffed_or_stale_signature_header_is_refused_before_the_body_is_read() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    let now = chrono::Utc::now().timestamp();
    // About 3 500 entries fit in the 16 KiB head: none of them a 32-byte tag.
    let stuffed = vec!["v1,"; 3500].join(" ");
    let stale = format!("v1,{}=", "A".repeat(43));
    for (timestamp, signature, says) in [
        (now, stuffed.as_str(), "no v1 signature of 32 bytes"),
        (now - 600, stale.as_str(), "five minutes"),
    ] {
        let head = format!(
            "POST /webhooks/standard HTTP/1.1\r\nHost: x\r\nwebhook-id: msg_1\r\n\
             webhook-timestamp: {timestamp}\r\nwebhook-signature: {signature}\r\n\
             Content-Length: 524288\r\n\r\n"
        );
        let answer = answer_before_the_body(&addr, &head, b"", Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(answer.contains(says), "{answer}");
    }
    // As many well-formed tags as fit pass every check made before the body; the body then
    // costs one HMAC (the unit tests hold that only the first few are compared).
    let tags = vec![format!("v1,{}=", "A".repeat(43)); 320].join(" ");
    let now = now.to_string();
    let headers = [
        ("webhook-id", "msg_2"),
        ("webhook-timestamp", now.as_str()),
        ("webhook-signature", tags.as_str()),
    ];
    let body = json!({"type": "email.complained", "data": {"email": "victim@example.com"}});
    let refused = post(&addr, "/webhooks/standard", &headers, &body.to_string()).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(
        refused.body.contains("no webhook-signature verifies"),
        "{}",
        refused.body
    );
    assert_eq!(suppressed(&db, "victim@example.com").await, None);
}

#[tokio::test]
async fn a_declared_body_over_the_limit_gets_413_before_any_of_it_is_sent() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (outboxd, admin) = with_webhooks(&db, &smtp, true).await;
    // Headers that pass the webhook's checks before its body.
    let signed_headers = format!(
        "webhook-id: msg_1\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1,{}=\r\n",
        chrono::Utc::now().timestamp(),
        "A".repeat(43)
    );
    for (addr, path) in [
        (admin.as_str(), "/webhooks/standard"),
        (admin.as_str(), "/api/v1/dead-letters/retry"),
        (outboxd.http.as_str(), "/livez"),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{signed_headers}Content-Length: 10000000000\r\n\r\n"
        );
        let answer = answer_before_the_body(addr, &head, b"", Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
    }
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_cut_off() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    let now = chrono::Utc::now().timestamp();
    let head = format!(
        "POST /webhooks/standard HTTP/1.1\r\nHost: x\r\nwebhook-id: msg_1\r\n\
         webhook-timestamp: {now}\r\nwebhook-signature: v1,{}=\r\nContent-Length: 1000\r\n\r\n",
        "A".repeat(43)
    );
    let answer =
        answer_before_the_body(&addr, &head, b"{", BODY_TIMEOUT + Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn trickled_bodies_on_the_admin_listener_leave_room_for_a_signed_bounce() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, admin) = with_webhooks(&db, &smtp, true).await;
    // As many as the admin listener takes (256), and then some.
    let _tricklers = Tricklers::open(&admin, "/webhooks/standard", 300).await;
    let bounce = json!({"type": "email.bounced",
        "data": {"email": "gone@example.com", "bounce_type": "hard"}});
    let answered = signed(&admin, "msg_bounce", &bounce).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(
        suppressed(&db, "gone@example.com").await.map(|s| s.0),
        Some(SuppressionReason::HardBounce)
    );
}

#[tokio::test]
async fn trickled_bodies_on_the_main_listener_leave_the_probes_answering() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (outboxd, _) = with_webhooks(&db, &smtp, false).await;
    // Past the main listener's cap of 256.
    let _tricklers = Tricklers::open(&outboxd.http, "/webhooks/standard", 300).await;
    for path in ["/livez", "/readyz", "/metrics"] {
        let (status, body) = http_get(&outboxd.http, path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    db.verification_to("through@example.com").await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_bounce_for_a_lookalike_address_suppresses_only_that_address() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    // KELVIN SIGN lower-cases to `k` under Unicode's rules.
    let bounce = json!({"type": "email.bounced",
        "data": {"email": "\u{212A}ate@example.com", "bounce_type": "hard"}});
    let answered = signed(&addr, "msg_kelvin", &bounce).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(
        suppressed(&db, "\u{212A}ate@example.com")
            .await
            .map(|s| s.0),
        Some(SuppressionReason::HardBounce)
    );
    assert_eq!(suppressed(&db, "kate@example.com").await, None);
    db.verification_to("kate@example.com").await;
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received[0].rcpt_tos, ["kate@example.com"]);
}

#[tokio::test]
async fn a_complaint_during_an_operators_pause_suppresses_for_good_and_says_so() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    sqlx::query(
        "INSERT INTO outbox_suppressions (address, reason, source, created_by, suppressed_until) \
         VALUES ('paused@example.com', 'manual', 'operator', 'ops', $1)",
    )
    .bind(until)
    .execute(&db.pool)
    .await
    .unwrap();
    let complaint = json!({"type": "email.complained", "data": {"email": "Paused@example.com"}});
    let answered = signed(&addr, "msg_complaint", &complaint).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert!(answered.body.contains("1 suppressed"), "{}", answered.body);
    let (until, reason): (Option<chrono::DateTime<chrono::Utc>>, String) = sqlx::query_as(
        "SELECT suppressed_until, reason FROM outbox_suppressions WHERE address = 'paused@example.com'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((until, reason.as_str()), (None, "complaint"));
    // The same notification again changes nothing, and says so.
    let again = signed(&addr, "msg_complaint", &complaint).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert!(again.body.contains("already recorded"), "{}", again.body);
}

#[tokio::test]
async fn a_replayed_notification_does_not_undo_an_operators_removal() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    let complaint = json!({"type": "email.complained", "data": {"email": "ann@example.com"}});
    assert_eq!(signed(&addr, "msg_once", &complaint).await.status, 200);
    outboxd::store::suppressions::remove(
        &db.store,
        &outboxd::suppression::Address::parse("ann@example.com").unwrap(),
        None,
        &outboxd::store::admin::Operator::named("ops"),
    )
    .await
    .unwrap();
    // Captured and sent again inside the five minutes the signature is good for.
    let replay = signed(&addr, "msg_once", &complaint).await;
    assert_eq!(replay.status, 200, "{}", replay.body);
    assert_eq!(suppressed(&db, "ann@example.com").await, None);
}

#[tokio::test]
async fn a_report_marks_a_message_only_if_it_was_sent_to_the_address_reported() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (_outboxd, addr) = with_webhooks(&db, &smtp, false).await;
    let id = db
        .enqueue(
            "account_verification",
            verification("Rita <Rita@Example.com>"),
        )
        .await;
    smtp.wait_for(1, Duration::from_secs(30)).await;
    for (report_id, email, marked) in [
        ("msg_other", "someone-else@example.com", false),
        ("msg_rita", "rita@example.com", true),
    ] {
        let bounce = json!({"type": "email.bounced",
            "data": {"email": email, "bounce_type": "soft", "outbox_id": id}});
        let answered = signed(&addr, report_id, &bounce).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        let feedback = crate::webhooks::feedback_of(&db, id).await;
        assert_eq!(feedback.is_some(), marked, "{email}: {}", answered.body);
    }
}

#[tokio::test]
async fn refused_requests_are_not_echoed_and_are_logged_once_a_minute() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let secret = whsec();
    let outboxd = Outboxd::sending_to(
        &db.url,
        &smtp.url(),
        &["--webhook-secret", &secret, "--log-format", "text"],
        &[],
    )
    .await;
    let hostile =
        json!({"type": "email.\u{1b}[31mred\ninjected line", "data": {"email": "x@example.com"}});
    for n in 0..50 {
        let answered = signed(&outboxd.http, &format!("msg_{n}"), &hostile).await;
        assert_eq!(answered.status, 400);
        assert!(!answered.body.contains("injected"), "{}", answered.body);
    }
    eventually(
        Duration::from_secs(10),
        "a request served after them",
        || async { http_get(&outboxd.http, "/livez").await.0 == 200 },
    )
    .await;
    outboxd.sigterm();
    let (_, stderr) = outboxd.wait(Duration::from_secs(30));
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("refused webhook"))
        .collect();
    assert_eq!(refusals.len(), 1, "{stderr}");
}

#[tokio::test]
async fn the_admin_surface_answers_only_to_the_hosts_it_knows() {
    let db = TestDb::new().await;
    let admin = format!("127.0.0.1:{}", free_port());
    let outboxd = Outboxd::start(
        &db.url,
        &[
            "--admin-listen",
            &admin,
            "--admin-token",
            ADMIN_TOKEN,
            "--admin-hosts",
            "admin.example.com",
        ],
        &[],
    )
    .await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    for (host, status) in [
        ("127.0.0.1", 200),
        ("localhost:9899", 200),
        ("admin.example.com", 200),
        // A name of an attacker's that resolves to this address: DNS rebinding.
        ("rebind.attacker.test:9899", 421),
    ] {
        let answered = crate::helpers::http_full(
            &admin,
            "GET",
            "/api/v1/stats",
            &[("Host", host), ("Authorization", &bearer)],
            "",
        )
        .await
        .unwrap();
        assert_eq!(answered.status, status, "{host}: {}", answered.body);
    }
    drop(outboxd);
}

#[tokio::test]
async fn webhooks_that_share_the_metrics_listener_are_warned_of() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let (outboxd, _) = with_webhooks(&db, &smtp, false).await;
    outboxd.sigterm();
    let (_, stderr) = outboxd.wait(Duration::from_secs(30));
    assert!(
        stderr.contains("share OUTBOXD_LISTEN with /metrics"),
        "{stderr}"
    );
}
