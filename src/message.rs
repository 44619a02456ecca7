//! The domain: what an outbox message is, and what can become of one. No I/O here.

use chrono::{DateTime, Utc};
use serde_json::Value;


mod cancel;
mod message_id;
mod outcome;
mod pause;
mod return_path;

pub use crate::lane::{Lane, Lanes, parse_kinds};
pub use cancel::{FilterRequest, PendingFilter};
pub use message_id::{InstallationTag, MessageIds, Named};
pub use return_path::{MIN_SECRET_CHARS as MIN_BOUNCE_SECRET_CHARS, ReturnPaths};
/// A message as a producer hands it over, and its checks: the producer crate's, so that an
/// application enqueueing with it and outboxd refuse the same.
pub use outboxd_producer::{
    CancelAnswer, InvalidMessage, Kind, MAX_SECRET_FIELDS, NewMessage, SecretField, Tag,
};
pub(crate) use outcome::actions;
pub use outcome::{Delivery, FailureType, Outcome, ReleaseReason, RetryPolicy, truncate_error};
pub use pause::{
    AUTOMATIC_ACTOR, AutoPause, MAX_PAUSE_REASON_CHARS, NewPause, PauseRequest, RecentSends,
    parse_share,
};

/// How much of an error is kept on the row, as the original design did.
pub const MAX_ERROR_CHARS: usize = 500;

/// A row this dispatcher holds a lease on.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedMessage {
    pub id: i64,
    pub kind: String,
    /// Read from the row's text, so that a payload outboxd cannot use fails this row alone.
    #[sqlx(try_from = "Option<String>")]
    pub payload: ClaimedPayload,
    /// The length of the payload's text in the database.
    pub payload_bytes: i32,
    /// Failed attempts before this one.
    pub attempts: i32,
    /// The producer's W3C trace context, if it recorded one.
    pub traceparent: Option<String>,
    /// The previous claimer's lease ran out without an outcome (it crashed or stalled).
    pub reclaimed: bool,
    /// When the message fell due: the later of `created_at` and `not_before`.
    pub due_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The producer's deadline, if it set one.
    pub expires_at: Option<DateTime<Utc>>,
    pub priority: i16,
    /// Throttling replies met so far, each released without an attempt.
    pub throttled_releases: i32,
    /// Its producer withdrew it while a replica held it (`outbox_cancel`): not to be sent.
    pub cancel_requested: bool,
}

#[cfg(test)]
impl ClaimedMessage {
    /// A fresh message of `kind` with this payload text, as a claim would return it.
    pub(crate) fn for_tests(kind: &str, payload: &str) -> Self {
        Self {
            id: 7,
            kind: kind.into(),
            payload: ClaimedPayload::from(Some(payload.to_owned())),
            payload_bytes: i32::try_from(payload.len()).unwrap_or(i32::MAX),
            attempts: 0,
            traceparent: None,
            reclaimed: false,
            due_at: chrono::Utc::now(),
            created_at: chrono::Utc::now(),
            expires_at: None,
            priority: 0,
            throttled_releases: 0,
            cancel_requested: false,
        }
    }
}

/// A claimed row's payload, as the text PostgreSQL sent, or nothing where the text was
/// over the size limit and stayed in the database. Read by the send task that renders it,
/// so that a payload outboxd cannot use fails its own row only. A payload may nest at most
/// 128 levels deep (serde_json's limit), its numbers must fit a 64-bit float (PostgreSQL's
/// `jsonb` allows more of both), and its text is bounded by the message size.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedPayload(Option<String>);

impl From<Option<String>> for ClaimedPayload {
    fn from(text: Option<String>) -> Self {
        Self(text)
    }
}

impl ClaimedMessage {
    /// The payload as a JSON object, or why it cannot be used.
    pub fn read_payload(&self, max_bytes: usize) -> Result<Value, String> {
        let bytes = usize::try_from(self.payload_bytes).unwrap_or(usize::MAX);
        let text = match &self.payload.0 {
            Some(text) if text.len() <= max_bytes => text,
            _ => {
                return Err(format!(
                    "payload is {bytes} bytes: more than the limit of {max_bytes} (OUTBOXD_MAX_MESSAGE_BYTES)"
                ));
            }
        };
        match serde_json::from_str(text) {
            Ok(value @ Value::Object(_)) => Ok(value),
            Ok(_) => Err("payload is not a JSON object".to_owned()),
            Err(e) => Err(format!("payload cannot be read: {e}")),
        }
    }
}

/// The rows one claim took, the claim's token, and the database's clock at claim time.
#[derive(Debug, Clone)]
pub struct ClaimedBatch {
    pub token: uuid::Uuid,
    pub claimed_at: DateTime<Utc>,
    /// What the transactional lane's part of the claim found, for where the lane's next
    /// claim can scan from.
    pub transactional: LaneScan,
    /// The same for the bulk lane, which a claim scans from a floor of its own.
    pub bulk: LaneScan,
    /// Shared with the tasks that send them, without copying payloads.
    pub messages: std::sync::Arc<[ClaimedMessage]>,
}

/// What one lane's part of a claim found below the bound of its due range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneScan {
    /// The lowest `next_attempt_at` among the lane's rows claimed, before the claim: no
    /// row of the lane due below it was left behind.
    pub lowest_due: Option<DateTime<Utc>>,
    /// When the lane's part took fewer rows than it could, the bound of the due range it
    /// scanned (the database's clock, or a drain's `due_by`): no row of the lane that was
    /// due by then, unlocked and of a kind not paused, was left behind.
    pub emptied_to: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn kinds_are_kept_to_a_safe_alphabet() {
        assert!(Kind::parse("account_verification").is_ok());
        assert!(Kind::parse("v2.invoice-notice").is_ok());
        for bad in [
            "",
            "../etc",
            "Upper",
            "with space",
            ".hidden",
            &"a".repeat(101),
        ] {
            assert!(Kind::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_zero_base_retries_at_the_next_poll() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base: Duration::ZERO,
            max: Duration::from_secs(3600),
        };
        assert_eq!(policy.delay_after(3), Duration::ZERO);
    }

    #[test]
    fn delays_grow_exponentially_with_jitter_and_stay_under_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 20,
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
        };
        let first = policy.delay_after(1);
        assert!(first >= Duration::from_secs(10) && first < Duration::from_secs(20));
        let third = policy.delay_after(3);
        assert!(third >= Duration::from_secs(40) && third < Duration::from_secs(80));
        assert_eq!(policy.delay_after(15), Duration::from_secs(300));
    }

    #[test]
    fn the_last_allowed_attempt_dead_letters() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        let retry = Outcome::after_retryable_failure(
            "451 busy".into(),
            "smtp_451".into(),
            FailureType::Transient,
            3,
            &policy,
        );
        assert_eq!(retry.action(), "retry");
        let dead = Outcome::after_retryable_failure(
            "451 busy".into(),
            "smtp_451".into(),
            FailureType::Transient,
            4,
            &policy,
        );
        assert_eq!(dead.error_class(), Some("smtp_451"));
        assert_eq!(dead.action(), "dead");
        assert!(dead.error().unwrap().contains("after 5 attempts"));
    }
}
