//! The suppression list's domain: which addresses outboxd will not mail, and why. No I/O.
//!
//! An address is kept lower-cased, local part included. RFC 5321 lets a server treat local
//! parts case-sensitively, but no mail provider in use does, and the cost of the mistake
//! is one-sided: a case-sensitive list would mail `Ada@example.com` after `ada@example.com`
//! bounced or complained. Amazon SES and Postmark compare suppressions the same way.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::lane::Lane;

mod address;

pub use address::{Address, lookup_forms};

/// What the claim statement found of a batch's recipients on the list: the addresses it
/// read from the payloads (by a simpler rule than the renderer's, see `store::claim`) and
/// those of them listed. An address the renderer finds that is not among `looked_up` must
/// still be looked up.
#[derive(Debug, Clone, Default)]
pub struct ListedAtClaim {
    pub looked_up: HashSet<String>,
    pub listed: HashMap<String, Vec<Listing>>,
}

/// Why an address is on the list: the `reason` column and the `reason` label of
/// `outbox_messages_suppressed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuppressionReason {
    /// The receiving server said the mailbox does not exist.
    HardBounce,
    /// The recipient marked a message as spam.
    Complaint,
    /// An operator added it.
    Manual,
    /// The recipient asked not to be mailed.
    Unsubscribe,
}

impl SuppressionReason {
    pub const ALL: [SuppressionReason; 4] = [
        SuppressionReason::HardBounce,
        SuppressionReason::Complaint,
        SuppressionReason::Manual,
        SuppressionReason::Unsubscribe,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SuppressionReason::HardBounce => "hard_bounce",
            SuppressionReason::Complaint => "complaint",
            SuppressionReason::Manual => "manual",
            SuppressionReason::Unsubscribe => "unsubscribe",
        }
    }
}

impl std::str::FromStr for SuppressionReason {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<_> = Self::ALL.iter().map(|r| r.as_str()).collect();
                format!("unknown reason {text:?}: one of {}", known.join(", "))
            })
    }
}

impl std::fmt::Display for SuppressionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which kinds an entry of the list stops: every kind, or one lane's. A hard bounce is
/// `all`; an unsubscribe or a complaint about a message, that message's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    All,
    Lane(Lane),
}

impl Scope {
    pub const ALL: [Scope; 3] = [
        Scope::All,
        Scope::Lane(Lane::Bulk),
        Scope::Lane(Lane::Transactional),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Lane(lane) => lane.as_str(),
        }
    }

    /// Whether it stops mail of `lane`.
    pub fn covers(self, lane: Lane) -> bool {
        self == Scope::All || self == Scope::Lane(lane)
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| format!("unknown scope {text:?}: one of all, bulk, transactional"))
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry of the list as the dispatcher weighs it against a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listing {
    pub reason: SuppressionReason,
    pub scope: Scope,
}

impl Listing {
    /// Whether it stops a message of `lane`: an essential kind (a password reset) still
    /// reaches an address that unsubscribed or complained, never one that bounced or that
    /// an operator listed.
    pub fn stops(self, lane: Lane, essential: bool) -> bool {
        let waived = essential
            && matches!(
                self.reason,
                SuppressionReason::Unsubscribe | SuppressionReason::Complaint
            );
        self.scope.covers(lane) && !waived
    }
}

/// Where a suppression came from: the `source` column, and the `source` label of the
/// bounce and complaint counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeedbackSource {
    /// A reply to our own SMTP transaction.
    Smtp,
    /// Amazon SES, through an SNS notification.
    Ses,
    Postmark,
    /// The Standard Webhooks form, signed with HMAC-SHA256.
    Webhook,
    /// An operator, through the API, the page or the CLI.
    Operator,
    /// The recipient, through a one-click unsubscribe link (RFC 8058).
    OneClick,
    /// A delivery status notification (RFC 3464) that came back to the email's return path,
    /// on outboxd's own SMTP listener (`OUTBOXD_BOUNCE_LISTEN`).
    Dsn,
}

impl FeedbackSource {
    pub const ALL: [FeedbackSource; 7] = [
        FeedbackSource::Smtp,
        FeedbackSource::Ses,
        FeedbackSource::Postmark,
        FeedbackSource::Webhook,
        FeedbackSource::Operator,
        FeedbackSource::OneClick,
        FeedbackSource::Dsn,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FeedbackSource::Smtp => "smtp",
            FeedbackSource::Ses => "ses",
            FeedbackSource::Postmark => "postmark",
            FeedbackSource::Webhook => "webhook",
            FeedbackSource::Operator => "operator",
            FeedbackSource::OneClick => "one-click",
            FeedbackSource::Dsn => "dsn",
        }
    }

    /// Whether what it reports stands for any address it names, or only for a recipient of
    /// the message it names. A DSN is signed by nobody but its return path, which every
    /// recipient of the email can read: it may report only that message's own recipients.
    pub fn speaks_only_for_recipients(self) -> bool {
        matches!(self, FeedbackSource::Dsn)
    }
}

/// What a bounce notification says of the address: the `type` label of
/// `outbox_bounces_received_total`. Only a hard bounce suppresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BounceType {
    Hard,
    Soft,
    Undetermined,
}

impl BounceType {
    pub const ALL: [BounceType; 3] = [BounceType::Hard, BounceType::Soft, BounceType::Undetermined];

    pub fn as_str(self) -> &'static str {
        match self {
            BounceType::Hard => "hard",
            BounceType::Soft => "soft",
            BounceType::Undetermined => "undetermined",
        }
    }
}

/// An address to add to the list.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSuppression {
    pub address: Address,
    pub reason: SuppressionReason,
    pub source: FeedbackSource,
    /// The kinds it stops.
    pub scope: Scope,
    /// What the server or the provider said, or the operator's note.
    pub detail: Option<String>,
    /// The outbox row that met it, when known.
    pub message_id: Option<i64>,
    /// Suppressed until then; `None` for good.
    pub until: Option<DateTime<Utc>>,
}

impl NewSuppression {
    /// The entry a report about a message of `lane` makes: an unsubscribe or a complaint
    /// stops that lane only; a hard bounce, and an operator's entry, stay as they are.
    #[must_use]
    pub fn about(mut self, lane: Lane) -> Self {
        if matches!(
            self.reason,
            SuppressionReason::Unsubscribe | SuppressionReason::Complaint
        ) && self.source != FeedbackSource::Operator
        {
            self.scope = Scope::Lane(lane);
        }
        self
    }
}

/// The marks a row's `feedback` holds, as [`Feedback::mark`] gives them and the store's
/// statements write and read them (`mark.*` in their files, checked by the store's word
/// test).
pub(crate) mod marks {
    pub(crate) const HARD_BOUNCE: &str = "hard_bounce";
    pub(crate) const SOFT_BOUNCE: &str = "soft_bounce";
    pub(crate) const COMPLAINT: &str = "complaint";
}

/// What a provider reported of one message's recipient.
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    /// The recipient reported: the row is marked only if it was one of the row's
    /// recipients.
    pub address: Address,
    /// One of [`marks`]: the message row's `feedback`; `None` for an unsubscribe.
    pub mark: Option<&'static str>,
    /// The outbox row it names, if it names one.
    pub message_id: Option<i64>,
    /// What the provider said (a diagnostic code, a feedback type), for the row's timeline.
    pub detail: Option<String>,
    /// Added to the list (hard bounces and complaints), or nothing (soft bounces).
    pub suppression: Option<NewSuppression>,
}

impl Feedback {
    /// The event it is in its message's timeline: its mark, or an unsubscribe.
    pub fn event(&self) -> &'static str {
        self.mark.unwrap_or(SuppressionReason::Unsubscribe.as_str())
    }
}

/// The longest detail kept with a suppression entry or an event of a message's timeline
/// (the columns' CHECKs): an operator's note, a provider's diagnostic, a server's reply.
/// A longer operator's note is refused; a provider's or a server's is cut to it.
pub(crate) const MAX_DETAIL_CHARS: usize = 1000;

/// What an operator asks to add: through the API, the page or the command line.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddRequest {
    pub address: String,
    /// `manual` unless said otherwise.
    pub reason: Option<SuppressionReason>,
    /// `all` unless said otherwise.
    pub scope: Option<Scope>,
    pub detail: Option<String>,
    pub until: Option<DateTime<Utc>>,
}

impl AddRequest {
    /// The entry to add, or why the request is refused.
    pub fn entry(self, now: DateTime<Utc>) -> Result<NewSuppression, String> {
        if let Some(detail) = &self.detail
            && (detail.chars().count() > MAX_DETAIL_CHARS || detail.contains('\0'))
        {
            return Err(format!(
                "detail must be at most {MAX_DETAIL_CHARS} characters of text"
            ));
        }
        if self.until.is_some_and(|until| until <= now) {
            return Err("until must be in the future".to_owned());
        }
        let reason = self.reason.unwrap_or(SuppressionReason::Manual);
        let scope = self.scope.unwrap_or(Scope::All);
        if reason == SuppressionReason::HardBounce && scope != Scope::All {
            return Err("a hard bounce stops every kind: its scope is all".to_owned());
        }
        Ok(NewSuppression {
            address: Address::parse(&self.address)?,
            reason,
            scope,
            source: FeedbackSource::Operator,
            detail: self.detail,
            message_id: None,
            until: self.until,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(reason: SuppressionReason, scope: Scope) -> Listing {
        Listing { reason, scope }
    }

    #[test]
    fn an_entry_stops_its_scopes_lane_and_an_essential_kind_passes_only_wishes() {
        use SuppressionReason::{Complaint, HardBounce, Manual, Unsubscribe};
        let bulk = Scope::Lane(Lane::Bulk);
        // (entry, the message's lane, essential) -> stopped
        let cases = [
            (listing(Complaint, bulk), Lane::Bulk, false, true),
            (listing(Complaint, bulk), Lane::Transactional, false, false),
            (listing(Complaint, Scope::All), Lane::Transactional, false, true),
            (listing(Unsubscribe, Scope::All), Lane::Transactional, true, false),
            (listing(Complaint, bulk), Lane::Bulk, true, false),
            (listing(HardBounce, Scope::All), Lane::Transactional, true, true),
            (listing(Manual, Scope::All), Lane::Transactional, true, true),
        ];
        for (entry, lane, essential, stopped) in cases {
            assert_eq!(
                entry.stops(lane, essential),
                stopped,
                "{entry:?} on {lane:?}, essential {essential}"
            );
        }
    }

    #[test]
    fn a_report_about_a_message_narrows_only_wishes_to_its_lane() {
        let entry = |reason, source| NewSuppression {
            address: Address::parse("a@example.com").unwrap(),
            reason,
            source,
            scope: Scope::All,
            detail: None,
            message_id: None,
            until: None,
        };
        let about = |reason, source| entry(reason, source).about(Lane::Bulk).scope;
        let webhook = FeedbackSource::Webhook;
        assert_eq!(about(SuppressionReason::Complaint, webhook), Scope::Lane(Lane::Bulk));
        assert_eq!(about(SuppressionReason::Unsubscribe, webhook), Scope::Lane(Lane::Bulk));
        assert_eq!(about(SuppressionReason::HardBounce, webhook), Scope::All);
        assert_eq!(
            about(SuppressionReason::Complaint, FeedbackSource::Operator),
            Scope::All
        );
        for scope in Scope::ALL {
            assert_eq!(scope.as_str().parse::<Scope>(), Ok(scope));
        }
        assert!("news".parse::<Scope>().is_err());
    }

    #[test]
    fn reasons_round_trip_through_their_names() {
        for reason in SuppressionReason::ALL {
            assert_eq!(reason.as_str().parse::<SuppressionReason>(), Ok(reason));
        }
        assert!("bounce".parse::<SuppressionReason>().is_err());
    }
}
