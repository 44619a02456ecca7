//! Recall and replace by key, in the application's own transaction: what the SQL functions
//! `outbox_cancel`, `outbox_cancel_id` and `outbox_replace` (outboxd's migration 30) answer.

/// What became of a message its producer withdrew: `outbox_cancel`'s answer, word for word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelAnswer {
    /// It was pending, and will never be sent, once the transaction commits (rolled back,
    /// it is sent).
    Cancelled,
    /// A replica holds it now: it may be sent; if that send fails, it is never tried again.
    InFlight,
    Sent,
    /// Dead-lettered, expired, suppressed, or cancelled before.
    Ended,
    NotFound,
}

impl CancelAnswer {
    pub const ALL: [CancelAnswer; 5] = [
        CancelAnswer::Cancelled,
        CancelAnswer::InFlight,
        CancelAnswer::Sent,
        CancelAnswer::Ended,
        CancelAnswer::NotFound,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CancelAnswer::Cancelled => "cancelled",
            CancelAnswer::InFlight => "in_flight",
            CancelAnswer::Sent => "sent",
            CancelAnswer::Ended => "ended",
            CancelAnswer::NotFound => "not_found",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|answer| answer.as_str() == text)
    }
}

/// What an enqueue that may replace (`Outbox::replace`) did: `outbox_replace`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplaceAnswer {
    /// No message had the key: this one is enqueued.
    Enqueued,
    /// The pending message of the key now says what this one says, and is due when it is.
    Replaced,
    /// The message of the key is held by a replica now: nothing changed.
    InFlight,
    /// The message of the key was sent: nothing changed.
    Sent,
    /// The message of the key ended unsent: nothing changed.
    Ended,
}

impl ReplaceAnswer {
    pub const ALL: [ReplaceAnswer; 5] = [
        ReplaceAnswer::Enqueued,
        ReplaceAnswer::Replaced,
        ReplaceAnswer::InFlight,
        ReplaceAnswer::Sent,
        ReplaceAnswer::Ended,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReplaceAnswer::Enqueued => "enqueued",
            ReplaceAnswer::Replaced => "replaced",
            ReplaceAnswer::InFlight => "in_flight",
            ReplaceAnswer::Sent => "sent",
            ReplaceAnswer::Ended => "ended",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|answer| answer.as_str() == text)
    }
}

/// An enqueue that may replace: the message of the key, and what became of this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// The id of the key's message (this one's, when enqueued).
    pub id: i64,
    pub answer: ReplaceAnswer,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_reads_back_as_itself() {
        for answer in CancelAnswer::ALL {
            assert_eq!(CancelAnswer::parse(answer.as_str()), Some(answer));
        }
        for answer in ReplaceAnswer::ALL {
            assert_eq!(ReplaceAnswer::parse(answer.as_str()), Some(answer));
        }
        assert_eq!(CancelAnswer::parse("gone"), None);
    }
}
