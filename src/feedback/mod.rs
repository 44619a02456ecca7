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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::message::{MessageIds, Named};
use crate::suppression::marks;
use crate::suppression::{BounceType, Feedback, FeedbackSource, NewSuppression, Scope, SuppressionReason};

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
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FeedbackError {
    /// Credentials or signature missing or wrong, or a topic not configured. Its text is
    /// fixed, never the caller's: a provider's integrator is shown it.
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

/// One notification as a provider sent it: its id, when it has one (the same on every
/// retry of it, so that it is recorded once), and what it reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notification {
    pub id: Option<String>,
    pub events: Vec<Event>,
}

/// A bounded wait for one of a few turns: `turns` at once, at most `line` more waiting,
/// each for at most `wait`; past that, a request is refused at once. A request that waits
/// holds its connection, so an unbounded line would let a flood of requests, signed or
/// not, hold every connection of a listener, the probes' included. A request given up on
/// while it waits (its client gone) leaves the line as it goes.
#[derive(Debug)]
pub struct Turnstile {
    turns: Arc<tokio::sync::Semaphore>,
    waiting: AtomicUsize,
    line: usize,
    wait: std::time::Duration,
}

/// A place in a [`Turnstile`]'s line, given back however its wait ends.
struct InLine<'t>(&'t AtomicUsize);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Turnstile {
    pub fn new(turns: usize, line: usize, wait: std::time::Duration) -> Self {
        Self {
            turns: Arc::new(tokio::sync::Semaphore::new(turns)),
            waiting: AtomicUsize::new(0),
            line,
            wait,
        }
    }

    /// A turn, held until the permit is dropped (it may move to another thread), or the
    /// 503 that asks the provider to send it again.
    pub async fn enter(&self) -> Result<tokio::sync::OwnedSemaphorePermit, FeedbackError> {
        let busy = || FeedbackError::Unavailable("busy; send it again".to_owned());
        if let Ok(turn) = Arc::clone(&self.turns).try_acquire_owned() {
            return Ok(turn);
        }
        let place = InLine(&self.waiting);
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.line {
            return Err(busy());
        }
        let turn = tokio::time::timeout(self.wait, Arc::clone(&self.turns).acquire_owned()).await;
        drop(place);
        turn.map_err(|_| busy())?.map_err(|_| busy())
    }
}

/// Where one webhook's notifications are checked and read: HMACs over a body, signatures,
/// JSON. It runs on the blocking pool one at a time, so that a flood of requests, signed or
/// not, leaves the runtime's threads to the dispatcher and the probes; each webhook has
/// its own, so that a flood of one does not refuse the others' notifications.
#[derive(Debug)]
pub struct Checks {
    turnstile: Turnstile,
}

impl Default for Checks {
    /// One at a time (one core's worth on a two-core pod), 32 waiting, 5 s each.
    fn default() -> Self {
        Self {
            turnstile: Turnstile::new(1, 32, std::time::Duration::from_secs(5)),
        }
    }
}

impl Checks {
    /// Runs `check` in its turn; the turn is held until the check has run, even if the
    /// request is given up on meanwhile.
    pub async fn run<T: Send + 'static>(
        &self,
        check: impl FnOnce() -> Result<T, FeedbackError> + Send + 'static,
    ) -> Result<T, FeedbackError> {
        let turn = self.turnstile.enter().await?;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            check()
        })
        .await
        .map_err(|_| FeedbackError::Unavailable("the check failed; send it again".to_owned()))?
    }
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
    pub address: crate::suppression::Address,
    /// How the notification names its outbox row, if it does.
    pub row: RowNames,
    /// What the provider said (a diagnostic code, a feedback type).
    pub detail: Option<String>,
}

impl Event {
    /// The suppression and the row's mark this event makes: hard bounces, complaints and
    /// unsubscribes suppress; soft and undetermined bounces only mark the row.
    /// `ids` tell this installation's rows from another's.
    pub fn feedback(&self, source: FeedbackSource, ids: &MessageIds) -> Feedback {
        let message_id = self.row.row(ids);
        let (mark, reason) = match self.kind {
            EventKind::Bounce(BounceType::Hard) => (
                Some(marks::HARD_BOUNCE),
                Some(SuppressionReason::HardBounce),
            ),
            EventKind::Bounce(BounceType::Soft | BounceType::Undetermined) => {
                (Some(marks::SOFT_BOUNCE), None)
            }
            EventKind::Complaint => (Some(marks::COMPLAINT), Some(SuppressionReason::Complaint)),
            EventKind::Unsubscribe => (None, Some(SuppressionReason::Unsubscribe)),
        };
        Feedback {
            address: self.address.clone(),
            mark,
            message_id,
            detail: self.detail.clone(),
            // Every kind's until the store knows the message: a complaint or an unsubscribe
            // about one then stops its lane only (`NewSuppression::about`).
            suppression: reason.map(|reason| NewSuppression {
                address: self.address.clone(),
                reason,
                scope: Scope::All,
                source,
                detail: self.detail.clone(),
                message_id,
                until: None,
            }),
        }
    }
}

/// How a notification names the outbox row its email came from: the email's
/// `Message-ID` (`<outbox-42.TAG@domain>`), and the id a header (`X-Outbox-Id`) or a
/// field (Postmark's metadata, the Standard Webhooks body's `outbox_id`) gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowNames {
    pub message_id: Option<String>,
    pub outbox_id: Option<i64>,
}

impl RowNames {
    /// The row they name in this installation: none when the Message-ID is another
    /// installation's (its bounce must not mark a row of this one that has the same id),
    /// else the id given, else the Message-ID's.
    pub fn row(&self, ids: &MessageIds) -> Option<i64> {
        let named = self.message_id.as_deref().map(|m| ids.read(m));
        match named {
            Some(Named::Elsewhere) => None,
            Some(Named::Row(id)) => self.outbox_id.or(Some(id)),
            Some(Named::Nothing) | None => self.outbox_id,
        }
    }
}

/// An id as a header or a field writes it (`" 42 "`).
fn parse_id(text: &str) -> Option<i64> {
    text.trim().parse().ok()
}

/// An address from a notification, or why the notification is refused.
fn address(text: &str) -> Result<crate::suppression::Address, FeedbackError> {
    crate::suppression::Address::parse(text).map_err(FeedbackError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::{RowNames, Turnstile, parse_id};
    use crate::message::{InstallationTag, MessageIds};

    #[tokio::test]
    async fn a_wait_given_up_on_leaves_the_line() {
        let turnstile = Turnstile::new(1, 1, std::time::Duration::from_secs(60));
        let held = turnstile.enter().await.unwrap();
        for _ in 0..5 {
            // Waits in the line, then its client goes away.
            let waiting = turnstile.enter();
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(10), waiting)
                    .await
                    .is_err()
            );
        }
        drop(held);
        assert!(
            turnstile.enter().await.is_ok(),
            "the line still has its place"
        );
    }

    #[test]
    fn the_row_is_found_by_its_message_id_or_its_id_and_never_in_another_installation() {
        let ids = MessageIds::new(
            InstallationTag::parse("k3f9q2").unwrap(),
            "mail.example".into(),
        );
        let names = |message_id: Option<&str>, outbox_id| RowNames {
            message_id: message_id.map(str::to_owned),
            outbox_id,
        };
        assert_eq!(names(Some(&ids.of(42)), None).row(&ids), Some(42));
        assert_eq!(
            names(Some("<outbox-42@mail.example>"), None).row(&ids),
            Some(42)
        );
        assert_eq!(names(None, Some(7)).row(&ids), Some(7));
        assert_eq!(
            names(Some("<0100018f@amazonses.com>"), Some(7)).row(&ids),
            Some(7)
        );
        // Staging's bounce, through a provider account production shares.
        let staging = "<outbox-42.a0b1c2@mail.example>";
        assert_eq!(names(Some(staging), None).row(&ids), None);
        assert_eq!(names(Some(staging), Some(42)).row(&ids), None);
        assert_eq!(parse_id(" 7 "), Some(7));
    }
}
