//! Bounce and complaint intake: each provider's format with a valid and an invalid
//! signature. SNS messages are signed with a throwaway certificate that a local HTTPS
//! server serves, as SNS's certificate host would.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use outboxd::suppression::SuppressionReason;

use crate::helpers::{
    HttpResponse, TestCa, TestDb, app, free_port, http_full, http_get, metric_value, python,
};

const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:ses-feedback";
const POSTMARK: &str = "postmark:correct-horse-battery";

/// The certificate host: an HTTPS server with the test CA's certificate for localhost,
/// serving the SNS signing certificate.
struct CertificateHost {
    child: Child,
    root: tempfile::TempDir,
    port: u16,
}

impl CertificateHost {
    fn start(ca: &TestCa) -> Self {
        Self::start_serving_after(ca, Duration::ZERO)
    }

    /// A host that serves each file `delay` after its request.
    fn start_serving_after(ca: &TestCa, delay: Duration) -> Self {
        let root = tempfile::tempdir().unwrap();
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=sns.amazonaws.com", "-keyout"])
            .arg(root.path().join("signing.key"))
            .arg("-out")
            .arg(root.path().join("SimpleNotificationService-test.pem"))
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        let port = free_port();
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/https_server.py"))
            .args(["--port", &port.to_string(), "--root"])
            .arg(root.path())
            .args([
                "--cert",
                &ca.path("server.pem"),
                "--key",
                &ca.path("server.key"),
                "--delay",
                &delay.as_secs_f64().to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "READY");
        Self { child, root, port }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.root.path().join("requests.log")).unwrap_or_default()
    }

    /// Signs with openssl, as SNS does: `SignatureVersion` 1 is SHA-1, 2 is SHA-256.
    fn sign(&self, text: &str, version: &str) -> String {
        let digest = if version == "1" { "-sha1" } else { "-sha256" };
        let signature = piped_through(
            Command::new("openssl")
                .args(["dgst", digest, "-sign"])
                .arg(self.root.path().join("signing.key")),
            text,
        );
        base64::engine::general_purpose::STANDARD.encode(signature)
    }

    /// An SNS message of `kind`, signed over the fields AWS documents, in their order.
    fn message(&self, kind: &str, fields: &[(&str, &str)], version: &str) -> Value {
        let mut message = json!({
            "Type": kind, "MessageId": uuid::Uuid::new_v4().to_string(),
            "TopicArn": TOPIC,
            "Timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "SignatureVersion": version,
            "SigningCertURL": self.url("/SimpleNotificationService-test.pem"),
        });
        for (name, value) in fields {
            message[*name] = json!(value);
        }
        let signed: &[&str] = if kind == "Notification" {
            &[
                "Message",
                "MessageId",
                "Subject",
                "Timestamp",
                "TopicArn",
                "Type",
            ]
        } else {
            &[
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            ]
        };
        let text: String = signed
            .iter()
            .filter_map(|name| Some(format!("{name}\n{}\n", message.get(*name)?.as_str()?)))
            .collect();
        message["Signature"] = json!(self.sign(&text, version));
        message
    }
}

impl Drop for CertificateHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn post(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpResponse {
    http_full(addr, "POST", path, headers, body).await.unwrap()
}

pub(crate) async fn suppressed(db: &TestDb, address: &str) -> Option<(SuppressionReason, String)> {
    db.suppression_of(address)
        .await
        .map(|s| (s.reason.0, s.source))
}

pub(crate) async fn feedback_of(db: &TestDb, id: i64) -> Option<String> {
    db.scalar("SELECT feedback FROM outbox_messages WHERE id = $1", id)
        .await
}

/// outboxd taking the test topic's notifications, with certificates from `host`; and the
/// address of its webhooks.
async fn sns_app(db: &TestDb, ca: &TestCa, host: &CertificateHost) -> (outboxd::app::App, String) {
    let ca_file = ca.path("ca.pem");
    let hosts = format!("localhost:{}", host.port);
    let flags = [
        "--sns-topic-arns",
        TOPIC,
        "--sns-certificate-hosts",
        &hosts,
        "--sns-ca-file",
        &ca_file,
    ];
    let mut app = app(db, None, &flags).await;
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    let addr = app.admin_addr().expect("webhooks served").to_string();
    (app, addr)
}

/// Posts `body` to the Postmark webhook with `headers`: the status of the answer.
async fn postmark(addr: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> u16 {
    post(addr, "/webhooks/postmark", headers, &body.to_string())
        .await
        .status
}

#[tokio::test]
async fn sns_notifications_signed_by_a_certificate_from_an_sns_host_suppress_and_forgeries_change_nothing()
 {
    let db = TestDb::new().await;
    let ca = TestCa::new();
    let host = CertificateHost::start(&ca);
    let (app, addr) = sns_app(&db, &ca, &host).await;
    let id = db
        .enqueue(
            "account_verification",
            crate::helpers::verification("gone@example.com"),
        )
        .await;

    // The subscription is confirmed by visiting its SubscribeURL.
    let confirm = host.message(
        "SubscriptionConfirmation",
        &[
            ("Message", "You have chosen to subscribe"),
            ("Token", "tok-1"),
            (
                "SubscribeURL",
                &host.url("/confirm?Action=ConfirmSubscription&Token=tok-1"),
            ),
        ],
        "1",
    );
    let answered = post(&addr, "/webhooks/sns", &[], &confirm.to_string()).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert!(
        host.requests()
            .contains("/confirm?Action=ConfirmSubscription&Token=tok-1")
    );

    let bounce = json!({"notificationType": "Bounce",
        "bounce": {"bounceType": "Permanent", "bounceSubType": "General",
                   "bouncedRecipients": [{"emailAddress": "Gone@Example.com",
                                          "diagnosticCode": "smtp; 550 5.1.1 user unknown"}]},
        "mail": {"commonHeaders": {"messageId": format!("<outbox-{id}.{}@example.test>", db.installation_tag().await)}}});
    let notification = host.message("Notification", &[("Message", &bounce.to_string())], "2");
    let answered = post(&addr, "/webhooks/sns", &[], &notification.to_string()).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(
        suppressed(&db, "gone@example.com").await,
        Some((SuppressionReason::HardBounce, "ses".to_owned()))
    );
    assert_eq!(feedback_of(&db, id).await.as_deref(), Some("hard_bounce"));
    // Staging's bounce through a provider account production shares names a row of the
    // same id in another installation: it suppresses its address but marks no row here.
    let other = db.verification_to("ann@example.com").await;
    let staging = json!({"notificationType": "Bounce",
        "bounce": {"bounceType": "Permanent", "bouncedRecipients": [
            {"emailAddress": "staging-gone@example.com", "diagnosticCode": "smtp; 550 5.1.1"}]},
        "mail": {"commonHeaders": {"messageId": format!("<outbox-{other}.zz9zz9@example.test>")}}});
    let notification = host.message("Notification", &[("Message", &staging.to_string())], "2");
    let answered = post(&addr, "/webhooks/sns", &[], &notification.to_string()).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert!(suppressed(&db, "staging-gone@example.com").await.is_some());
    assert_eq!(feedback_of(&db, other).await, None);
    // And the report is in the message's timeline, with who said it and what.
    let timeline = outboxd::store::messages::message(&db.store, id)
        .await
        .unwrap()
        .expect("the message")
        .events;
    let reported = timeline
        .iter()
        .find(|e| e.event == "hard_bounce")
        .expect("a hard_bounce event");
    assert_eq!(reported.actor.as_deref(), Some("ses"));
    assert!(
        reported.detail.as_deref().unwrap_or("").contains("5.1.1"),
        "{reported:?}"
    );

    let complaint = json!({"notificationType": "Complaint",
        "complaint": {"complainedRecipients": [{"emailAddress": "angry@example.com"}],
                      "complaintFeedbackType": "abuse"}, "mail": {}});
    let signed = host.message("Notification", &[("Message", &complaint.to_string())], "1");
    assert_eq!(
        post(&addr, "/webhooks/sns", &[], &signed.to_string())
            .await
            .status,
        200
    );
    assert_eq!(
        suppressed(&db, "angry@example.com").await.map(|s| s.0),
        Some(SuppressionReason::Complaint)
    );

    // Forgeries: a changed message, another topic, a certificate from elsewhere.
    let other = json!({"notificationType": "Complaint",
        "complaint": {"complainedRecipients": [{"emailAddress": "victim@example.com"}]}, "mail": {}});
    let mut changed = host.message("Notification", &[("Message", &complaint.to_string())], "2");
    changed["Message"] = json!(other.to_string());
    let mut topic = host.message("Notification", &[("Message", &other.to_string())], "2");
    topic["TopicArn"] = json!("arn:aws:sns:eu-west-1:999999999999:attacker");
    let elsewhere = host.message("Notification", &[("Message", &other.to_string())], "2");
    let mut elsewhere = elsewhere;
    elsewhere["SigningCertURL"] = json!(format!(
        "https://127.0.0.1:{}/SimpleNotificationService-test.pem",
        host.port
    ));
    let with_field = |name: &str, value: String| {
        let mut message = host.message("Notification", &[("Message", &other.to_string())], "2");
        message[name] = json!(value);
        message
    };
    let plain_http = with_field(
        "SigningCertURL",
        format!(
            "http://localhost:{}/SimpleNotificationService-test.pem",
            host.port
        ),
    );
    let other_port = with_field(
        "SigningCertURL",
        "https://localhost:1/SimpleNotificationService-test.pem".into(),
    );
    let with_query = with_field(
        "SigningCertURL",
        host.url("/SimpleNotificationService-test.pem?x=1"),
    );
    let not_pem = with_field("SigningCertURL", host.url("/requests.log"));
    let version = with_field("SignatureVersion", "3".into());
    // A confirmation whose SubscribeURL leaves the SNS hosts is refused before any visit.
    let off_host = host.message(
        "SubscriptionConfirmation",
        &[
            ("Message", "x"),
            ("Token", "tok-2"),
            (
                "SubscribeURL",
                &format!("https://127.0.0.1:{}/confirm?Token=tok-2", host.port),
            ),
        ],
        "2",
    );
    let stale_time = (chrono::Utc::now() - chrono::Duration::hours(2))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let stale = host.message(
        "Notification",
        &[("Message", &other.to_string()), ("Timestamp", &stale_time)],
        "2",
    );
    // Each is refused with the same answer, which tells an unknown topic from a known
    // one no more than it tells any other check.
    let mut bad_time = host.message("Notification", &[("Message", &other.to_string())], "2");
    bad_time["Timestamp"] = json!("yesterday");
    // On an SNS host, but nothing there: as much a forgery as a bad signature.
    let nothing_there = with_field(
        "SigningCertURL",
        host.url("/SimpleNotificationService-gone.pem"),
    );
    let mut answers = std::collections::BTreeSet::new();
    for forged in [
        &bad_time,
        &nothing_there,
        &stale,
        &changed,
        &topic,
        &elsewhere,
        &plain_http,
        &other_port,
        &with_query,
        &not_pem,
        &version,
        &off_host,
    ] {
        let refused = post(&addr, "/webhooks/sns", &[], &forged.to_string()).await;
        assert_eq!(refused.status, 401, "{forged}: {}", refused.body);
        answers.insert(refused.body);
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    let not_json = post(&addr, "/webhooks/sns", &[], "hello").await;
    assert_eq!(not_json.status, 400);
    let huge = "x".repeat(600 * 1024);
    assert_eq!(post(&addr, "/webhooks/sns", &[], &huge).await.status, 413);
    assert_eq!(suppressed(&db, "victim@example.com").await, None);
    assert!(!host.requests().contains("tok-2"), "{}", host.requests());

    let (_, metrics) = http_get(&app.http_addr().to_string(), "/metrics").await;
    for series in [
        r#"outbox_bounces_received_total{source="ses",type="hard"}"#,
        r#"outbox_complaints_received_total{source="ses"}"#,
        r#"outbox_webhook_requests_total{source="ses",result="unauthorized"}"#,
        r#"outbox_webhook_requests_total{source="ses",result="too_large"}"#,
    ] {
        let value = metric_value(&metrics, series).unwrap_or_else(|| panic!("{series} missing"));
        assert!(value >= 1.0, "{series}");
    }
}

#[tokio::test]
async fn a_garbage_signed_flood_on_a_cold_certificate_cache_refuses_no_real_notification() {
    let db = TestDb::new().await;
    let ca = TestCa::new();
    // A slow host: the flood surely meets the first fetch under way, however loaded the
    // machine is, as it would a real host across the internet.
    let host = CertificateHost::start_serving_after(&ca, Duration::from_millis(500));
    let (_app, addr) = sns_app(&db, &ca, &host).await;
    let complaint = json!({"notificationType": "Complaint",
        "complaint": {"complainedRecipients": [{"emailAddress": "real@example.com"}]}, "mail": {}});
    let real = host.message("Notification", &[("Message", &complaint.to_string())], "2");
    // Right topic, fresh, a signature of the right size that does not verify, and the real
    // certificate's URL with a fragment of its own (which once forced a fetch each).
    let flood: Vec<_> = (0..30)
        .map(|n| {
            let mut forged = real.clone();
            forged["MessageId"] = json!(format!("forged-{n}"));
            forged["Signature"] =
                json!(base64::engine::general_purpose::STANDARD.encode([7u8; 256]));
            forged["SigningCertURL"] =
                json!(host.url(&format!("/SimpleNotificationService-test.pem#{n}")));
            let addr = addr.clone();
            tokio::spawn(
                async move { post(&addr, "/webhooks/sns", &[], &forged.to_string()).await },
            )
        })
        .collect();
    let answered = post(&addr, "/webhooks/sns", &[], &real.to_string()).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    for forged in flood {
        assert_ne!(forged.await.unwrap().status, 200);
    }
    assert_eq!(
        suppressed(&db, "real@example.com").await.map(|s| s.0),
        Some(SuppressionReason::Complaint)
    );
    let fetches = host
        .requests()
        .matches("SimpleNotificationService-test.pem")
        .count();
    // Requests that come together share one fetch; one that comes after they have all
    // gone (the certificate is kept only once a signature verified with it) fetches again.
    // Never one per fragment, as before.
    assert!(fetches <= 3, "{fetches} fetches: {}", host.requests());
}

fn basic(credentials: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials)
    )
}

#[tokio::test]
async fn postmark_webhooks_need_their_credentials_and_suppress_hard_bounces_and_complaints() {
    let db = TestDb::new().await;
    let mut app = app(&db, None, &["--postmark-webhook-credentials", POSTMARK]).await;
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    let addr = app.admin_addr().unwrap().to_string();
    let id = db
        .enqueue(
            "account_verification",
            crate::helpers::verification("pm@example.com"),
        )
        .await;
    let auth = basic(POSTMARK);
    let bounce = json!({"RecordType": "Bounce", "Type": "HardBounce", "TypeCode": 1,
        "Email": "pm@example.com", "Details": "smtp;550 5.1.1 The email account does not exist",
        "Metadata": {"outbox_id": id.to_string()}, "MessageStream": "outbound"});
    for (headers, status) in [
        (vec![], 401),
        (
            vec![(
                "Authorization",
                basic("postmark:wrong-password-here").as_str(),
            )],
            401,
        ),
    ] {
        let refused = post(&addr, "/webhooks/postmark", &headers, &bounce.to_string()).await;
        assert_eq!(refused.status, status);
    }
    assert_eq!(suppressed(&db, "pm@example.com").await, None);
    let headers = [("Authorization", auth.as_str())];
    assert_eq!(postmark(&addr, &headers, &bounce).await, 200);
    assert_eq!(
        suppressed(&db, "pm@example.com").await,
        Some((SuppressionReason::HardBounce, "postmark".to_owned()))
    );
    assert_eq!(feedback_of(&db, id).await.as_deref(), Some("hard_bounce"));
    let soft = json!({"RecordType": "Bounce", "Type": "SoftBounce", "Email": "full@example.com"});
    assert_eq!(postmark(&addr, &headers, &soft).await, 200);
    assert_eq!(
        suppressed(&db, "full@example.com").await,
        None,
        "a soft bounce suppresses nobody"
    );
    let spam = json!({"RecordType": "SpamComplaint", "Type": "SpamComplaint", "Email": "spam@example.com"});
    assert_eq!(postmark(&addr, &headers, &spam).await, 200);
    assert_eq!(
        suppressed(&db, "spam@example.com").await.map(|s| s.0),
        Some(SuppressionReason::Complaint)
    );
    let unknown = post(
        &addr,
        "/webhooks/postmark",
        &headers,
        r#"{"Type": "HardBounce"}"#,
    )
    .await;
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    // Off unless configured.
    assert_eq!(
        post(&addr, "/webhooks/standard", &headers, "{}")
            .await
            .status,
        404
    );
}

/// HMAC-SHA256 with openssl, as a Standard Webhooks sender computes it.
/// Posts `body` to the Standard Webhooks endpoint, signed now with `secret` as the
/// `standardwebhooks` package signs it.
pub(crate) async fn post_standard(addr: &str, secret: &[u8], id: &str, body: &str) -> HttpResponse {
    let now = chrono::Utc::now().timestamp().to_string();
    let signature = standard_signature(secret, id, &now, body);
    let headers = [
        ("webhook-id", id),
        ("webhook-timestamp", now.as_str()),
        ("webhook-signature", signature.as_str()),
    ];
    post(addr, "/webhooks/standard", &headers, body).await
}

pub(crate) fn standard_signature(secret: &[u8], id: &str, timestamp: &str, body: &str) -> String {
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let signed = format!("{id}.{timestamp}.{body}");
    let mac = piped_through(
        Command::new("openssl").args([
            "mac",
            "-digest",
            "SHA256",
            "-macopt",
            &format!("hexkey:{hex}"),
            "-binary",
            "HMAC",
        ]),
        &signed,
    );
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    )
}

/// What `command` writes to its standard output when `text` is its standard input; it must
/// succeed.
fn piped_through(command: &mut Command, text: &str) -> Vec<u8> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the command");
    child
        .stdin
        .take()
        .expect("its standard input")
        .write_all(text.as_bytes())
        .expect("its input written");
    let output = child.wait_with_output().expect("its output");
    assert!(output.status.success(), "{command:?}");
    output.stdout
}

#[tokio::test]
async fn the_standard_webhook_takes_signed_bounces_complaints_and_unsubscribes_and_refuses_the_rest()
 {
    let db = TestDb::new().await;
    let secret = [42u8; 32];
    let whsec = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(secret)
    );
    let mut app = app(&db, None, &["--webhook-secret", &whsec]).await;
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    let addr = app.admin_addr().unwrap().to_string();
    let now = chrono::Utc::now().timestamp().to_string();
    let send = |body: Value, id: &str, timestamp: &str, signature: Option<String>| {
        let addr = addr.clone();
        let (id, timestamp) = (id.to_owned(), timestamp.to_owned());
        async move {
            let body = body.to_string();
            let signature =
                signature.unwrap_or_else(|| standard_signature(&secret, &id, &timestamp, &body));
            let headers = [
                ("webhook-id", id.as_str()),
                ("webhook-timestamp", timestamp.as_str()),
                ("webhook-signature", signature.as_str()),
            ];
            post(&addr, "/webhooks/standard", &headers, &body).await
        }
    };
    for (event, address, reason) in [
        (
            json!({"type": "email.bounced", "data": {"email": "h@example.com", "bounce_type": "hard"}}),
            "h@example.com",
            SuppressionReason::HardBounce,
        ),
        (
            json!({"type": "email.complained", "data": {"email": "c@example.com"}}),
            "c@example.com",
            SuppressionReason::Complaint,
        ),
        (
            json!({"type": "email.unsubscribed", "data": {"email": "u@example.com"}}),
            "u@example.com",
            SuppressionReason::Unsubscribe,
        ),
    ] {
        let answered = send(event, &format!("msg_{address}"), &now, None).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        assert_eq!(suppressed(&db, address).await.map(|s| s.0), Some(reason));
    }
    let victim = json!({"type": "email.complained", "data": {"email": "victim@example.com"}});
    let stale = (chrono::Utc::now().timestamp() - 600).to_string();
    let other_secret = standard_signature(&[1u8; 32], "msg_2", &now, &victim.to_string());
    for (response, says) in [
        (
            send(victim.clone(), "msg_2", &now, Some(other_secret)).await,
            "no webhook-signature verifies",
        ),
        (
            send(victim.clone(), "msg_2", &stale, None).await,
            "five minutes",
        ),
        (
            send(victim.clone(), "msg_2", &now, Some("v1,AAAA".into())).await,
            "no v1 signature of 32 bytes",
        ),
    ] {
        assert_eq!(response.status, 401, "{}", response.body);
        assert!(response.body.contains(says), "{}", response.body);
    }
    let unsigned = post(&addr, "/webhooks/standard", &[], &victim.to_string()).await;
    assert_eq!(unsigned.status, 401);
    assert!(unsigned.body.contains("webhook-id"), "{}", unsigned.body);
    for bad in [
        json!({"type": "email.opened", "data": {"email": "x@example.com"}}),
        json!({"type": "email.bounced", "data": {"email": "x@example.com", "bounce_type": "very"}}),
        json!({"type": "email.bounced", "data": {"email": "not an address"}}),
        json!({"data": {}}),
    ] {
        let refused = send(bad.clone(), "msg_3", &now, None).await;
        assert_eq!(refused.status, 400, "{bad}: {}", refused.body);
    }
    assert_eq!(suppressed(&db, "victim@example.com").await, None);
    assert_eq!(suppressed(&db, "x@example.com").await, None);
}

#[tokio::test]
async fn webhook_settings_that_cannot_work_stop_outboxd_before_it_starts() {
    let db = TestDb::new().await;
    for (flags, says) in [
        (
            vec!["--webhook-secret", "not-whsec"],
            "OUTBOXD_WEBHOOK_SECRET",
        ),
        (
            vec!["--webhook-secret", "whsec_c2hvcnQ="],
            "at least 24 bytes",
        ),
        (
            vec!["--postmark-webhook-credentials", "user:short"],
            "at least 16",
        ),
        (vec!["--sns-topic-arns", "my-topic"], "is not an ARN"),
        (
            vec!["--sns-topic-arns", "arn:aws:sns:eu-west-1:123:x"],
            "is not an ARN",
        ),
        (
            vec!["--sns-ca-file", "/etc/hostname"],
            "OUTBOXD_SNS_TOPIC_ARNS is not",
        ),
        (
            vec![
                "--sns-topic-arns",
                TOPIC,
                "--sns-certificate-hosts",
                "bad host",
            ],
            "OUTBOXD_SNS_CERTIFICATE_HOSTS",
        ),
    ] {
        let output = crate::helpers::outboxd()
            .args(["run", "--database-url", &db.url])
            .args(&flags)
            .output()
            .unwrap();
        crate::helpers::assert_refused(&output, says);
    }
}
