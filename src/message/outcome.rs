//! What can become of a message: its outcome, the failures that lead there, and the retry
//! policy that spaces its attempts.

use std::time::Duration;

use crate::suppression::{Scope, SuppressionReason};

use super::MAX_ERROR_CHARS;

/// How a message left outboxd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Accepted by the SMTP server.
    Smtp,
    /// Not sent: no SMTP server is configured, so it was only logged.
    LoggedOnly,
}

impl Delivery {
    /// The `delivery` label of `outbox_messages_sent_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Smtp => "smtp",
            Delivery::LoggedOnly => "log",
        }
    }
}

/// What a failed attempt says of the message's fate: the `class` label of the failure
/// counters and the span's `error.type`. (The stored `error_class` is something else: the
/// failure's short name, such as `smtp_550`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureType {
    /// Not delivered, and worth trying again later: a 4xx reply, a timeout or a dropped
    /// connection before the server took the message.
    Transient,
    /// Not delivered, and never will be as it is: a 5xx reply, an unknown kind, a payload
    /// that does not render.
    Permanent,
    /// Perhaps delivered: the server had the whole message when the connection failed or
    /// its reply did not come. Tried again; the same `Message-ID` lets receivers drop the copy.
    Ambiguous,
}

impl FailureType {
    pub const ALL: [FailureType; 3] = [
        FailureType::Transient,
        FailureType::Permanent,
        FailureType::Ambiguous,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureType::Transient => "transient",
            FailureType::Permanent => "permanent",
            FailureType::Ambiguous => "ambiguous",
        }
    }
}

/// What becomes of a claimed row. Every outcome is recorded through one function, so the
/// table and whatever counts outcomes can never disagree.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Accepted by the SMTP server (or, without SMTP, logged and marked dispatched), with
    /// the server's reply accepting it (`250 2.0.0 Ok: queued as 4XyZ`).
    Sent {
        via: Delivery,
        reply: Option<String>,
        /// The relay that took it (`host:port`), and whether it was a fallback.
        relay: Option<String>,
        fallback: bool,
    },
    /// Failed; try again after `delay`. Counts an attempt. `error_class` names the failure
    /// for grouping (`smtp_451`, `unreachable`, `render`...).
    Retry {
        error: String,
        error_class: String,
        /// `Transient` or `Ambiguous`.
        failure_type: FailureType,
        delay: Duration,
    },
    /// Failed for good: kept for an operator, never retried by itself. Counts an attempt.
    DeadLetter {
        error: String,
        error_class: String,
        failure_type: FailureType,
    },
    /// Given back unsent and due at once, without counting an attempt: shutdown, a lease
    /// about to run out, or an SMTP outage that is not the message's fault. `error` is
    /// what the send met, if it was started.
    Release {
        reason: ReleaseReason,
        error: Option<String>,
    },
    /// Not sent because its `expires_at` (or its kind's `OUTBOXD_EXPIRE_AFTER`) passed:
    /// it ends with `end_reason = 'expired'`, not as a dead letter.
    Expired,
    /// Not sent because the producer withdrew it (`outbox_cancel`) while a replica held it:
    /// it ends with `end_reason = 'cancelled'`.
    Cancelled,
    /// Not sent because every recipient is on the suppression list: it ends with
    /// `end_reason = 'suppressed'`, not as a dead letter. `reason` is the first
    /// recipient's.
    Suppressed {
        reason: SuppressionReason,
        /// The kinds the entry stops: every kind, or the message's lane.
        scope: Scope,
        error: String,
    },
}

/// Why a claimed message was given back unsent: the `reason` label of
/// `outbox_messages_released_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    /// Shutting down, or too close to the end of the lease, before the send started.
    NotStarted,
    /// The send was given up at the shutdown bound; it may or may not have been delivered.
    Abandoned,
    /// No message of the batch reached the SMTP server: an outage, not this message's fault.
    SmtpUnavailable,
    /// The relay said it is throttling us: the pace is at fault, not the message.
    Throttled,
}

impl ReleaseReason {
    pub const ALL: [ReleaseReason; 4] = [
        ReleaseReason::NotStarted,
        ReleaseReason::Abandoned,
        ReleaseReason::SmtpUnavailable,
        ReleaseReason::Throttled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::NotStarted => "not_started",
            ReleaseReason::Abandoned => "abandoned",
            ReleaseReason::SmtpUnavailable => "smtp_unavailable",
            ReleaseReason::Throttled => actions::THROTTLED,
        }
    }
}

impl Outcome {
    /// A release for a send that was not started.
    pub fn not_started() -> Outcome {
        Outcome::Release {
            reason: ReleaseReason::NotStarted,
            error: None,
        }
    }

    /// A release for a send given up at the shutdown bound.
    pub fn abandoned() -> Outcome {
        Outcome::Release {
            reason: ReleaseReason::Abandoned,
            error: Some("abandoned at shutdown while sending; it may have been delivered".into()),
        }
    }

    /// The stable word stored and logged for this outcome.
    pub fn action(&self) -> &'static str {
        match self {
            Outcome::Sent {
                via: Delivery::LoggedOnly,
                ..
            } => actions::LOGGED_ONLY,
            Outcome::Sent { .. } => actions::SENT,
            Outcome::Retry { .. } => actions::RETRY,
            Outcome::DeadLetter { .. } => actions::DEAD,
            Outcome::Release { .. } => actions::RELEASE,
            Outcome::Expired => actions::EXPIRED,
            Outcome::Cancelled => actions::CANCELLED,
            Outcome::Suppressed { .. } => actions::SUPPRESSED,
        }
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            Outcome::Sent { .. } | Outcome::Expired | Outcome::Cancelled => None,
            Outcome::Retry { error, .. }
            | Outcome::DeadLetter { error, .. }
            | Outcome::Suppressed { error, .. } => Some(error),
            Outcome::Release { error, .. } => error.as_deref(),
        }
    }

    /// The failure's short name, stored as `error_class` for grouping dead letters.
    pub fn error_class(&self) -> Option<&str> {
        match self {
            Outcome::Retry { error_class, .. } | Outcome::DeadLetter { error_class, .. } => {
                Some(error_class)
            }
            Outcome::Release {
                reason: ReleaseReason::SmtpUnavailable,
                ..
            } => Some("unreachable"),
            Outcome::Release {
                reason: ReleaseReason::Throttled,
                ..
            } => Some(actions::THROTTLED),
            Outcome::Suppressed { .. } => Some("suppressed"),
            _ => None,
        }
    }

    pub fn delay(&self) -> Duration {
        match self {
            Outcome::Retry { delay, .. } => *delay,
            _ => Duration::ZERO,
        }
    }

    /// A transient or ambiguous failure becomes a retry, or a dead letter once the limit is
    /// reached.
    pub fn after_retryable_failure(
        error: String,
        error_class: String,
        failure_type: FailureType,
        attempts_before: i32,
        retry: &RetryPolicy,
    ) -> Outcome {
        let attempts = u32::try_from(attempts_before)
            .unwrap_or(0)
            .saturating_add(1);
        if attempts >= retry.max_attempts {
            Outcome::DeadLetter {
                error: format!("gave up after {attempts} attempts: {error}"),
                error_class,
                failure_type,
            }
        } else {
            Outcome::Retry {
                error,
                error_class,
                failure_type,
                delay: retry.delay_after(attempts),
            }
        }
    }
}

/// How failed attempts are spaced out and when to give up.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts (including the first) before a message is dead-lettered.
    pub max_attempts: u32,
    /// The first retry's delay; each further one doubles, with jitter. Zero: due at once,
    /// claimed a few batches later during a drain, else at the next wake-up or poll.
    pub base: Duration,
    /// No retry waits longer than this.
    pub max: Duration,
}

impl RetryPolicy {
    /// The delay after `attempts` failed attempts (1 for the first failure).
    pub fn delay_after(&self, attempts: u32) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        let steps = usize::try_from(attempts.max(1) - 1).unwrap_or(usize::MAX);
        backon::BackoffBuilder::build(
            backon::ExponentialBuilder::new()
                .with_min_delay(self.base)
                .with_max_delay(self.max)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times(),
        )
        .nth(steps)
        .map_or(self.max, |delay| delay.min(self.max))
    }
}

/// Keeps the first [`MAX_ERROR_CHARS`] characters of an error.
pub fn truncate_error(error: &str) -> String {
    crate::text::storable(error, MAX_ERROR_CHARS)
}

/// The `action` of each outcome, as [`Outcome::action`] gives it and the store's outcome
/// statements read it (`sql/outcomes.sql`, checked by the store's word test).
pub(crate) mod actions {
    pub(crate) const SENT: &str = "sent";
    pub(crate) const RETRY: &str = "retry";
    pub(crate) const DEAD: &str = "dead";
    pub(crate) const RELEASE: &str = "release";
    /// Also the `end_reason` of a message ended unsent because its expiry passed.
    pub(crate) const EXPIRED: &str = "expired";
    /// Also the `end_reason` of a message ended unsent because every recipient is suppressed.
    pub(crate) const SUPPRESSED: &str = "suppressed";
    /// Also the `end_reason` of a message ended unsent because no SMTP server is configured:
    /// it was only logged.
    pub(crate) const LOGGED_ONLY: &str = "logged_only";
    /// Also the `end_reason` of a message its producer withdrew (`outbox_cancel`).
    pub(crate) const CANCELLED: &str = "cancelled";
    /// The `error_class` of a release for a throttling reply, which the outcome statement
    /// counts in `throttled_releases`; also the release's `reason` label.
    pub(crate) const THROTTLED: &str = "throttled";
}
