//! An operator's pause of one kind: which kind, and why. A paused kind's messages stay
//! pending and unclaimed on every replica until it is resumed; nothing is lost.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::Kind;

/// outboxd itself where it acts on its own: who pauses a kind automatically (in the pause
/// and the audit log), and who discards a message it ends (`discarded_by` of an expired or
/// suppressed one, written by the outcome statement: `actor.automatic` in its file).
pub const AUTOMATIC_ACTOR: &str = "outboxd";

/// The longest reason kept with a pause.
pub const MAX_PAUSE_REASON_CHARS: usize = 500;

/// A pause as an operator asks for it, before it is checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    pub reason: String,
}

/// A pause checked: a kind name outboxd could have templates for, and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPause {
    pub kind: Kind,
    pub reason: String,
}

impl NewPause {
    /// Checks `kind` as a message's kind is checked, and `reason`: 1 to
    /// [`MAX_PAUSE_REASON_CHARS`] characters once trimmed, no control character.
    pub fn new(kind: &str, reason: &str) -> Result<Self, String> {
        let kind = Kind::parse(kind).map_err(|e| e.to_string())?;
        let reason = reason.trim();
        if reason.is_empty() {
            return Err("a pause needs a reason: say why, for whoever resumes it".to_owned());
        }
        if reason.chars().count() > MAX_PAUSE_REASON_CHARS {
            return Err(format!(
                "the reason must be at most {MAX_PAUSE_REASON_CHARS} characters"
            ));
        }
        if reason.chars().any(char::is_control) {
            return Err("the reason must not hold control characters".to_owned());
        }
        Ok(Self {
            kind,
            reason: reason.to_owned(),
        })
    }
}

/// The fewest sends a kind's judgement reads, whatever `OUTBOXD_AUTO_PAUSE_WINDOW` says: a
/// share of a few dozen sends is mostly chance.
pub const MIN_SENDS_JUDGED: u32 = 100;
/// The fewest distinct recipients whose complaints can pause a kind. Complaints are counted
/// by complainer, not by email: one person (or one outsider with a mailbox of their own)
/// marking three of the emails they asked for as spam is one voice, and paused a sign-up
/// kind for everyone.
pub const MIN_COMPLAINERS: i64 = 5;
/// The fewest distinct recipients whose hard bounces can pause a kind.
pub const MIN_BOUNCED_RECIPIENTS: i64 = 5;

/// Pausing a kind by itself when its recipients bounce or complain too much
/// (`OUTBOXD_AUTO_PAUSE_KINDS`), as SES pauses an account: off for every kind not listed,
/// and never for an exempt kind (`OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS`).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoPause {
    pub kinds: BTreeSet<Kind>,
    /// Hard-bounced recipients per send at which a kind is paused.
    pub hard_bounce_share: f64,
    /// Complainers per send at which a kind is paused.
    pub complaint_share: f64,
    /// How many of the kind's latest sends are judged ([`MIN_SENDS_JUDGED`] at least);
    /// fewer are not judged at all.
    pub window: u32,
}

/// A kind's latest sends, and how many distinct recipients among them bounced hard or
/// complained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct RecentSends {
    pub sends: i64,
    pub bounced_recipients: i64,
    pub complainers: i64,
    /// Where the judged sends begin: the kind's last resume, or a day ago. A pause on this
    /// judgment is void once a later resume is on record.
    pub since: DateTime<Utc>,
}

impl AutoPause {
    /// How many of a kind's latest sends are judged.
    pub fn judged_sends(&self) -> u32 {
        self.window.max(MIN_SENDS_JUDGED)
    }

    /// Why `recent` pauses its kind, or `None`: below both thresholds, too few sends to
    /// judge, or too few distinct recipients bounced or complained.
    pub fn breach(&self, recent: &RecentSends) -> Option<String> {
        if recent.sends < i64::from(self.judged_sends()) {
            return None;
        }
        let share = |n: i64| n as f64 / recent.sends as f64;
        let (what, seen, threshold) = if recent.complainers >= MIN_COMPLAINERS
            && share(recent.complainers) >= self.complaint_share
        {
            (
                "recipients who complained of spam",
                share(recent.complainers),
                self.complaint_share,
            )
        } else if recent.bounced_recipients >= MIN_BOUNCED_RECIPIENTS
            && share(recent.bounced_recipients) >= self.hard_bounce_share
        {
            (
                "recipients who bounced hard",
                share(recent.bounced_recipients),
                self.hard_bounce_share,
            )
        } else {
            return None;
        };
        Some(format!(
            "paused automatically: {what} were {:.2}% of the last {} sends (threshold {:.2}%)",
            seen * 100.0,
            recent.sends,
            threshold * 100.0
        ))
    }
}

/// Reads a share: `5%`, or `0.05`; more than 0, at most 1.
pub fn parse_share(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let share = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| format!("{text:?}: expected a share, like 5% or 0.05"))?;
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(format!(
            "{text:?}: a share must be more than 0 and at most 100%"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_needs_a_valid_kind_and_a_reason() {
        let pause = NewPause::new("newsletter", "  template ships broken  ").expect("valid");
        assert_eq!(pause.reason, "template ships broken");
        for (kind, reason) in [
            ("News", "why"),
            ("../x", "why"),
            ("newsletter", "   "),
            ("newsletter", "line\nbreak"),
            ("newsletter", &"x".repeat(MAX_PAUSE_REASON_CHARS + 1)),
        ] {
            assert!(NewPause::new(kind, reason).is_err(), "{kind:?} {reason:?}");
        }
    }

    fn auto_pause() -> AutoPause {
        AutoPause {
            kinds: BTreeSet::from([Kind::parse("newsletter").expect("a kind")]),
            hard_bounce_share: 0.10,
            complaint_share: 0.005,
            window: 100,
        }
    }

    #[test]
    fn a_kind_pauses_at_either_threshold_once_enough_was_sent_to_judge() {
        let recent = |sends, bounced_recipients, complainers| RecentSends {
            sends,
            bounced_recipients,
            complainers,
            since: DateTime::UNIX_EPOCH,
        };
        let rule = auto_pause();
        assert_eq!(rule.breach(&recent(99, 99, 99)), None, "too few to judge");
        assert_eq!(rule.breach(&recent(100, 9, 0)), None);
        let bounced = rule.breach(&recent(100, 10, 0)).expect("bounces");
        assert!(
            bounced.contains("recipients who bounced hard were 10.00% of the last 100"),
            "{bounced}"
        );
        let complained = rule.breach(&recent(1000, 0, 5)).expect("complaints");
        assert!(
            complained.contains("complained of spam were 0.50%"),
            "{complained}"
        );
    }

    #[test]
    fn a_few_recipients_cannot_pause_a_kind_whatever_their_share() {
        let rule = AutoPause {
            window: 10,
            ..auto_pause()
        };
        assert_eq!(
            rule.judged_sends(),
            MIN_SENDS_JUDGED,
            "the window has a floor"
        );
        let recent = |bounced_recipients, complainers| RecentSends {
            sends: 100,
            bounced_recipients,
            complainers,
            since: DateTime::UNIX_EPOCH,
        };
        // Three complaints from one mailbox are one complainer: 1% of 100, not enough.
        assert_eq!(rule.breach(&recent(0, 1)), None);
        assert_eq!(rule.breach(&recent(0, MIN_COMPLAINERS - 1)), None);
        assert!(rule.breach(&recent(0, MIN_COMPLAINERS)).is_some());
        assert_eq!(rule.breach(&recent(MIN_BOUNCED_RECIPIENTS - 1, 0)), None);
    }

    #[test]
    fn shares_read_as_percentages_or_fractions_and_nothing_else() {
        assert_eq!(parse_share("5%"), Ok(0.05));
        assert_eq!(parse_share("0.005"), Ok(0.005));
        for bad in ["0", "0%", "150%", "1.5", "-1%", "five", ""] {
            assert!(parse_share(bad).is_err(), "{bad:?}");
        }
    }
}
