//! What one attempt at a message came to, and the outcome it is turned into, decided per
//! message as its send ends: an unreachable server is a release, an outcome the server may
//! have taken is ambiguous, and a panic (caught in `message_sender`) is counted as an
//! attempt so that it cannot loop.

use crate::mailer::{SendError, Sent};
use crate::message::{ClaimedMessage, FailureType, Outcome, ReleaseReason, RetryPolicy};
use crate::render::RenderError;
use crate::render::{ReadPayload, envelope_keys};
use crate::suppression::{Listing, Scope};

/// What an attempt at one message came to, before it is turned into an outcome.
#[derive(Debug)]
pub(super) enum AttemptResult {
    Delivered(Sent),
    RenderFailed(RenderError),
    SendFailed(SendError),
    /// Not started: shutting down, or too close to the end of the lease. (A send given up
    /// at the shutdown bound never comes back: its slot says it was abandoned.)
    NotStarted,
    /// Not started: past its expiry when claimed.
    Expired,
    /// Not started: its producer withdrew it before this claim (`outbox_cancel`).
    Cancelled,
    /// Not sent: every recipient is on the suppression list.
    Suppressed(Listing, usize),
    /// Rendering, sending or deciding the outcome panicked (a bug), with what the panic
    /// said.
    Panicked(String),
}

/// The `error_class` of a message whose render or send panicked.
const PANIC_ERROR_CLASS: &str = "panic";

/// Throttling replies one message may meet without an attempt counted; after them, one
/// more is an ordinary deferral (attempt counted), so that a refusal that only looks like
/// throttling cannot loop forever.
const MAX_THROTTLED_RELEASES: i32 = 20;

/// The outcome an attempt comes to. A send that found the server unreachable before it took
/// anything is released without an attempt, whatever the rest of the batch met: an outage
/// is not the message's fault, even when it starts half-way through a batch.
pub(super) fn outcome_of(
    message: &ClaimedMessage,
    attempt: AttemptResult,
    retry: &RetryPolicy,
) -> Outcome {
    match attempt {
        AttemptResult::Delivered(sent) => Outcome::Sent {
            via: sent.via,
            reply: sent.reply.map(|accepted| accepted.0),
            relay: sent.relay,
            fallback: sent.fallback,
        },
        AttemptResult::RenderFailed(e) => Outcome::DeadLetter {
            error: e.to_string(),
            error_class: e.error_class().to_owned(),
            failure_type: FailureType::Permanent,
        },
        AttemptResult::SendFailed(e) if !e.reached_server() => Outcome::Release {
            reason: ReleaseReason::SmtpUnavailable,
            error: Some(e.to_string()),
        },
        AttemptResult::SendFailed(e)
            if e.is_throttling() && message.throttled_releases < MAX_THROTTLED_RELEASES =>
        {
            Outcome::Release {
                reason: ReleaseReason::Throttled,
                error: Some(e.to_string()),
            }
        }
        AttemptResult::SendFailed(e) => match e.failure_type() {
            FailureType::Permanent => Outcome::DeadLetter {
                error: e.to_string(),
                error_class: e.error_class(),
                failure_type: FailureType::Permanent,
            },
            failure_type @ (FailureType::Transient | FailureType::Ambiguous) => {
                Outcome::after_retryable_failure(
                    e.to_string(),
                    e.error_class(),
                    failure_type,
                    message.attempts,
                    retry,
                )
            }
        },
        // Perhaps handed over already when it panicked: ambiguous, and tried again with
        // an attempt counted, so that a message that always panics ends as a dead letter.
        AttemptResult::Panicked(said) => Outcome::after_retryable_failure(
            format!("outboxd panicked while handling this message (a bug): {said}"),
            PANIC_ERROR_CLASS.to_owned(),
            FailureType::Ambiguous,
            message.attempts,
            retry,
        ),
        AttemptResult::NotStarted => Outcome::not_started(),
        AttemptResult::Expired => Outcome::Expired,
        AttemptResult::Cancelled => Outcome::Cancelled,
        AttemptResult::Suppressed(listing, recipients) => suppressed(listing, recipients),
    }
}

/// Every recipient is on the list: the first one's entry says why, and for which kinds.
fn suppressed(Listing { reason, scope }: Listing, recipients: usize) -> Outcome {
    let entry = match scope {
        Scope::All => reason.to_string(),
        Scope::Lane(lane) => format!("{} {reason}", lane.as_str()),
    };
    Outcome::Suppressed {
        reason,
        scope,
        error: format!(
            "not sent: every recipient ({recipients}) is on the suppression list ({entry})"
        ),
    }
}

/// A message refused because one of several recipients does not exist is tried again at
/// once (an attempt counted): that recipient is suppressed by then, so the next attempt
/// goes to the others. With one recipient it stays a dead letter.
pub(super) fn without_the_bounced(
    message: &ClaimedMessage,
    payload: &ReadPayload,
    outcome: Outcome,
    retry: &RetryPolicy,
) -> Outcome {
    let Outcome::DeadLetter {
        error, error_class, ..
    } = outcome
    else {
        return outcome;
    };
    let recipients: std::collections::HashSet<String> = payload
        .as_ref()
        .map(envelope_keys)
        .unwrap_or_default()
        .into_iter()
        .collect();
    if recipients.len() < 2 {
        return Outcome::DeadLetter {
            error,
            error_class,
            failure_type: FailureType::Permanent,
        };
    }
    match Outcome::after_retryable_failure(
        format!("{error}; trying the other recipients again"),
        error_class,
        FailureType::Permanent,
        message.attempts,
        retry,
    ) {
        Outcome::Retry {
            error,
            error_class,
            failure_type,
            ..
        } => Outcome::Retry {
            error,
            error_class,
            failure_type,
            delay: std::time::Duration::ZERO,
        },
        dead => dead,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{AttemptResult, MAX_THROTTLED_RELEASES, PANIC_ERROR_CLASS, outcome_of};
    use crate::mailer::{Reply, SendError};
    use crate::message::{ClaimedMessage, FailureType, Outcome, ReleaseReason, RetryPolicy};

    fn message(throttled_releases: i32) -> ClaimedMessage {
        ClaimedMessage {
            throttled_releases,
            ..ClaimedMessage::for_tests("account_verification", "{}")
        }
    }

    fn throttled() -> AttemptResult {
        AttemptResult::SendFailed(SendError::Deferred {
            reply: Reply::new(454, "Throttling failure: Maximum sending rate exceeded."),
        })
    }

    #[test]
    fn a_panicking_send_is_an_ambiguous_failure_that_ends_as_a_dead_letter() {
        let retry = RetryPolicy {
            max_attempts: 3,
            base: Duration::from_secs(30),
            max: Duration::from_secs(3600),
        };
        let again = || AttemptResult::Panicked("index out of bounds".into());
        let Outcome::Retry {
            error,
            error_class,
            failure_type,
            delay,
        } = outcome_of(&message(0), again(), &retry)
        else {
            panic!("a first panic is retried");
        };
        assert!(
            error.contains("panicked") && error.contains("index out of bounds"),
            "{error}"
        );
        assert_eq!(error_class, PANIC_ERROR_CLASS);
        assert_eq!(failure_type, FailureType::Ambiguous);
        assert!(delay >= Duration::from_secs(30), "backs off: {delay:?}");
        let last = ClaimedMessage {
            attempts: 2,
            ..message(0)
        };
        assert!(matches!(
            outcome_of(&last, again(), &retry),
            Outcome::DeadLetter { .. }
        ));
    }

    #[test]
    fn throttling_costs_no_attempt_until_a_message_has_met_too_much_of_it() {
        let retry = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(30),
            max: Duration::from_secs(3600),
        };
        assert!(matches!(
            outcome_of(&message(0), throttled(), &retry),
            Outcome::Release {
                reason: ReleaseReason::Throttled,
                ..
            }
        ));
        assert!(matches!(
            outcome_of(&message(MAX_THROTTLED_RELEASES), throttled(), &retry),
            Outcome::Retry { .. }
        ));
    }
}
