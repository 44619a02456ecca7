//! A row's `Message-ID`, written and read back by one definition: `<outbox-ID.TAG@DOMAIN>`.
//!
//! Receivers drop an email whose Message-ID they have seen (the book tells them to), so it
//! must not repeat across databases: the row's id alone did (`<outbox-1@...>` from the demo
//! and from an application, from staging and production, from a database recreated after
//! `dropdb`). The tag is the installation's, random, made once by the migration that
//! created `outbox_installation`. A notification naming another installation's message (a
//! provider account that staging and production share) names no row of this one.

use std::fmt;

/// The most characters an installation's tag has.
const MAX_TAG_CHARS: usize = 16;

/// An installation's tag: 1 to 16 lower-case ASCII letters and digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallationTag(String);

impl InstallationTag {
    pub fn parse(text: &str) -> Result<Self, String> {
        let valid = (1..=MAX_TAG_CHARS).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!(
                "{text:?} is not an installation tag (1 to {MAX_TAG_CHARS} of a-z and 0-9)"
            ))
        }
    }

    /// The tag a preview's Message-ID shows: `outboxd preview` reads no database.
    pub fn preview() -> Self {
        Self("preview".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstallationTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How this installation writes a row's Message-ID, and which Message-IDs are its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageIds {
    tag: InstallationTag,
    domain: String,
}

impl MessageIds {
    pub fn new(tag: InstallationTag, domain: String) -> Self {
        Self { tag, domain }
    }

    /// This installation's tag.
    pub fn tag(&self) -> &InstallationTag {
        &self.tag
    }

    /// The row's Message-ID: the same on every attempt, so a receiver can drop the
    /// duplicate that a redelivery after a crash produces.
    pub fn of(&self, id: i64) -> String {
        format!("<outbox-{id}.{}@{}>", self.tag, self.domain)
    }

    /// The form of this installation's Message-IDs, for a log line:
    /// `<outbox-ID.TAG@DOMAIN>` with the tag and domain filled in.
    pub fn form(&self) -> String {
        format!("<outbox-ID.{}@{}>", self.tag, self.domain)
    }

    /// What a Message-ID says of this installation's rows: [`Named::Row`] for one of its
    /// own (or of the form before tags, `<outbox-42@domain>`), [`Named::Elsewhere`] for
    /// another installation's, [`Named::Nothing`] for one outboxd did not write.
    pub fn read(&self, message_id: &str) -> Named {
        let inner = message_id
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>');
        let Some((local, _domain)) = inner
            .strip_prefix("outbox-")
            .and_then(|rest| rest.split_once('@'))
        else {
            return Named::Nothing;
        };
        let (id, tag) = match local.split_once('.') {
            Some((id, tag)) => (id, Some(tag)),
            None => (local, None),
        };
        match (id.parse::<i64>(), tag) {
            (Ok(id), None) => Named::Row(id),
            (Ok(id), Some(tag)) if tag == self.tag.as_str() => Named::Row(id),
            (Ok(_), Some(_)) => Named::Elsewhere,
            (Err(_), _) => Named::Nothing,
        }
    }
}

/// What a Message-ID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Row(i64),
    /// A message of another installation: no row here.
    Elsewhere,
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(tag: &str) -> MessageIds {
        MessageIds::new(
            InstallationTag::parse(tag).unwrap(),
            "mail.example".to_owned(),
        )
    }

    #[test]
    fn two_installations_never_write_the_same_message_id_and_each_reads_back_its_own() {
        let (ours, theirs) = (ids("k3f9q2"), ids("a0b1c2"));
        assert_eq!(ours.of(1), "<outbox-1.k3f9q2@mail.example>");
        assert_eq!(ours.form(), "<outbox-ID.k3f9q2@mail.example>");
        assert_ne!(ours.of(1), theirs.of(1));
        assert_eq!(ours.read(&ours.of(42)), Named::Row(42));
        assert_eq!(ours.read(&theirs.of(42)), Named::Elsewhere);
        // Emails sent before tags keep naming their rows.
        assert_eq!(ours.read("<outbox-7@mail.example>"), Named::Row(7));
        for other in [
            "<0100018f@email.amazonses.com>",
            "<outbox-x@a>",
            "",
            "outbox-1",
        ] {
            assert_eq!(ours.read(other), Named::Nothing, "{other}");
        }
    }

    #[test]
    fn a_tag_is_a_few_lower_case_letters_and_digits() {
        for bad in ["", "K3F9", "a.b", "a@b", &"a".repeat(17)] {
            assert!(InstallationTag::parse(bad).is_err(), "{bad:?}");
        }
    }
}
