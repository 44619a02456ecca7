//! Bounce and complaint intake: the notifications providers send to the admin listener's
//! webhooks, checked for authenticity and read into [`Event`]s. No SQL here: the HTTP
//! layer records what this module returns.
//!
//! - [`sns`]: Amazon SES through SNS, signed by AWS with a certificate fetched from an
//!   SNS host only, and limited to the topics configured.
//! - [`postmark`]: Postmark's bounce and spam-complaint webhooks, behind HTTP Basic.
//! - [`standard`]: a JSON form of our own signed as Standard Webhooks specify
//!   (HMAC-SHA256 over `id.timestamp.body`), for any other provider or the application.

mod fetch;
pub mod postmark;
pub mod sns;
pub mod standard;

use crate::suppression::{BounceType, Feedback, FeedbackSource, NewSuppression, SuppressionReason};

pub use fetch::HttpsClient;

/// The largest notification body a webhook reads (SNS messages are at most 256 KiB).
pub const MAX_BODY_BYTES: usize = 512 * 1024;

/// The webhooks that are on, each with what it needs to tell a real notification.
#[derive(Debug, Default)]
pub struct FeedbackSettings {
    pub sns: Option<sns::SnsSettings>,
    pub postmark: Option<postmark::PostmarkSettings>,
    pub standard: Option<standard::StandardSettings>,
}

impl FeedbackSettings {
    pub fn any(&self) -> bool {
        self.sns.is_some() || self.postmark.is_some() || self.standard.is_some()
    }
}

/// Why a notification was refused; nothing was recorded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FeedbackError {
    /// Credentials or signature missing or wrong, or a topic not configured.
    #[error("{0}")]
    Unauthorized(String),
    /// Not the provider's format.
    #[error("{0}")]
    Invalid(String),
    /// Could not be checked now (the signing certificate could not be fetched); the
    /// provider retries.
    #[error("{0}")]
    Unavailable(String),
}

/// What a notification reports of one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Bounce(BounceType),
    Complaint,
    Unsubscribe,
}

/// One recipient's bounce, complaint or unsubscribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// Normalized as the suppression list keeps addresses.
    pub address: String,
    /// The outbox row, when the notification names it.
    pub message_id: Option<i64>,
    /// What the provider said (a diagnostic code, a feedback type).
    pub detail: Option<String>,
}

impl Event {
    /// The suppression and the row's mark this event makes: hard bounces, complaints and
    /// unsubscribes suppress; soft and undetermined bounces only mark the row.
    pub fn feedback(&self, source: FeedbackSource) -> Feedback {
        let (mark, reason) = match self.kind {
            EventKind::Bounce(BounceType::Hard) => {
                (Some("hard_bounce"), Some(SuppressionReason::HardBounce))
            }
            EventKind::Bounce(BounceType::Soft | BounceType::Undetermined) => {
                (Some("soft_bounce"), None)
            }
            EventKind::Complaint => (Some("complaint"), Some(SuppressionReason::Complaint)),
            EventKind::Unsubscribe => (None, Some(SuppressionReason::Unsubscribe)),
        };
        Feedback {
            mark,
            message_id: self.message_id,
            suppression: reason.map(|reason| NewSuppression {
                address: self.address.clone(),
                reason,
                source,
                detail: self.detail.clone(),
                message_id: self.message_id,
                until: None,
            }),
        }
    }
}

/// The outbox row an email came from, read from its `Message-ID` (`<outbox-42@domain>`)
/// or its `X-Outbox-Id` header.
pub fn outbox_id(message_id: Option<&str>, x_outbox_id: Option<&str>) -> Option<i64> {
    let from_header = x_outbox_id.and_then(|value| value.trim().parse().ok());
    from_header.or_else(|| {
        let inner = message_id?
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>');
        inner
            .strip_prefix("outbox-")?
            .split_once('@')?
            .0
            .parse()
            .ok()
    })
}

/// An address from a notification, or why the notification is refused.
fn address(text: &str) -> Result<String, FeedbackError> {
    crate::suppression::normalize_address(text).map_err(FeedbackError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::outbox_id;

    #[test]
    fn the_row_is_found_by_its_header_or_its_message_id() {
        assert_eq!(outbox_id(Some("<outbox-42@mail.example>"), None), Some(42));
        assert_eq!(outbox_id(None, Some(" 7 ")), Some(7));
        assert_eq!(
            outbox_id(Some("<0100018f@email.amazonses.com>"), None),
            None
        );
        assert_eq!(outbox_id(Some("<outbox-x@a>"), None), None);
    }
}
