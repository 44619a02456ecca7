//! A generic bounce and complaint webhook, signed as Standard Webhooks specify: HMAC-SHA256
//! over `{webhook-id}.{webhook-timestamp}.{body}` with the shared secret (`whsec_` and its
//! base64), sent as `webhook-signature: v1,<base64>` (several, space-separated, during a
//! secret's rotation). A timestamp more than five minutes away is refused, so that a
//! captured request cannot be replayed later.
//!
//! The headers are checked before the body is read, and the body costs one HMAC whatever
//! the signature header holds (a flood of `v1,` entries once bought a second of CPU per
//! request). Not the `standardwebhooks` crate (1.0.1): it compares a candidate only over
//! the shorter of the two lengths, so `v1,` with nothing after it verifies any body, and it
//! needs the body to be UTF-8.
//!
//! The body:
//! ```json
//! {"type": "email.bounced", "data": {"email": "ada@example.com", "bounce_type": "hard",
//!   "message_id": "<outbox-42@mail.example>", "detail": "550 5.1.1 user unknown"}}
//! ```
//! `type` is `email.bounced` (`bounce_type` `hard`, `soft` or `undetermined`),
//! `email.complained` or `email.unsubscribed`; `data.outbox_id` may name the row instead of
//! `data.message_id`.

use base64::Engine as _;
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use super::{Event, EventKind, FeedbackError, RowNames, address};
use crate::suppression::BounceType;
use crate::webhook_signature::WebhookSecret;

/// How far a request's timestamp may be from now.
const TOLERANCE_SECONDS: u64 = 5 * 60;
/// Signatures in one `webhook-signature` header that are compared; the rest are ignored.
pub const MAX_SIGNATURES: usize = 4;
/// The longest `webhook-id`: it is kept to tell a replay (`outbox_webhook_receipts`).
const MAX_ID_BYTES: usize = 200;

/// The shared secret.
#[derive(Debug)]
pub struct StandardSettings {
    secret: WebhookSecret,
}

impl StandardSettings {
    /// `whsec_` followed by the base64 of at least 24 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(Self {
            secret: WebhookSecret::parse(text)?,
        })
    }

    /// Checks the three `webhook-*` headers and the clock, before the body is read: a
    /// request that fails here costs no HMAC and no body.
    pub fn check_headers(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        now: i64,
    ) -> Result<SignedHeaders, FeedbackError> {
        let missing =
            |name: &str| FeedbackError::Unauthorized(format!("the {name} header is missing"));
        let id = id.ok_or_else(|| missing("webhook-id"))?;
        let timestamp = timestamp
            .ok_or_else(|| missing("webhook-timestamp"))?
            .trim();
        let signatures = signatures.ok_or_else(|| missing("webhook-signature"))?;
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return Err(FeedbackError::Unauthorized(format!(
                "webhook-id must be 1 to {MAX_ID_BYTES} bytes"
            )));
        }
        let sent: i64 = timestamp.parse().map_err(|_| {
            FeedbackError::Unauthorized("webhook-timestamp is not a number".to_owned())
        })?;
        if now.abs_diff(sent) > TOLERANCE_SECONDS {
            return Err(FeedbackError::Unauthorized(
                "webhook-timestamp is more than five minutes from now".to_owned(),
            ));
        }
        let tags = candidate_tags(signatures);
        if tags.is_empty() {
            return Err(FeedbackError::Unauthorized(
                "webhook-signature holds no v1 signature of 32 bytes".to_owned(),
            ));
        }
        Ok(SignedHeaders {
            id: id.to_owned(),
            timestamp: timestamp.to_owned(),
            tags,
        })
    }

    /// Checks the body against headers [`check_headers`](Self::check_headers) passed: one
    /// HMAC, whatever the header holds, compared with each candidate in constant time.
    pub fn verify_body(&self, headers: &SignedHeaders, body: &[u8]) -> Result<(), FeedbackError> {
        let expected = self.secret.tag(&headers.id, &headers.timestamp, body);
        // Every candidate is compared, so the time taken does not say which one matched.
        let matched = headers
            .tags
            .iter()
            .fold(subtle::Choice::from(0), |any, tag| {
                any | tag.as_slice().ct_eq(expected.as_slice())
            });
        if bool::from(matched) {
            Ok(())
        } else {
            Err(FeedbackError::Unauthorized(
                "no webhook-signature verifies".to_owned(),
            ))
        }
    }

    /// Both checks at once, for a body already in hand.
    #[cfg(test)]
    fn verify(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), FeedbackError> {
        let headers = self.check_headers(id, timestamp, signatures, now)?;
        self.verify_body(&headers, body)
    }
}

/// What a request's headers claim, checked for form and time; the body is still to verify.
#[derive(Debug)]
pub struct SignedHeaders {
    /// The sender's id for this notification, the same on each retry of it.
    pub id: String,
    timestamp: String,
    tags: Vec<[u8; 32]>,
}

/// The `v1,` signatures of a `webhook-signature` header that decode to an HMAC-SHA256 tag,
/// the first [`MAX_SIGNATURES`] of them: a sender lists one per secret in use (two while a
/// secret rotates), so more are padding, and each costs a comparison.
fn candidate_tags(header: &str) -> Vec<[u8; 32]> {
    header
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        // 32 bytes are 44 characters of base64; anything else cannot match.
        .filter(|b64| b64.len() == 44)
        .filter_map(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .filter_map(|tag| <[u8; 32]>::try_from(tag).ok())
        .take(MAX_SIGNATURES)
        .collect()
}

#[derive(Deserialize)]
struct Body {
    #[serde(rename = "type")]
    kind: String,
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    email: String,
    bounce_type: Option<String>,
    message_id: Option<String>,
    outbox_id: Option<i64>,
    detail: Option<String>,
}

/// The recipient one request reports.
pub fn events(body: &[u8]) -> Result<Vec<Event>, FeedbackError> {
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| FeedbackError::Invalid(format!("not the expected JSON: {e}")))?;
    let kind = match (body.kind.as_str(), body.data.bounce_type.as_deref()) {
        ("email.bounced", Some("hard")) => EventKind::Bounce(BounceType::Hard),
        ("email.bounced", Some("soft")) => EventKind::Bounce(BounceType::Soft),
        ("email.bounced", Some("undetermined") | None) => {
            EventKind::Bounce(BounceType::Undetermined)
        }
        ("email.bounced", Some(other)) => {
            return Err(FeedbackError::Invalid(format!(
                "bounce_type {other:?}: expected hard, soft or undetermined"
            )));
        }
        ("email.complained", _) => EventKind::Complaint,
        ("email.unsubscribed", _) => EventKind::Unsubscribe,
        (other, _) => {
            return Err(FeedbackError::Invalid(format!(
                "type {other:?}: expected email.bounced, email.complained or email.unsubscribed"
            )));
        }
    };
    Ok(vec![Event {
        kind,
        address: address(&body.data.email)?,
        row: RowNames {
            message_id: body.data.message_id,
            outbox_id: body.data.outbox_id,
        },
        detail: body
            .data
            .detail
            .map(|d| crate::text::cut(&d, crate::suppression::MAX_DETAIL_CHARS).to_owned()),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
        let content = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body].concat();
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, &content))
        )
    }

    #[test]
    fn a_signature_verifies_only_with_its_secret_body_and_time() {
        let secret = [7u8; 32];
        let settings = StandardSettings::parse(&format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(secret)
        ))
        .unwrap();
        let body = br#"{"type":"email.complained","data":{"email":"a@b.example"}}"#;
        let good = sign(&secret, "msg_1", "1000", body);
        let check = |sig: &str, body: &[u8], now| {
            settings.verify(Some("msg_1"), Some("1000"), Some(sig), body, now)
        };
        assert!(check(&format!("v1,AAAA {good}"), body, 1000).is_ok());
        assert!(check(&good, b"{}", 1000).is_err());
        assert!(check(&good, body, 1000 + 301).is_err());
        assert!(
            settings
                .verify(
                    Some("msg_1"),
                    Some("-9223372036854775808"),
                    Some(&good),
                    body,
                    1000
                )
                .is_err()
        );
        assert!(check(&sign(&[8u8; 32], "msg_1", "1000", body), body, 1000).is_err());
        assert!(StandardSettings::parse("whsec_c2hvcnQ=").is_err());
        // Truncated or empty candidates, and a good one past the few compared.
        let prefix = &good[..good.len() - 10];
        for forged in ["v1,", "v1", prefix, "v2,AAAA"] {
            assert!(check(forged, body, 1000).is_err(), "{forged:?} verified");
        }
        let other = sign(&[9u8; 32], "msg_1", "1000", body);
        let stuffed = format!("{} {good}", vec![other; MAX_SIGNATURES].join(" "));
        assert!(
            check(&stuffed, body, 1000).is_err(),
            "a candidate past the few compared"
        );
    }
}
