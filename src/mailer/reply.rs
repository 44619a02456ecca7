//! A server's negative reply as the server sent it: its code, its enhanced status (RFC 3463)
//! and its words, read apart so that a rule about the reply never reads a wrapper's text or
//! an address the server echoed.
//!
//! Two rules read a reply. Whether the relay is throttling us: a reply that says so by its
//! code and status, never by the words around a recipient's address (`450 4.1.2
//! <rate@...>: Domain not found` once cut a replica's pace to 1/s). And whether a recipient
//! does not exist, which suppresses it: by the enhanced status, and by words only where a
//! server gives none.

use std::fmt;

/// An enhanced mail system status code (RFC 3463): `class.subject.detail`, as `5.1.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub class: u8,
    pub subject: u16,
    pub detail: u16,
}

impl Status {
    /// A word of the form `c.s.d` (RFC 3463: class 2, 4 or 5; subject and detail of one to
    /// three digits).
    pub fn parse(word: &str) -> Option<Self> {
        let mut parts = word.split('.');
        let (class, subject, detail) = (parts.next()?, parts.next()?, parts.next()?);
        let number =
            |part: &str| (1..=3).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit());
        if parts.next().is_some() || !matches!(class, "2" | "4" | "5") {
            return None;
        }
        if !number(subject) || !number(detail) {
            return None;
        }
        Some(Self {
            class: class.parse().ok()?,
            subject: subject.parse().ok()?,
            detail: detail.parse().ok()?,
        })
    }

    /// The status with its class left out: `(1, 1)` for `5.1.1` and `4.1.1` alike.
    fn subject_detail(self) -> (u16, u16) {
        (self.subject, self.detail)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.class, self.subject, self.detail)
    }
}

/// A refusal: what the server replied, or, when no reply was had (a timeout during the
/// transaction, an envelope the server cannot take), outboxd's own reason with no code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The reply code, `550`; `None` for outboxd's own reason.
    pub code: Option<u16>,
    /// The enhanced status right after the code, when the server gave one in the reply's
    /// class (RFC 2034: `550 5.1.1`, not `550 4.1.1`).
    pub status: Option<Status>,
    /// The server's words after the code and status (the lines joined), or outboxd's reason.
    pub text: String,
}

impl Reply {
    /// outboxd's own reason for a refusal the server did not reply with.
    pub fn own(reason: impl Into<String>) -> Self {
        Self {
            code: None,
            status: None,
            text: reason.into(),
        }
    }

    /// A reply as read off the wire: its code, and its lines joined after the code.
    pub fn new(code: u16, lines: &str) -> Self {
        let lines = lines.trim();
        let (first, rest) = lines.split_once(char::is_whitespace).unwrap_or((lines, ""));
        let status = Status::parse(first).filter(|status| u16::from(status.class) == code / 100);
        Self {
            code: Some(code),
            status,
            text: if status.is_some() { rest.trim() } else { lines }.to_owned(),
        }
    }

    /// The reply lettre read: its code, and its lines as lettre keeps them in the error's
    /// source (never the error's own text, which wraps them in its words).
    pub(super) fn from_lettre(error: &lettre::transport::smtp::Error) -> Option<Self> {
        let code = error.status()?;
        let code: u16 = code.to_string().parse().ok()?;
        let lines = std::error::Error::source(error)
            .map(ToString::to_string)
            .unwrap_or_default();
        Some(Self::new(code, &lines))
    }

    /// The reply's words, lower-cased, without the addresses it echoes (`<rate@x.test>`,
    /// `user@x.test`): a rule reads what the server says, never what a producer named.
    fn words(&self) -> Vec<String> {
        let mut kept = String::with_capacity(self.text.len());
        let mut in_brackets = false;
        for c in self.text.chars() {
            match c {
                '<' => in_brackets = true,
                '>' if in_brackets => {
                    in_brackets = false;
                    kept.push(' ');
                }
                _ if !in_brackets => kept.push(c.to_ascii_lowercase()),
                _ => {}
            }
        }
        kept.split_whitespace()
            .filter(|word| !word.contains('@'))
            .map(|word| word.trim_matches(|c: char| !c.is_ascii_alphanumeric()))
            .filter(|word| !word.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn says(&self, phrases: &[&str]) -> bool {
        let text = format!(" {} ", self.words().join(" "));
        phrases
            .iter()
            .any(|phrase| text.contains(&format!(" {phrase} ")))
    }

    /// Whether the relay said it is throttling us (so the pace is cut, and the message is
    /// released without an attempt): a 4xx reply whose status is `4.7.x` (policy: Gmail's
    /// `421 4.7.0`, Microsoft's `451 4.7.500`, Yahoo's `421 4.7.0 [TSS04]`, Postfix's `450
    /// 4.7.1 ... too much mail`) with code `421`, `450`, `451`, `452` or `454`, unless it
    /// speaks of greylisting or TLS (Microsoft's `421 4.7.66`) or rejects one recipient
    /// (Postfix's `450 4.7.1 <x>: Recipient address rejected`); or, from a server that
    /// gives no status, a 4xx reply that speaks of its rate (Amazon SES's `454 Throttling
    /// failure`, Outlook.com's `421 RP-001 ... limits for how many messages`, Exim's `421
    /// Too many concurrent SMTP connections`). A status of the
    /// recipient's own (`4.1.x` address, `4.2.x` mailbox: Gmail's `450 4.2.1` for a
    /// recipient receiving too fast) or any other subject is the message's, never the
    /// pace's.
    pub fn is_throttling(&self) -> bool {
        let Some(code) = self.code.filter(|code| (400..500).contains(code)) else {
            return false;
        };
        let words = self.words();
        let greylisting = words.iter().any(|word| {
            ["greylist", "graylist"]
                .iter()
                .any(|stem| word.starts_with(stem))
        });
        if greylisting || words.iter().any(|word| word == "tls") {
            return false;
        }
        match self.status {
            // A 4.7.x about one recipient (Postfix's check_recipient_access DEFER) is the
            // message's.
            Some(status) => {
                status.subject == 7
                    && matches!(code, 421 | 450 | 451 | 452 | 454)
                    && !self.says(&["recipient address rejected"])
            }
            None => {
                words.iter().any(|word| {
                    matches!(word.as_str(), "rate" | "ratelimit" | "ratelimited")
                        || word.starts_with("throttl")
                }) || self.says(&[
                    "too many connections",
                    "too many concurrent",
                    "too many messages",
                    "too much mail",
                    "how many messages",
                ])
            }
        }
    }

    /// Whether a permanent reply says the recipient's mailbox does not exist, which
    /// suppresses it: its status is `5.1.1` (bad mailbox: Gmail, Postfix, Microsoft's
    /// `RecipNotFound`), `5.1.10` (Microsoft 365's `RecipientNotFound`; RFC 7505's null
    /// MX), `5.1.2` (no such domain), `5.1.6` (mailbox moved, no forwarding address),
    /// `5.2.1` (mailbox disabled, unless it speaks of a rate: Gmail's `ReceivingRatePerm`)
    /// or Microsoft's directory-based edge blocking (`5.4.1 Recipient address rejected:
    /// Access denied`). Only from a server that gives no status are words read (Exim's
    /// *Unrouteable address*, cPanel's *No Such User Here*, Yahoo's *doesn't have a ...
    /// account*), and not when they speak of the sender (Exim's sender verification).
    pub fn says_mailbox_unknown(&self) -> bool {
        if !self.code.is_some_and(|code| (500..600).contains(&code)) {
            return false;
        }
        let words = self.words();
        match self.status.map(Status::subject_detail) {
            Some((1, 1 | 2 | 6 | 10)) => true,
            Some((2, 1)) => !words.iter().any(|word| word == "rate"),
            Some((4, 1)) => self.says(&["recipient address rejected access denied"]),
            Some(_) => false,
            None => {
                !words.iter().any(|word| word == "sender")
                    && (self.says(&[
                        "user unknown",
                        "unknown user",
                        "no such user",
                        "no such mailbox",
                        "mailbox does not exist",
                        "mailbox not found",
                        "address does not exist",
                        "unrouteable address",
                        "does not accept mail",
                        "account has been disabled",
                    ]) || (self.says(&["doesn't have a"])
                        && words.iter().any(|w| w == "account")))
            }
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(code) = self.code {
            write!(f, "{code} ")?;
        }
        if let Some(status) = self.status {
            write!(f, "{status} ")?;
        }
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests;
