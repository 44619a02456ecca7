//! Amazon SES bounce and complaint notifications, delivered by SNS.
//!
//! A notification is believed when: its topic is one configured (a valid signature only
//! proves that AWS sent it, and anyone can have AWS send to this endpoint from a topic of
//! their own); its `SigningCertURL` is `https` on an SNS host; and its signature, over
//! the fields SNS names in its documented order, verifies with that certificate's key
//! (`SignatureVersion` 1: RSA with SHA-1, 2: RSA with SHA-256). Certificates are cached
//! by URL. A subscription confirmation is answered by fetching its `SubscribeURL`, which
//! must also be on an SNS host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{AlgorithmIdentifier, CertificateDer, InvalidSignature, alg_id};
use serde::Deserialize;
use serde_json::Value;

use super::fetch::HttpsClient;
use super::{Event, EventKind, FeedbackError, address, outbox_id};
use crate::lock::lock;
use crate::suppression::BounceType;

/// Hosts SNS serves certificates and subscription confirmations from; `*` is one label.
pub const DEFAULT_CERTIFICATE_HOSTS: &str = "sns.*.amazonaws.com,sns.*.amazonaws.com.cn";

/// Certificates kept; SNS rotates them rarely.
const MAX_CACHED_CERTIFICATES: usize = 16;
/// Certificate fetches at once: anyone who knows a topic ARN can make outboxd fetch from
/// the SNS hosts, and each fetch may take its whole timeout.
const MAX_CONCURRENT_FETCHES: usize = 2;

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
    fn matches(&self, host: &str, port: u16) -> bool {
        let host: Vec<&str> = host.split('.').collect();
        self.port == port
            && self.labels.len() == host.len()
            && self.labels.iter().zip(&host).all(|(pattern, label)| {
                if pattern == "*" {
                    is_region(label)
                } else {
                    pattern.eq_ignore_ascii_case(label)
                }
            })
    }
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
    Events(Vec<Event>),
}

/// The SNS webhook's state: its settings and the certificates fetched so far.
#[derive(Debug)]
pub struct Sns {
    settings: SnsSettings,
    certificates: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    fetches: tokio::sync::Semaphore,
}

impl Sns {
    pub fn new(settings: SnsSettings) -> Self {
        Self {
            settings,
            certificates: Mutex::new(HashMap::new()),
            fetches: tokio::sync::Semaphore::new(MAX_CONCURRENT_FETCHES),
        }
    }

    /// Checks one POSTed message and reads it; confirms a subscription.
    pub async fn receive(&self, body: &[u8]) -> Result<SnsOutcome, FeedbackError> {
        let envelope: Envelope = serde_json::from_slice(body)
            .map_err(|e| FeedbackError::Invalid(format!("not an SNS message: {e}")))?;
        if !self.settings.topics.contains(&envelope.topic_arn) {
            return Err(FeedbackError::Unauthorized(format!(
                "topic {} is not in OUTBOXD_SNS_TOPIC_ARNS",
                envelope.topic_arn
            )));
        }
        self.verify(&envelope).await?;
        check_fresh(&envelope.timestamp, chrono::Utc::now())?;
        match envelope.kind.as_str() {
            "SubscriptionConfirmation" => {
                let url = envelope
                    .subscribe_url
                    .as_deref()
                    .ok_or_else(|| FeedbackError::Invalid("no SubscribeURL".to_owned()))?;
                let url = self.sns_url(url)?;
                self.settings.client.get(&url).await.map_err(|e| {
                    FeedbackError::Unavailable(format!("confirming the subscription: {e}"))
                })?;
                Ok(SnsOutcome::Confirmed)
            }
            "Notification" => ses_events(&envelope.message).map(SnsOutcome::Events),
            "UnsubscribeConfirmation" => Ok(SnsOutcome::Events(Vec::new())),
            other => Err(FeedbackError::Invalid(format!(
                "unknown SNS message type {other:?}"
            ))),
        }
    }

    /// A URL on an SNS host over https, without a query or credentials, or the refusal.
    fn sns_url(&self, text: &str) -> Result<url::Url, FeedbackError> {
        let url = url::Url::parse(text)
            .map_err(|e| FeedbackError::Unauthorized(format!("bad URL {text:?}: {e}")))?;
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or_default();
        let allowed = url.scheme() == "https"
            && url.username().is_empty()
            && url.password().is_none()
            && self
                .settings
                .certificate_hosts
                .iter()
                .any(|pattern| pattern.matches(host, port));
        if allowed {
            Ok(url)
        } else {
            Err(FeedbackError::Unauthorized(format!(
                "{text:?} is not https on an SNS host (OUTBOXD_SNS_CERTIFICATE_HOSTS)"
            )))
        }
    }

    async fn verify(&self, envelope: &Envelope) -> Result<(), FeedbackError> {
        let algorithm: &dyn rustls_pki_types::SignatureVerificationAlgorithm =
            match envelope.signature_version.as_str() {
                "1" => &RSA_SHA1,
                "2" => webpki::ring::RSA_PKCS1_2048_8192_SHA256,
                other => {
                    return Err(FeedbackError::Unauthorized(format!(
                        "unknown SignatureVersion {other:?}"
                    )));
                }
            };
        let url = self.sns_url(&envelope.signing_cert_url)?;
        if !url.path().ends_with(".pem") || url.query().is_some() {
            return Err(FeedbackError::Unauthorized(
                "the SigningCertURL is not a .pem file without a query".to_owned(),
            ));
        }
        let der = self.certificate(&url).await?;
        let der = CertificateDer::from(der.as_slice());
        let certificate = webpki::EndEntityCert::try_from(&der).map_err(|e| {
            FeedbackError::Unauthorized(format!("the signing certificate does not parse: {e}"))
        })?;
        let signature = base64::engine::general_purpose::STANDARD
            .decode(envelope.signature.trim())
            .map_err(|_| FeedbackError::Unauthorized("the signature is not base64".to_owned()))?;
        certificate
            .verify_signature(algorithm, string_to_sign(envelope).as_bytes(), &signature)
            .map_err(|_| {
                FeedbackError::Unauthorized("the SNS signature does not verify".to_owned())
            })
    }

    async fn certificate(&self, url: &url::Url) -> Result<Arc<Vec<u8>>, FeedbackError> {
        if let Some(der) = lock(&self.certificates).get(url.as_str()) {
            return Ok(Arc::clone(der));
        }
        let _permit = self.fetches.try_acquire().map_err(|_| {
            FeedbackError::Unavailable(
                "too many certificate fetches at once; send it again".to_owned(),
            )
        })?;
        let pem = self.settings.client.get(url).await.map_err(|e| {
            FeedbackError::Unavailable(format!("cannot fetch the signing certificate: {e}"))
        })?;
        let der = CertificateDer::from_pem_slice(&pem).map_err(|e| {
            FeedbackError::Unauthorized(format!("the signing certificate is not PEM: {e}"))
        })?;
        let der = Arc::new(der.as_ref().to_vec());
        let mut cache = lock(&self.certificates);
        if cache.len() >= MAX_CACHED_CERTIFICATES
            && let Some(evicted) = cache.keys().next().cloned()
        {
            cache.remove(&evicted);
        }
        cache.insert(url.as_str().to_owned(), Arc::clone(&der));
        Ok(der)
    }
}

/// SNS retries a notification for an hour at most: an older one is a replay (which could
/// put back an address an operator removed from the list).
const MAX_AGE: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// Clocks disagree a little.
const MAX_AHEAD: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

fn check_fresh(timestamp: &str, now: chrono::DateTime<chrono::Utc>) -> Result<(), FeedbackError> {
    let sent = chrono::DateTime::parse_from_rfc3339(timestamp)
        .map_err(|_| FeedbackError::Invalid(format!("Timestamp {timestamp:?} is not RFC 3339")))?;
    let age = now.signed_duration_since(sent);
    if age > MAX_AGE || age < -MAX_AHEAD {
        return Err(FeedbackError::Unauthorized(format!(
            "Timestamp {timestamp} is more than an hour old, or in the future: a replay?"
        )));
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
        let ok = |host: &str, port| patterns.iter().any(|p| p.matches(host, port));
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
        assert!(local[0].matches("localhost", 8443) && !local[0].matches("localhost", 443));
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
