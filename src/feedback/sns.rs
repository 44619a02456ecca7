//! Amazon SES bounce and complaint notifications, delivered by SNS.
//!
//! A notification is believed when: its topic is one configured (a valid signature only
//! proves that AWS sent it, and anyone can have AWS send to this endpoint from a topic of
//! their own); its `SigningCertURL` is `https` on an SNS host; and its signature, over
//! the fields SNS names in its documented order, verifies with that certificate's key
//! (`SignatureVersion` 1: RSA with SHA-1, 2: RSA with SHA-256). Whatever needs no
//! certificate is checked before one is fetched (topic, time, the signature's form, the
//! URL), and every refusal of authenticity is worded alike, so that an answer does not
//! tell a configured topic from another. Certificates are cached by normalized URL (no
//! fragment), and requests naming a certificate being fetched wait for that fetch. A
//! subscription confirmation is answered by fetching its `SubscribeURL`, which
//! must also be on an SNS host.

mod certificates;

use std::sync::Arc;

use base64::Engine as _;
use hyper::body::Bytes;
use rustls_pki_types::{AlgorithmIdentifier, CertificateDer, InvalidSignature, alg_id};
use serde::Deserialize;
use serde_json::Value;

use super::fetch::HttpsClient;
use super::{Checks, Event, EventKind, FeedbackError, Notification, address, outbox_id};
use crate::suppression::BounceType;
use certificates::Certificates;

/// Hosts SNS serves certificates and subscription confirmations from; `*` is one label.
pub const DEFAULT_CERTIFICATE_HOSTS: &str = "sns.*.amazonaws.com,sns.*.amazonaws.com.cn";

/// What the SNS webhook accepts.
#[derive(Debug, Clone)]
pub struct SnsSettings {
    /// Topic ARNs whose notifications are taken; any other is refused.
    pub topics: Vec<String>,
    /// Where the signing certificate and the confirmation may come from.
    pub certificate_hosts: Vec<HostPattern>,
    pub client: HttpsClient,
}

/// Where SNS's certificates and confirmations may come from: `host` (port 443) or
/// `host:port`, where one label of the host may be `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    labels: Vec<String>,
    port: u16,
}

/// Host patterns from a comma-separated list. A `*` label stands for one AWS region name
/// (`us-east-1`, `us-gov-west-1`, `cn-north-1`): a wildcard for any label would let
/// `sns.s3.amazonaws.com`, a bucket's website, serve a certificate.
pub fn parse_host_patterns(text: &str) -> Result<Vec<HostPattern>, String> {
    let patterns = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pattern| {
            let (host, port) = match pattern.rsplit_once(':') {
                Some((host, port)) => (
                    host,
                    port.parse()
                        .map_err(|_| format!("{pattern:?}: the port is not a number"))?,
                ),
                None => (pattern, 443),
            };
            let labels: Vec<String> = host.split('.').map(str::to_ascii_lowercase).collect();
            let valid_label = |label: &String| {
                label == "*"
                    || (!label.is_empty()
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            };
            let wildcards = labels.iter().filter(|l| *l == "*").count();
            if !labels.iter().all(valid_label) || wildcards > 1 || labels.len() < wildcards + 1 {
                return Err(format!(
                    "{pattern:?} is not a host pattern (a host name, one label of which may be *)"
                ));
            }
            Ok(HostPattern { labels, port })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if patterns.is_empty() {
        return Err("expected at least one host pattern".to_owned());
    }
    Ok(patterns)
}

/// An AWS region name: `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-northwest-1`.
fn is_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts[parts.len() - 1].bytes().all(|b| b.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

impl HostPattern {
    /// Whether `host:port` matches, its `*` label being a region; the topic's own, when one
    /// is given: SNS signs a topic's messages from its region's host, and a fetch from any
    /// other (`sns.zz-fake-1.amazonaws.com` is a region by its form) is a forgery's.
    fn matches_in(&self, host: &str, port: u16, region: Option<&str>) -> bool {
        let host: Vec<&str> = host.split('.').collect();
        self.port == port
            && self.labels.len() == host.len()
            && self.labels.iter().zip(&host).all(|(pattern, label)| {
                if pattern == "*" {
                    is_region(label) && region.is_none_or(|region| region == *label)
                } else {
                    pattern.eq_ignore_ascii_case(label)
                }
            })
    }
}

/// The region of a topic ARN (`arn:aws:sns:REGION:ACCOUNT:NAME`).
fn region_of(topic_arn: &str) -> Option<&str> {
    topic_arn
        .split(':')
        .nth(3)
        .filter(|region| is_region(region))
}

/// An SNS message as POSTed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Envelope {
    #[serde(rename = "Type")]
    kind: String,
    message_id: String,
    topic_arn: String,
    message: String,
    timestamp: String,
    signature_version: String,
    signature: String,
    #[serde(rename = "SigningCertURL", alias = "SigningCertUrl")]
    signing_cert_url: String,
    subject: Option<String>,
    token: Option<String>,
    #[serde(rename = "SubscribeURL", alias = "SubscribeUrl")]
    subscribe_url: Option<String>,
}

/// What an accepted SNS message came to.
#[derive(Debug, PartialEq, Eq)]
pub enum SnsOutcome {
    /// The subscription was confirmed.
    Confirmed,
    /// A notification: the bounces and complaints it reports (none for a delivery).
    Notification(Notification),
}

/// The SNS webhook's state: its settings and the certificates fetched so far.
#[derive(Debug)]
pub struct Sns {
    settings: SnsSettings,
    certificates: Certificates,
}

/// The refusal of a message that did not pass SNS's checks, worded the same whatever the
/// check, so that an answer never tells which topics are configured.
fn not_authentic(detail: String) -> FeedbackError {
    FeedbackError::Unauthorized(detail)
}

impl Sns {
    pub fn new(settings: SnsSettings) -> Self {
        Self {
            certificates: Certificates::new(settings.client.clone()),
            settings,
        }
    }

    /// Checks one POSTed message and reads it; confirms a subscription. Everything that
    /// needs no certificate is checked first (the topic, the time, the signature's form
    /// and the certificate's URL), so that only a message that looks authentic can make
    /// outboxd fetch; the CPU work runs in `checks`' turns.
    pub async fn receive(
        self: &Arc<Self>,
        checks: &Checks,
        body: Bytes,
    ) -> Result<SnsOutcome, FeedbackError> {
        let this = Arc::clone(self);
        let (envelope, url, signature) = checks
            .run(move || {
                let envelope: Envelope = serde_json::from_slice(&body)
                    .map_err(|_| FeedbackError::Invalid("not an SNS message".to_owned()))?;
                let (url, signature) = this.precheck(&envelope, chrono::Utc::now())?;
                Ok((envelope, url, signature))
            })
            .await?;
        let der = self.certificates.get(&url).await?;
        let (envelope, der) = checks
            .run(move || {
                verify_signature(&envelope, &der, &signature)?;
                Ok((envelope, der))
            })
            .await?;
        self.certificates.verified(&url, &der);
        match envelope.kind.as_str() {
            "SubscriptionConfirmation" => {
                let url = envelope
                    .subscribe_url
                    .as_deref()
                    .ok_or_else(|| FeedbackError::Invalid("no SubscribeURL".to_owned()))?;
                let url = self.sns_url(url, region_of(&envelope.topic_arn))?;
                self.settings.client.get(&url).await.map_err(|e| {
                    FeedbackError::Unavailable(format!("confirming the subscription: {e}"))
                })?;
                Ok(SnsOutcome::Confirmed)
            }
            "Notification" => {
                let id = envelope.message_id.clone();
                let events = checks.run(move || ses_events(&envelope.message)).await?;
                Ok(SnsOutcome::Notification(Notification {
                    id: Some(id),
                    events,
                }))
            }
            "UnsubscribeConfirmation" => Ok(SnsOutcome::Notification(Notification::default())),
            _ => Err(FeedbackError::Invalid(
                "unknown SNS message type".to_owned(),
            )),
        }
    }

    /// The checks that need no certificate: a configured topic, a fresh time, a known
    /// signature version with a signature of an RSA key's size, and a certificate URL on
    /// an SNS host. Returns the certificate's normalized URL and the signature.
    fn precheck(
        &self,
        envelope: &Envelope,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(url::Url, Vec<u8>), FeedbackError> {
        if !self.settings.topics.contains(&envelope.topic_arn) {
            return Err(not_authentic(
                "its topic is not in OUTBOXD_SNS_TOPIC_ARNS".to_owned(),
            ));
        }
        check_fresh(&envelope.timestamp, now)?;
        if !matches!(envelope.signature_version.as_str(), "1" | "2") {
            return Err(not_authentic("an unknown SignatureVersion".to_owned()));
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(envelope.signature.trim())
            .ok()
            .filter(|s| (256..=512).contains(&s.len()))
            .ok_or_else(|| {
                not_authentic("the signature is not the base64 of an RSA signature".to_owned())
            })?;
        let mut url = self.sns_url(&envelope.signing_cert_url, region_of(&envelope.topic_arn))?;
        if !url.path().ends_with(".pem") || url.query().is_some() {
            return Err(not_authentic(
                "the SigningCertURL is not a .pem file without a query".to_owned(),
            ));
        }
        // One certificate, one key: `#anything` names the same file.
        url.set_fragment(None);
        Ok((url, signature))
    }

    /// A URL on an SNS host over https, without a query or credentials, in the topic's
    /// region where the host pattern names a region (a `*`), or the refusal.
    fn sns_url(&self, text: &str, region: Option<&str>) -> Result<url::Url, FeedbackError> {
        let url = url::Url::parse(text)
            .map_err(|_| not_authentic("a URL that does not parse".to_owned()))?;
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or_default();
        let allowed = url.scheme() == "https"
            && url.username().is_empty()
            && url.password().is_none()
            && self
                .settings
                .certificate_hosts
                .iter()
                .any(|pattern| pattern.matches_in(host, port, region));
        if allowed {
            Ok(url)
        } else {
            Err(not_authentic(
                "a URL not https on an SNS host (OUTBOXD_SNS_CERTIFICATE_HOSTS)".to_owned(),
            ))
        }
    }
}

/// Checks an envelope's signature with its certificate (DER).
fn verify_signature(
    envelope: &Envelope,
    der: &[u8],
    signature: &[u8],
) -> Result<(), FeedbackError> {
    let algorithm: &dyn rustls_pki_types::SignatureVerificationAlgorithm =
        match envelope.signature_version.as_str() {
            "1" => &RSA_SHA1,
            _ => webpki::ring::RSA_PKCS1_2048_8192_SHA256,
        };
    let der = CertificateDer::from(der);
    let certificate = webpki::EndEntityCert::try_from(&der)
        .map_err(|e| not_authentic(format!("the signing certificate does not parse: {e}")))?;
    certificate
        .verify_signature(algorithm, string_to_sign(envelope).as_bytes(), signature)
        .map_err(|_| not_authentic("the SNS signature does not verify".to_owned()))
}

/// SNS retries a notification for an hour at most: an older one is a replay (which could
/// put back an address an operator removed from the list).
const MAX_AGE: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// Clocks disagree a little.
const MAX_AHEAD: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

fn check_fresh(timestamp: &str, now: chrono::DateTime<chrono::Utc>) -> Result<(), FeedbackError> {
    let sent = chrono::DateTime::parse_from_rfc3339(timestamp)
        .map_err(|_| not_authentic("its Timestamp is not RFC 3339".to_owned()))?;
    let age = now.signed_duration_since(sent);
    if age > MAX_AGE || age < -MAX_AHEAD {
        return Err(not_authentic(
            "its Timestamp is more than an hour old, or in the future: a replay?".to_owned(),
        ));
    }
    Ok(())
}

/// The fields SNS signs, each name and value on its own line, in this order.
fn string_to_sign(envelope: &Envelope) -> String {
    let mut fields: Vec<(&str, &str)> = vec![
        ("Message", &envelope.message),
        ("MessageId", &envelope.message_id),
    ];
    if envelope.kind == "Notification" {
        if let Some(subject) = &envelope.subject {
            fields.push(("Subject", subject));
        }
    } else {
        fields.push((
            "SubscribeURL",
            envelope.subscribe_url.as_deref().unwrap_or_default(),
        ));
    }
    fields.push(("Timestamp", &envelope.timestamp));
    if envelope.kind != "Notification" {
        fields.push(("Token", envelope.token.as_deref().unwrap_or_default()));
    }
    fields.push(("TopicArn", &envelope.topic_arn));
    fields.push(("Type", &envelope.kind));
    fields
        .into_iter()
        .map(|(name, value)| format!("{name}\n{value}\n"))
        .collect()
}

/// RSA PKCS#1 v1.5 with SHA-1: what SNS's `SignatureVersion` 1 uses (its default), which
/// webpki no longer offers.
#[derive(Debug)]
struct RsaSha1;

static RSA_SHA1: RsaSha1 = RsaSha1;

impl rustls_pki_types::SignatureVerificationAlgorithm for RsaSha1 {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            public_key,
        )
        .verify(message, signature)
        .map_err(|_| InvalidSignature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::RSA_ENCRYPTION
    }

    /// Only compared when a certificate chain is verified, which never happens here (the
    /// certificate is trusted for coming from an SNS host over TLS); pki-types has no
    /// SHA-1 identifier to give.
    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::RSA_PKCS1_SHA256
    }
}

/// The recipients an SES notification (or event) reports, with the row it names.
fn ses_events(message: &str) -> Result<Vec<Event>, FeedbackError> {
    let ses: Value = serde_json::from_str(message)
        .map_err(|e| FeedbackError::Invalid(format!("the SNS Message is not SES JSON: {e}")))?;
    let kind = ses
        .get("notificationType")
        .or_else(|| ses.get("eventType"))
        .and_then(Value::as_str)
        .ok_or_else(|| FeedbackError::Invalid("no notificationType or eventType".to_owned()))?;
    let message_id = row_of(&ses["mail"]);
    let (kind, list, address_field) = match kind {
        "Bounce" => {
            let bounce_type = match ses["bounce"]["bounceType"].as_str() {
                Some("Permanent") => BounceType::Hard,
                Some("Transient") => BounceType::Soft,
                _ => BounceType::Undetermined,
            };
            (
                EventKind::Bounce(bounce_type),
                &ses["bounce"]["bouncedRecipients"],
                "emailAddress",
            )
        }
        "Complaint" => (
            EventKind::Complaint,
            &ses["complaint"]["complainedRecipients"],
            "emailAddress",
        ),
        // Deliveries, sends, opens...: nothing to record.
        _ => return Ok(Vec::new()),
    };
    let recipients = list
        .as_array()
        .ok_or_else(|| FeedbackError::Invalid("no recipients in the notification".to_owned()))?;
    recipients
        .iter()
        .map(|recipient| {
            let text = recipient[address_field].as_str().ok_or_else(|| {
                FeedbackError::Invalid("a recipient without an address".to_owned())
            })?;
            let detail = recipient["diagnosticCode"]
                .as_str()
                .or_else(|| ses["complaint"]["complaintFeedbackType"].as_str())
                .map(|d| crate::text::cut(d, 1000).to_owned());
            Ok(Event {
                kind: kind.clone(),
                address: address(text)?,
                message_id,
                detail,
            })
        })
        .collect()
}

/// The outbox row of the `mail` object: its original headers, when SES was told to
/// include them, or its common headers' Message-ID.
fn row_of(mail: &Value) -> Option<i64> {
    let header = |wanted: &str| {
        mail["headers"].as_array()?.iter().find_map(|h| {
            h["name"]
                .as_str()
                .filter(|name| name.eq_ignore_ascii_case(wanted))
                .and(h["value"].as_str())
        })
    };
    outbox_id(
        header("Message-ID").or_else(|| mail["commonHeaders"]["messageId"].as_str()),
        header("X-Outbox-Id"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sns_hosts_match() {
        let patterns = parse_host_patterns(DEFAULT_CERTIFICATE_HOSTS).unwrap();
        let ok = |host: &str, port| patterns.iter().any(|p| p.matches_in(host, port, None));
        assert!(ok("sns.us-east-1.amazonaws.com", 443));
        assert!(ok("sns.us-gov-west-1.amazonaws.com", 443));
        assert!(ok("sns.cn-north-1.amazonaws.com.cn", 443));
        assert!(!ok("sns.us-east-1.amazonaws.com", 8443));
        // S3 website endpoints of a bucket named `sns`.
        assert!(!ok("sns.s3.amazonaws.com", 443));
        assert!(!ok("sns.s3-us-west-2.amazonaws.com", 443));
        assert!(!ok("sns.evil.example.amazonaws.com", 443));
        assert!(!ok("sns.us-east-1.amazonaws.com.evil.test", 443));
        assert!(!ok("evil.test", 443));
        let local = parse_host_patterns("localhost:8443").unwrap();
        assert!(
            local[0].matches_in("localhost", 8443, None)
                && !local[0].matches_in("localhost", 443, None)
        );
        // A topic's messages come from its region's host only.
        let topic = Some("eu-west-1");
        assert!(
            patterns
                .iter()
                .any(|p| p.matches_in("sns.eu-west-1.amazonaws.com", 443, topic))
        );
        assert!(
            !patterns
                .iter()
                .any(|p| p.matches_in("sns.zz-fake-1.amazonaws.com", 443, topic))
        );
        assert_eq!(region_of("arn:aws:sns:eu-west-1:123456789012:t"), topic);
        for bad in ["a b", "*", "*.*.example.com", "host:port"] {
            assert!(parse_host_patterns(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_permanent_bounce_names_its_recipients_and_row() {
        let message = r#"{"notificationType":"Bounce",
            "bounce":{"bounceType":"Permanent","bouncedRecipients":[
                {"emailAddress":"Gone@Example.com","diagnosticCode":"smtp; 550 5.1.1 user unknown"}]},
            "mail":{"commonHeaders":{"messageId":"<outbox-12@mail.example>"}}}"#;
        let events = ses_events(message).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Bounce(BounceType::Hard));
        assert_eq!(events[0].address, "gone@example.com");
        assert_eq!(events[0].message_id, Some(12));
        assert!(
            ses_events(r#"{"notificationType":"Delivery"}"#)
                .unwrap()
                .is_empty()
        );
        assert!(ses_events("[]").is_err());
    }
}
