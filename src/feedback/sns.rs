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
mod hosts;
mod ses;

use std::sync::Arc;

use base64::Engine as _;
use hyper::body::Bytes;
use rustls_pki_types::{AlgorithmIdentifier, CertificateDer, InvalidSignature, alg_id};
use serde::Deserialize;

use super::fetch::HttpsClient;
use super::{Checks, FeedbackError, Notification};
use certificates::Certificates;
use hosts::region_of;
pub use hosts::{HostPattern, parse_host_patterns};
use ses::ses_events;

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
