//! A generic bounce and complaint webhook, signed as Standard Webhooks specify: HMAC-SHA256
//! over `{webhook-id}.{webhook-timestamp}.{body}` with the shared secret (`whsec_` and its
//! base64), sent as `webhook-signature: v1,<base64>` (several, space-separated, during a
//! secret's rotation). A timestamp more than five minutes away is refused, so that a
//! captured request cannot be replayed later.
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
use secrecy::{ExposeSecret, SecretSlice};
use serde::Deserialize;

use super::{Event, EventKind, FeedbackError, address, outbox_id};
use crate::suppression::BounceType;

/// How far a request's timestamp may be from now.
const TOLERANCE_SECONDS: u64 = 5 * 60;

/// The shared secret.
#[derive(Debug)]
pub struct StandardSettings {
    secret: SecretSlice<u8>,
}

impl StandardSettings {
    /// `whsec_` followed by the base64 of at least 24 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let encoded = text
            .strip_prefix("whsec_")
            .ok_or("expected whsec_ followed by base64")?;
        let secret = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| "the part after whsec_ is not base64".to_owned())?;
        if secret.len() < 24 {
            return Err("the secret must be at least 24 bytes".to_owned());
        }
        Ok(Self {
            secret: SecretSlice::from(secret),
        })
    }

    /// Checks the three `webhook-*` headers against the body and the clock.
    pub fn verify(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), FeedbackError> {
        let missing =
            |name: &str| FeedbackError::Unauthorized(format!("the {name} header is missing"));
        let id = id.ok_or_else(|| missing("webhook-id"))?;
        let timestamp = timestamp.ok_or_else(|| missing("webhook-timestamp"))?;
        let signatures = signatures.ok_or_else(|| missing("webhook-signature"))?;
        let sent: i64 = timestamp.trim().parse().map_err(|_| {
            FeedbackError::Unauthorized("webhook-timestamp is not a number".to_owned())
        })?;
        if now.abs_diff(sent) > TOLERANCE_SECONDS {
            return Err(FeedbackError::Unauthorized(
                "webhook-timestamp is more than five minutes from now".to_owned(),
            ));
        }
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.secret.expose_secret());
        let mut signed = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
        signed.extend_from_slice(id.as_bytes());
        signed.push(b'.');
        signed.extend_from_slice(timestamp.trim().as_bytes());
        signed.push(b'.');
        signed.extend_from_slice(body);
        let valid = signatures.split_ascii_whitespace().any(|signature| {
            signature
                .strip_prefix("v1,")
                .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                .is_some_and(|tag| ring::hmac::verify(&key, &signed, &tag).is_ok())
        });
        if valid {
            Ok(())
        } else {
            Err(FeedbackError::Unauthorized(
                "no webhook-signature verifies".to_owned(),
            ))
        }
    }
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
    let message_id = body
        .data
        .outbox_id
        .or_else(|| outbox_id(body.data.message_id.as_deref(), None));
    Ok(vec![Event {
        kind,
        address: address(&body.data.email)?,
        message_id,
        detail: body
            .data
            .detail
            .map(|d| crate::text::cut(&d, 1000).to_owned()),
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
    }
}
