//! Series registered at 0 when outboxd starts, so that a rate over them has a series before
//! its first event: the feedback counters per source, and the suppressed counter per kind.

use metrics::counter;

use super::{
    BOUNCE_LISTENER, BOUNCES, COMPLAINTS, RECIPIENT_LOOKUPS, SUPPRESSED, UNSUBSCRIBES,
    WEBHOOK_REQUESTS,
};
use crate::message::Lane;
use crate::suppression::{BounceType, FeedbackSource, Scope, SuppressionReason};
use crate::telemetry::labels::{DsnResult, LookupResult, UnsubscribeResult, WebhookResult};

/// The bounce, complaint and webhook counters at 0 for every source that can report them,
/// and the recipient lookups' and unsubscribes' for every result.
pub(super) fn register_feedback_counters() {
    for result in LookupResult::ALL {
        counter!(RECIPIENT_LOOKUPS, "result" => result.as_str()).increment(0);
    }
    for result in UnsubscribeResult::ALL {
        counter!(UNSUBSCRIBES, "result" => result.as_str()).increment(0);
    }
    for result in DsnResult::ALL {
        counter!(BOUNCE_LISTENER, "result" => result.as_str()).increment(0);
    }
    for source in FeedbackSource::ALL {
        if matches!(source, FeedbackSource::Operator | FeedbackSource::OneClick) {
            continue;
        }
        for bounce_type in BounceType::ALL {
            counter!(BOUNCES, "source" => source.as_str(), "type" => bounce_type.as_str())
                .increment(0);
        }
        if !matches!(source, FeedbackSource::Smtp | FeedbackSource::Dsn) {
            counter!(COMPLAINTS, "source" => source.as_str()).increment(0);
            for result in WebhookResult::ALL {
                counter!(WEBHOOK_REQUESTS, "source" => source.as_str(), "result" => result.as_str())
                    .increment(0);
            }
        }
    }
}

/// The suppressed counter's series of `kind`: the entries that can stop it, every kind's
/// and its lane's (a hard bounce is every kind's only).
pub(super) fn register_suppressed(kind: &str, lane: Lane) {
    for reason in SuppressionReason::ALL {
        for scope in [Scope::All, Scope::Lane(lane)] {
            if reason == SuppressionReason::HardBounce && scope != Scope::All {
                continue;
            }
            let (reason, scope) = (reason.as_str(), scope.as_str());
            counter!(SUPPRESSED, "kind" => kind.to_owned(), "reason" => reason, "scope" => scope)
                .increment(0);
        }
    }
}
