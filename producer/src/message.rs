//! A message as a producer hands it over, checked as it is built: what the table accepts.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::secret::{MAX_SECRET_FIELDS, MAX_SECRET_NAME_CHARS, MAX_SECRET_PATH_NAMES, SecretField};

/// The longest kind name the table accepts.
pub const MAX_KIND_CHARS: usize = 100;

/// A message a producer wants sent, committed together with its business change. It cannot
/// hold what the table would refuse: [`NewMessage::new`] and each `with_` method check what
/// they are given and say what is wrong.
///
/// ```
/// # use outboxd_producer::{NewMessage, InvalidMessage};
/// let reset = NewMessage::new("password_reset", serde_json::json!({"to": "ada@example.com"}))?
///     .with_priority(10)?
///     .with_idempotency_key("reset-42")?
///     .with_tags(["tenant:42", "flow:reset"])?;
/// assert_eq!(reset.priority(), 10);
/// assert_eq!(reset.tags(), ["tenant:42", "flow:reset"]);
/// # Ok::<(), InvalidMessage>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    kind: Kind,
    payload: Value,
    not_before: Option<DateTime<Utc>>,
    priority: i16,
    expires_at: Option<DateTime<Utc>>,
    idempotency_key: Option<String>,
    traceparent: Option<String>,
    tags: Vec<String>,
    secret_fields: Vec<SecretField>,
}

/// The highest priority the table accepts.
pub const MAX_PRIORITY: i16 = 10_000;
/// The longest idempotency key the table accepts, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 200;
/// The most tags a message may carry.
pub const MAX_TAGS: usize = 10;
/// The longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 64;
/// The longest `traceparent` the table accepts, in characters (a W3C one has 55).
pub const MAX_TRACEPARENT_CHARS: usize = 128;
/// The times the table accepts, in seconds since the epoch: years 1 to 9999, as its CHECK
/// constraints say (`migrations/*_times_on_the_calendar.sql`). Past them a time cannot be
/// read back (the driver's calendar ends in year 262142) nor, when infinite, subtracted.
pub const TIME_RANGE_SECS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

impl NewMessage {
    /// A message of `kind` (a template set's name) with `payload` (its variables and
    /// recipients: a JSON object), due as soon as its transaction commits, with no priority,
    /// deadline, idempotency key or trace context.
    pub fn new(kind: &str, payload: Value) -> Result<Self, InvalidMessage> {
        let kind = Kind::parse(kind)?;
        if !payload.is_object() {
            return Err(InvalidMessage::PayloadNotObject);
        }
        // PostgreSQL refuses a NUL in text and in jsonb, failing the caller's whole
        // transaction with an error that names neither the field nor the message.
        if let Some(path) = nul_in(&payload, "payload") {
            return Err(InvalidMessage::Nul(path));
        }
        Ok(Self {
            kind,
            payload,
            not_before: None,
            priority: 0,
            expires_at: None,
            idempotency_key: None,
            traceparent: None,
            tags: Vec::new(),
            secret_fields: Vec::new(),
        })
    }

    /// Not sent before `at`.
    pub fn with_not_before(mut self, at: DateTime<Utc>) -> Result<Self, InvalidMessage> {
        self.not_before = Some(on_the_calendar("not_before", at)?);
        Ok(self)
    }

    /// Never sent after `at`: the message ends as expired.
    pub fn with_expires_at(mut self, at: DateTime<Utc>) -> Result<Self, InvalidMessage> {
        self.expires_at = Some(on_the_calendar("expires_at", at)?);
        Ok(self)
    }

    /// Sent first among due messages: a point is worth a minute of waiting, 0 to
    /// [`MAX_PRIORITY`].
    pub fn with_priority(mut self, priority: i16) -> Result<Self, InvalidMessage> {
        if !(0..=MAX_PRIORITY).contains(&priority) {
            return Err(InvalidMessage::Priority(priority));
        }
        self.priority = priority;
        Ok(self)
    }

    /// The producer's key for this email: enqueueing the same key again returns the first
    /// message's id and inserts nothing. 1 to [`MAX_IDEMPOTENCY_KEY_CHARS`] characters.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Result<Self, InvalidMessage> {
        let key = without_nul("idempotency_key", key.into())?;
        if !(1..=MAX_IDEMPOTENCY_KEY_CHARS).contains(&key.chars().count()) {
            return Err(InvalidMessage::IdempotencyKey);
        }
        self.idempotency_key = Some(key);
        Ok(self)
    }

    /// The W3C trace context of the request that caused the email, so that outboxd's send
    /// span links to it. Without one: with the `opentelemetry` feature, the current span's.
    pub fn with_traceparent(
        mut self,
        traceparent: impl Into<String>,
    ) -> Result<Self, InvalidMessage> {
        let traceparent = without_nul("traceparent", traceparent.into())?;
        if traceparent.chars().count() > MAX_TRACEPARENT_CHARS {
            return Err(InvalidMessage::Traceparent);
        }
        self.traceparent = Some(traceparent);
        Ok(self)
    }

    /// Labels to find the message by (`campaign:spring`, `tenant:42`): at most
    /// [`MAX_TAGS`], each 1 to [`MAX_TAG_CHARS`] ASCII letters, digits, `_`, `-`, `.` or `:`.
    /// They replace any given before; a tag given twice is kept once. Operators filter
    /// messages and dead letters by them; they are never a metric label.
    pub fn with_tags<I, T>(mut self, tags: I) -> Result<Self, InvalidMessage>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let mut kept: Vec<String> = Vec::new();
        for tag in tags {
            let tag = Tag::parse(tag.into())?;
            if !kept.contains(&tag.0) {
                kept.push(tag.0);
            }
            if kept.len() > MAX_TAGS {
                return Err(InvalidMessage::TooManyTags(kept.len()));
            }
        }
        self.tags = kept;
        Ok(self)
    }

    /// Payload fields whose values outboxd never shows and scrubs from the stored payload
    /// once the message ends, besides those its kind declares (`secret_fields` in its
    /// `kind.toml`): at most [`MAX_SECRET_FIELDS`], each a [`SecretField`] path. They
    /// replace any given before; one given twice is kept once.
    pub fn with_secret_fields<I, T>(mut self, fields: I) -> Result<Self, InvalidMessage>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let mut kept: Vec<SecretField> = Vec::new();
        for field in fields {
            let field = SecretField::parse(field.into())?;
            if !kept.contains(&field) {
                kept.push(field);
            }
            if kept.len() > MAX_SECRET_FIELDS {
                return Err(InvalidMessage::TooManySecretFields(kept.len()));
            }
        }
        self.secret_fields = kept;
        Ok(self)
    }

    /// Which email to render.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The template's variables.
    pub fn payload(&self) -> &Value {
        &self.payload
    }

    pub fn not_before(&self) -> Option<DateTime<Utc>> {
        self.not_before
    }

    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires_at
    }

    pub fn priority(&self) -> i16 {
        self.priority
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// The payload fields this message keeps secret besides its kind's.
    pub fn secret_fields(&self) -> &[SecretField] {
        &self.secret_fields
    }
}

/// `time`, if the table can store it and read it back.
fn on_the_calendar(
    field: &'static str,
    time: DateTime<Utc>,
) -> Result<DateTime<Utc>, InvalidMessage> {
    if TIME_RANGE_SECS.contains(&time.timestamp()) {
        Ok(time)
    } else {
        Err(InvalidMessage::Time { field, time })
    }
}

/// `text`, if it holds no NUL, which PostgreSQL cannot store.
fn without_nul(field: &str, text: String) -> Result<String, InvalidMessage> {
    if text.contains('\0') {
        Err(InvalidMessage::Nul(field.to_owned()))
    } else {
        Ok(text)
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
    #[error(
        "a tag must be 1 to {MAX_TAG_CHARS} characters of A-Z, a-z, 0-9, '_', '-', '.' or ':', got {0:?}"
    )]
    Tag(String),
    #[error("a message carries at most {MAX_TAGS} tags, got {0} or more")]
    TooManyTags(usize),
    #[error(
        "a secret field must be a path of 1 to {MAX_SECRET_PATH_NAMES} names joined by '.', each 1 to {MAX_SECRET_NAME_CHARS} characters of A-Z, a-z, 0-9, '_' or '-', got {0:?}"
    )]
    SecretField(String),
    #[error("a message names at most {MAX_SECRET_FIELDS} secret fields, got {0} or more")]
    TooManySecretFields(usize),
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

/// A tag, checked: 1 to [`MAX_TAG_CHARS`] ASCII letters, digits, `_`, `-`, `.` or `:`, as
/// the table's CHECK takes it (`migrations/*_message_tags.sql`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(String);

impl Tag {
    /// `text` as a tag, or why it cannot be one.
    pub fn parse(text: impl Into<String>) -> Result<Self, InvalidMessage> {
        let text = text.into();
        let valid = (1..=MAX_TAG_CHARS).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if valid {
            Ok(Self(text))
        } else {
            Err(InvalidMessage::Tag(text))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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
