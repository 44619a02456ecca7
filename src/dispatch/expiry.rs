//! When a message is too late to send: its own `expires_at`, or its kind's default
//! (`OUTBOXD_EXPIRE_AFTER=account_verification=24h,workspace_invite=7d`), counted from
//! when it was created. A verification link two days old helps nobody.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::message::ClaimedMessage;

/// The default lifetime of each kind that has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireAfter(BTreeMap<String, Duration>);

impl ExpireAfter {
    /// Parses `kind=duration` pairs separated by commas, for the command line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut lifetimes = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (kind, lifetime) = pair.split_once('=').ok_or_else(|| {
                format!("{pair:?}: expected kind=duration, like account_verification=24h")
            })?;
            let kind = kind.trim();
            if kind.is_empty() || kind.len() > 100 {
                return Err(format!("{pair:?}: the kind must be 1 to 100 characters"));
            }
            let lifetime =
                humantime::parse_duration(lifetime.trim()).map_err(|e| format!("{pair:?}: {e}"))?;
            if lifetime.is_zero() || lifetime > Duration::from_secs(366 * 86_400) {
                return Err(format!(
                    "{pair:?}: the lifetime must be more than 0s and at most a year"
                ));
            }
            if lifetimes.insert(kind.to_owned(), lifetime).is_some() {
                return Err(format!("{kind:?} is given twice"));
            }
        }
        Ok(Self(lifetimes))
    }

    /// Lifetimes per kind.
    pub fn of(lifetimes: BTreeMap<String, Duration>) -> Self {
        Self(lifetimes)
    }

    /// The kind's default lifetime, if it has one.
    pub fn lifetime(&self, kind: &str) -> Option<Duration> {
        self.0.get(kind).copied()
    }

    /// The kinds that have one.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The time after which this message must not be sent, if any.
    pub fn deadline(&self, message: &ClaimedMessage) -> Option<DateTime<Utc>> {
        message.expires_at.or_else(|| {
            let lifetime = self.0.get(&message.kind)?;
            Some(message.created_at + chrono::Duration::from_std(*lifetime).ok()?)
        })
    }

    /// Whether the message is past its deadline at `now` (the database's clock).
    pub fn expired(&self, message: &ClaimedMessage, now: DateTime<Utc>) -> bool {
        self.deadline(message)
            .is_some_and(|deadline| deadline <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::ExpireAfter;

    #[test]
    fn lifetimes_are_read_per_kind() {
        let parsed = ExpireAfter::parse("account_verification=24h, workspace_invite=7d").unwrap();
        assert_eq!(parsed.0.len(), 2);
        assert_eq!(parsed.0["workspace_invite"].as_secs(), 7 * 86_400);
        assert_eq!(ExpireAfter::parse("").unwrap(), ExpireAfter::default());
    }

    #[test]
    fn a_lifetime_that_cannot_be_meant_is_refused() {
        for bad in [
            "account_verification",
            "=1h",
            "a=",
            "a=0s",
            "a=soon",
            "a=400d",
            "a=1h,a=2h",
        ] {
            assert!(ExpireAfter::parse(bad).is_err(), "{bad}");
        }
    }
}
