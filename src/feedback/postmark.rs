//! Postmark's bounce, spam-complaint and subscription-change webhooks, behind HTTP Basic
//! credentials set in Postmark's webhook URL (`https://user:password@host/webhooks/postmark`).
//!
//! Postmark names its own message ids, not ours: a row is found only through metadata
//! called `outbox_id`, where whatever hands the message to Postmark sets it.

use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use subtle::ConstantTimeEq as _;

use super::{Event, EventKind, FeedbackError, Notification, RowNames, address};
use crate::suppression::BounceType;

/// The credentials Postmark must present.
#[derive(Debug)]
pub struct PostmarkSettings {
    pub user: String,
    pub password: SecretString,
}

impl PostmarkSettings {
    /// `user:password`, as OUTBOXD_POSTMARK_WEBHOOK_CREDENTIALS gives them.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            Some((user, password)) if !user.is_empty() && password.len() >= 16 => Ok(Self {
                user: user.to_owned(),
                password: SecretString::from(password.to_owned()),
            }),
            _ => {
                Err("expected user:password, with a password of at least 16 characters".to_owned())
            }
        }
    }

    /// Checks an `Authorization` header, in constant time.
    pub fn authorize(&self, header: Option<&str>) -> Result<(), FeedbackError> {
        let refused = || FeedbackError::Unauthorized("HTTP Basic credentials required".to_owned());
        let encoded = header
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .map(|(_, encoded)| encoded)
            .ok_or_else(refused)?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| refused())?;
        let expected = format!("{}:{}", self.user, self.password.expose_secret());
        if bool::from(decoded.ct_eq(expected.as_bytes())) {
            Ok(())
        } else {
            Err(FeedbackError::Unauthorized("wrong credentials".to_owned()))
        }
    }
}

/// The recipient one Postmark webhook reports (none for records that change nothing), and
/// the record's id: its `ID` (bounces and complaints), or its message and time (a
/// subscription change has no id of its own).
pub fn notification(body: &[u8]) -> Result<Notification, FeedbackError> {
    let record: Value = serde_json::from_slice(body)
        .map_err(|e| FeedbackError::Invalid(format!("not Postmark JSON: {e}")))?;
    let record_type = record["RecordType"]
        .as_str()
        .ok_or_else(|| FeedbackError::Invalid("no RecordType".to_owned()))?;
    let kind = match record_type {
        "Bounce" => EventKind::Bounce(match record["Type"].as_str() {
            Some("HardBounce" | "BadEmailAddress") => BounceType::Hard,
            Some("SoftBounce" | "Transient" | "DnsError" | "AutoResponder") => BounceType::Soft,
            _ => BounceType::Undetermined,
        }),
        "SpamComplaint" => EventKind::Complaint,
        "SubscriptionChange" if record["SuppressSending"].as_bool() == Some(true) => {
            EventKind::Unsubscribe
        }
        // Deliveries, opens, clicks, a subscription restored...: nothing to record.
        _ => return Ok(Notification::default()),
    };
    let email = record["Email"]
        .as_str()
        .or_else(|| record["Recipient"].as_str())
        .ok_or_else(|| FeedbackError::Invalid("no Email".to_owned()))?;
    let outbox_id = match &record["Metadata"]["outbox_id"] {
        Value::String(id) => id.trim().parse().ok(),
        Value::Number(id) => id.as_i64(),
        _ => None,
    };
    let detail = record["Details"]
        .as_str()
        .or_else(|| record["Description"].as_str())
        .map(|d| crate::text::cut(d, crate::suppression::MAX_DETAIL_CHARS).to_owned());
    let text = |field: &str| match &record[field] {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let id = match (text("ID"), text("MessageID"), text("ChangedAt")) {
        (Some(id), _, _) => Some(format!("{record_type}:{id}")),
        (None, Some(message), Some(at)) => Some(format!("{record_type}:{message}:{at}")),
        _ => None,
    };
    Ok(Notification {
        id,
        events: vec![Event {
            kind,
            address: address(email)?,
            row: RowNames {
                message_id: None,
                outbox_id,
            },
            detail,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_bounces_and_complaints_are_read_and_deliveries_ignored() {
        let bounce = br#"{"RecordType":"Bounce","Type":"HardBounce","Email":"Zed@Example.com",
                          "Details":"smtp;550 5.1.1","Metadata":{"outbox_id":"9"}}"#;
        let events = notification(bounce).unwrap().events;
        assert_eq!(events[0].kind, EventKind::Bounce(BounceType::Hard));
        assert_eq!(events[0].address, "zed@example.com");
        assert_eq!(events[0].row.outbox_id, Some(9));
        let spam =
            br#"{"RecordType":"SpamComplaint","Type":"SpamComplaint","Email":"a@b.example"}"#;
        let spam = notification(spam).unwrap();
        assert_eq!(spam.events[0].kind, EventKind::Complaint);
        assert_eq!(spam.id, None);
        let with_id = br#"{"RecordType":"SpamComplaint","ID":42,"Email":"a@b.example"}"#;
        assert_eq!(
            notification(with_id).unwrap().id.as_deref(),
            Some("SpamComplaint:42")
        );
        assert!(
            notification(br#"{"RecordType":"Delivery"}"#)
                .unwrap()
                .events
                .is_empty()
        );
        assert!(notification(b"{}").is_err());
    }

    #[test]
    fn only_the_configured_credentials_pass() {
        let settings = PostmarkSettings::parse("postmark:0123456789abcdef").unwrap();
        let basic = |text: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(text)
            )
        };
        assert!(
            settings
                .authorize(Some(&basic("postmark:0123456789abcdef")))
                .is_ok()
        );
        assert!(settings.authorize(Some(&basic("postmark:wrong"))).is_err());
        let lower = basic("postmark:0123456789abcdef").replace("Basic", "basic");
        assert!(settings.authorize(Some(&lower)).is_ok());
        assert!(settings.authorize(None).is_err());
        assert!(PostmarkSettings::parse("nopassword").is_err());
    }
}
