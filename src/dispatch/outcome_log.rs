//! The one line logged for each outcome recorded, and the latency a sent one reports.

use std::time::Duration;

use tracing::{debug, error, info, warn};

use crate::message::{ClaimedBatch, ClaimedMessage, Delivery, Outcome};
use crate::text::mask_addresses;

/// From when the message fell due to when the server accepted it.
pub(super) fn latency(
    claimed: &ClaimedBatch,
    message: &ClaimedMessage,
    after: Duration,
) -> Duration {
    let sent_at = claimed.claimed_at + chrono::Duration::from_std(after).unwrap_or_default();
    (sent_at - message.due_at).to_std().unwrap_or_default()
}

/// One line per recorded outcome; never a recipient address.
pub(super) fn log_outcome(message: &ClaimedMessage, outcome: &Outcome, latency: Option<Duration>) {
    let (id, kind) = (message.id, message.kind.as_str());
    let attempts = message.attempts.saturating_add(1);
    match outcome {
        // Debug, not info: at the default level a line per sent message cost about a sixth
        // of the drain's CPU (BENCHMARKS.md); failures and dead letters are still logged.
        Outcome::Sent {
            via: Delivery::Smtp,
            ..
        } => debug!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            latency_seconds = latency.unwrap_or_default().as_secs_f64(),
            "sent"
        ),
        Outcome::Sent {
            via: Delivery::LoggedOnly,
            ..
        } => warn!(
            outbox.id = id,
            outbox.kind = %kind,
            "NOT SENT: no SMTP server is configured; ended as logged_only"
        ),
        Outcome::Retry { error, delay, .. } => warn!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            retry_in = %crate::text::duration(*delay),
            error = %mask_addresses(error),
            "send failed; will retry"
        ),
        Outcome::DeadLetter {
            error,
            failure_type,
            ..
        } => error!(
            outbox.id = id,
            outbox.kind = %kind,
            attempts,
            class = failure_type.as_str(),
            error = %mask_addresses(error),
            "dead-lettered"
        ),
        Outcome::Release { reason, .. } => {
            debug!(outbox.id = id, outbox.kind = %kind, reason = reason.as_str(), "released unsent");
        }
        Outcome::Expired => info!(outbox.id = id, outbox.kind = %kind, "expired unsent"),
        Outcome::Cancelled => info!(
            outbox.id = id,
            outbox.kind = %kind,
            "withdrawn by its producer while claimed: ended unsent"
        ),
        Outcome::Suppressed { reason, scope, .. } => info!(
            outbox.id = id,
            outbox.kind = %kind,
            reason = reason.as_str(),
            scope = scope.as_str(),
            "not sent: every recipient is suppressed"
        ),
    }
}
