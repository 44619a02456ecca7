//! Delivery callbacks to the application (`OUTBOXD_CALLBACK_URL`): each message's terminal
//! events, which the statements that record outcomes, providers' reports and producers'
//! cancels keep in `outbox_callbacks` (so that a crash loses none and a slow endpoint never
//! slows delivery), POSTed as JSON signed per the Standard Webhooks specification, at least
//! once, in order per message, retried with backoff until `OUTBOXD_CALLBACK_MAX_AGE`, then
//! kept as failed. Why: docs/adr/0009-delivery-callbacks.md.

mod body;
mod sender;

use std::time::Duration;

pub use body::callback_body;
pub use sender::run;

use crate::webhook_signature::WebhookSecret;

/// Where and how callbacks go.
#[derive(Debug)]
pub struct CallbackSettings {
    pub url: url::Url,
    pub secret: WebhookSecret,
    /// A callback not delivered within this long of its event is given up on.
    pub max_age: Duration,
}

/// How long one POST may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Callbacks sent at once: each is a different message's (a message's next waits for its
/// last).
pub const CONCURRENCY: usize = 8;
/// The most claimed at a time.
pub const BATCH: i64 = 64;

