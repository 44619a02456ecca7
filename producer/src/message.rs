//! A message as a producer hands it over: what `enqueue` checks before it writes the row.

use chrono::{DateTime, Utc};
use serde_json::Value;

/// The longest kind name the table accepts.
pub const MAX_KIND_CHARS: usize = 100;

/// A message a producer wants sent, committed together with its business change. Made with
/// [`NewMessage::new`], then its public fields set; more may come, so it is not built as a
/// literal.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewMessage {
    /// Which email to render: the name of a template set, such as `account_verification`.
    pub kind: String,
    /// The template's variables; must be a JSON object.
    pub payload: Value,
    /// Do not send before this time; `None` means as soon as the transaction commits.
    pub not_before: Option<DateTime<Utc>>,
    /// Higher is sent first among due messages; a point is worth a minute of waiting.
    pub priority: i16,
    /// Never send after this time: the message ends as expired.
    pub expires_at: Option<DateTime<Utc>>,
    /// The producer's key for this email: enqueueing the same key again returns the first
    /// message's id and inserts nothing.
    pub idempotency_key: Option<String>,
    /// The W3C trace context of the request that caused the email, so that outboxd's send
    /// span links to it. `None`: with the `opentelemetry` feature, the current span's.
    pub traceparent: Option<String>,
}

/// The highest priority the table accepts.
pub const MAX_PRIORITY: i16 = 10_000;
/// The longest idempotency key the table accepts, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 200;
/// The longest `traceparent` the table accepts, in characters (a W3C one has 55).
pub const MAX_TRACEPARENT_CHARS: usize = 128;
/// The times the table accepts, in seconds since the epoch: years 1 to 9999, as its CHECK
/// constraints say (`migrations/*_times_on_the_calendar.sql`). Past them a time cannot be
/// read back (the driver's calendar ends in year 262142) nor, when infinite, subtracted.
pub const TIME_RANGE_SECS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

impl NewMessage {
    /// A message of `kind` (a template set's name) with `payload` (its variables and
    /// recipients), due as soon as its transaction commits, with no priority, deadline,
    /// idempotency key or trace context; set those fields after.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
            not_before: None,
            priority: 0,
            expires_at: None,
            idempotency_key: None,
            traceparent: None,
        }
    }

    /// Refuses what the table would refuse, with a message that says why.
    pub fn validate(&self) -> Result<(), InvalidMessage> {
        Kind::parse(&self.kind)?;
        if !self.payload.is_object() {
            return Err(InvalidMessage::PayloadNotObject);
        }
        // PostgreSQL refuses a NUL in text and in jsonb, failing the caller's whole
        // transaction with an error that names neither the field nor the message.
        if let Some(path) = nul_in(&self.payload, "payload") {
            return Err(InvalidMessage::Nul(path));
        }
        for (field, text) in [
            ("idempotency_key", &self.idempotency_key),
            ("traceparent", &self.traceparent),
        ] {
            if text.as_deref().is_some_and(|t| t.contains('\0')) {
                return Err(InvalidMessage::Nul(field.to_owned()));
            }
        }
        if !(0..=MAX_PRIORITY).contains(&self.priority) {
            return Err(InvalidMessage::Priority(self.priority));
        }
        if let Some(key) = &self.idempotency_key
            && !(1..=MAX_IDEMPOTENCY_KEY_CHARS).contains(&key.chars().count())
        {
            return Err(InvalidMessage::IdempotencyKey);
        }
        if self
            .traceparent
            .as_ref()
            .is_some_and(|t| t.chars().count() > MAX_TRACEPARENT_CHARS)
        {
            return Err(InvalidMessage::Traceparent);
        }
        for (field, time) in [
            ("not_before", self.not_before),
            ("expires_at", self.expires_at),
        ] {
            if let Some(time) = time.filter(|t| !TIME_RANGE_SECS.contains(&t.timestamp())) {
                return Err(InvalidMessage::Time { field, time });
            }
        }
        Ok(())
    }
}

/// Why a new message was refused before it reached the database.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidMessage {
    #[error(
        "kind must be 1 to {MAX_KIND_CHARS} characters of a-z, 0-9, '_', '-' or '.', got {0:?}"
    )]
    Kind(String),
    #[error("payload must be a JSON object")]
    PayloadNotObject,
    #[error("priority must be between 0 and {MAX_PRIORITY}, got {0}")]
    Priority(i16),
    #[error("an idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")]
    IdempotencyKey,
    #[error("a traceparent must be at most {MAX_TRACEPARENT_CHARS} characters")]
    Traceparent,
    #[error("{field} must be a time in the years 1 to 9999, got {time}")]
    Time {
        field: &'static str,
        time: DateTime<Utc>,
    },
    #[error("{0} holds a NUL character (\\u0000), which PostgreSQL cannot store")]
    Nul(String),
}

/// Where in `value` (at `path`) a string or a key first holds a NUL, as `payload.items[2]`.
fn nul_in(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::String(text) => text.contains('\0').then(|| path.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_in(item, &format!("{path}[{i}]"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let at = format!("{path}.{}", key.replace('\0', "\\u0000"));
            if key.contains('\0') {
                Some(at)
            } else {
                nul_in(item, &at)
            }
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) => None,
    }
}

/// A kind's name, checked: what `outbox_messages.kind` holds and a templates folder is
/// named. Kind names double as template directory names, so they are kept to a safe
/// alphabet: ASCII lower-case letters, digits, `_`, `-` and `.`, not first, at most
/// [`MAX_KIND_CHARS`] characters. Every kind outboxd reads from a person or a file is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(String);

impl Kind {
    /// `name` as a kind, or why it cannot be one.
    pub fn parse(name: &str) -> Result<Self, InvalidMessage> {
        let valid = !name.is_empty()
            && name.chars().count() <= MAX_KIND_CHARS
            && name.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.')
            })
            && !name.starts_with('.');
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidMessage::Kind(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Kind {
    type Err = InvalidMessage;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::parse(name)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Kind {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A set of kinds is looked up by a row's `kind` text.
impl std::borrow::Borrow<str> for Kind {
    fn borrow(&self) -> &str {
        &self.0
    }
}
