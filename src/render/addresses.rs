//! The address headers and the envelope of an email, from a payload's `to`, `cc`, `bcc`
//! and `reply_to`: linear in the number of recipients, each recipient once in the
//! envelope, and header lines folded within RFC 5322's limits.

use std::collections::HashSet;

use lettre::address::{Address, Envelope};
use lettre::message::header::{self, Header, HeaderName, HeaderValue, Headers};
use lettre::message::{Mailbox, Mailboxes, MessageBuilder};
use serde_json::Value;

use super::RenderError;

/// Where a header line is folded: RFC 5322's recommended 78 characters, less the CRLF.
const FOLD_AT: usize = 76;

/// Adds `To`, `Cc` and `Reply-To` (each set once: lettre's `to()` re-parses the header it
/// adds to, which is quadratic in the recipients) and the envelope, whose sender is the
/// message's own return path when there is one, else `From`'s address. `Bcc` goes only
/// into the envelope, as lettre would do anyway.
pub(super) fn add(
    builder: MessageBuilder,
    payload: &Value,
    from: &Mailbox,
    default_reply_to: Option<&Mailbox>,
    return_path: Option<Address>,
) -> Result<MessageBuilder, RenderError> {
    let (to, cc, bcc) = (
        recipients(payload, "to")?,
        recipients(payload, "cc")?,
        recipients(payload, "bcc")?,
    );
    if to.is_empty() {
        return Err(RenderError::Address {
            field: "to",
            reason: "no recipient".to_owned(),
        });
    }
    // The envelope from the addresses in hand: left to lettre, it would format the
    // headers and parse them back (a tenth of the rendering time in the benchmark).
    let mut seen = HashSet::new();
    let forward_path: Vec<Address> = to
        .iter()
        .chain(&cc)
        .chain(&bcc)
        .map(|mailbox| mailbox.email.clone())
        // Domains are case-insensitive; local parts may not be, so they are kept as written.
        .filter(|address| seen.insert((address.user().to_owned(), address.domain().to_lowercase())))
        .collect();
    let sender = return_path.unwrap_or_else(|| from.email.clone());
    let envelope = Envelope::new(Some(sender), forward_path)
        .map_err(|e| RenderError::Build(e.to_string()))?;
    let mut builder = builder.header(FoldedTo(to)).envelope(envelope);
    if !cc.is_empty() {
        builder = builder.header(FoldedCc(cc));
    }
    let mut reply_to = recipients(payload, "reply_to")?;
    if reply_to.is_empty() {
        reply_to.extend(default_reply_to.cloned());
    }
    if !reply_to.is_empty() {
        builder = builder.header(FoldedReplyTo(reply_to));
    }
    Ok(builder)
}

/// The envelope addresses of a payload (`to`, `cc`, `bcc`), as the suppression list keeps
/// them (see [`crate::suppression`]); a field that does not parse is left out, since
/// rendering refuses it anyway.
pub fn envelope_keys(payload: &Value) -> Vec<String> {
    ["to", "cc", "bcc"]
        .iter()
        .filter_map(|field| recipients(payload, field).ok())
        .flatten()
        .map(|mailbox| suppression_key(&mailbox.email))
        .collect()
}

/// An envelope address as the suppression list keeps it.
pub fn suppression_key(address: &Address) -> String {
    crate::suppression::Address::of(address).into()
}

/// Refuses a payload with more than `max` addresses in `to`, `cc`, `bcc` and `reply_to`
/// together, before anything is parsed or rendered.
pub(super) fn check_count(payload: &Value, max: usize) -> Result<(), RenderError> {
    let count: usize = ["to", "cc", "bcc", "reply_to"]
        .iter()
        .map(|field| match payload.get(*field) {
            Some(Value::Array(items)) => items.len(),
            Some(Value::String(_)) => 1,
            _ => 0,
        })
        .sum();
    if count > max {
        return Err(RenderError::TooManyRecipients { count, max });
    }
    Ok(())
}

/// The first `to` address, when there is one.
pub(super) fn first_to(payload: &Value) -> Result<Option<Mailbox>, RenderError> {
    Ok(recipients(payload, "to")?.into_iter().next())
}

/// Reads an address field that may be absent, one string, or a list of strings.
fn recipients(payload: &Value, field: &'static str) -> Result<Vec<Mailbox>, RenderError> {
    let invalid = |reason: String| RenderError::Address { field, reason };
    let values: Vec<&str> = match payload.get(field) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| invalid("list items must be strings".to_owned()))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(invalid(
                "must be an address or a list of addresses".to_owned(),
            ));
        }
    };
    // The error names the item, never the address: errors are logged.
    let many = values.len() > 1;
    values
        .into_iter()
        .enumerate()
        .map(|(i, value)| {
            if value.chars().any(char::is_control) {
                return Err(RenderError::HeaderInjection(field));
            }
            value.parse::<Mailbox>().map_err(|e| {
                invalid(if many {
                    format!("item {i}: {e}")
                } else {
                    e.to_string()
                })
            })
        })
        .collect()
}

/// A mailbox list, folded between mailboxes so that no line passes [`FOLD_AT`] (one long
/// address may still make a longer line: lettre encodes within a mailbox). lettre's own
/// `To` and `Cc` write the whole list on one line, which servers refuse past 998 octets.
fn folded(name: HeaderName, mailboxes: &[Mailbox]) -> HeaderValue {
    let mut encoded = String::new();
    let mut line_len = AsRef::<str>::as_ref(&name).len() + ": ".len();
    for (i, mailbox) in mailboxes.iter().enumerate() {
        let piece = encoded_mailbox(mailbox);
        if i > 0 {
            encoded.push(',');
            line_len += 1;
            if line_len + 1 + piece.len() > FOLD_AT {
                encoded.push_str("\r\n");
                line_len = 0;
            }
            encoded.push(' ');
            line_len += 1;
        }
        encoded.push_str(&piece);
        line_len += piece.len();
    }
    let raw = Mailboxes::from_iter(mailboxes.iter().cloned()).to_string();
    HeaderValue::dangerous_new_pre_encoded(name, raw, encoded)
}

/// An address header that folds its lines: see [`folded`].
macro_rules! folded_header {
    ($type:ident, $name:literal) => {
        #[doc = concat!("`", $name, "`, folded between mailboxes.")]
        #[derive(Debug, Clone)]
        struct $type(Vec<Mailbox>);

        impl Header for $type {
            fn name() -> HeaderName {
                HeaderName::new_from_ascii_str($name)
            }

            fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
                Ok(Self(s.parse::<Mailboxes>()?.into_iter().collect()))
            }

            fn display(&self) -> HeaderValue {
                folded(Self::name(), &self.0)
            }
        }
    };
}

folded_header!(FoldedTo, "To");
folded_header!(FoldedCc, "Cc");
folded_header!(FoldedReplyTo, "Reply-To");

/// One mailbox as lettre encodes it in a header (RFC 2047 for a display name that needs it).
fn encoded_mailbox(mailbox: &Mailbox) -> String {
    let mut headers = Headers::new();
    headers.set(header::To::from(Mailboxes::from(mailbox.clone())));
    headers
        .to_string()
        .strip_prefix("To: ")
        .unwrap_or_default()
        .trim_end_matches("\r\n")
        .to_owned()
}
