//! Where outboxd's objects live: in the schemas of the role's `search_path` (`public`, by
//! default), or in a schema of their own (`OUTBOXD_SCHEMA`), beside an application's.
//!
//! With a schema, every statement names it. A session's `search_path` would be simpler,
//! but it does not survive a transaction pooler: PgBouncer refuses a startup `options`
//! it does not know, and a session's `SET` stays on whichever server session ran it.
//! [`qualify`] puts a statement's text in the schema: a table or function of outboxd's,
//! written bare, is prefixed with it, and so is a name given to `to_regclass` as a
//! literal. Literals, quoted identifiers, comments and dollar-quoted bodies are otherwise
//! left as they are. outboxd sends each of its statements through it; an application that
//! queries outboxd's tables itself can do the same.

/// outboxd's tables and functions that statements name: what a schema qualifies. Indexes,
/// constraints and triggers are named only where PostgreSQL takes them unqualified.
pub const OBJECTS: &[&str] = &[
    "outbox_messages",
    "outbox_suppressions",
    "outbox_send_rate",
    "outbox_schema_migrations",
    "outbox_webhook_receipts",
    "outbox_admin_audit",
    "outbox_kind_pauses",
    "outbox_message_events",
    "outbox_installation",
    "outbox_replica_circuits",
    "outbox_recipient_keys",
    "outbox_single_recipient_key",
    "outbox_on_the_calendar",
    "outbox_messages_set_next_attempt",
    "outbox_messages_notify",
];

/// A schema's name, as `OUTBOXD_SCHEMA` takes it: an unquoted PostgreSQL identifier in
/// lower case, so that it means the same in a statement, in `search_path` and in psql.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema(String);

/// Why a name cannot be outboxd's schema.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidSchema {
    #[error(
        "{0:?} is not a schema name outboxd takes: use lower-case letters, digits and underscores, starting with a letter or an underscore"
    )]
    Characters(String),
    #[error("{0:?} is longer than PostgreSQL's 63 bytes for a name")]
    TooLong(String),
    #[error("{0:?} starts with pg_, which PostgreSQL keeps for its own schemas")]
    Reserved(String),
}

impl std::str::FromStr for Schema {
    type Err = InvalidSchema;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let mut chars = name.chars();
        let starts_well = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        if !starts_well || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(InvalidSchema::Characters(name.to_owned()));
        }
        if name.len() > 63 {
            return Err(InvalidSchema::TooLong(name.to_owned()));
        }
        if name.starts_with("pg_") {
            return Err(InvalidSchema::Reserved(name.to_owned()));
        }
        Ok(Self(name.to_owned()))
    }
}

impl Schema {
    /// The name as written in a statement: quoted, so that no keyword can be mistaken.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The bare name, as in `search_path`.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `sql` with each bare name of [`OBJECTS`] prefixed with `schema`. It reads PostgreSQL's
/// standard strings only: an escape string (`E'...\'...'`) is not understood, and a name
/// quoted (`"outbox_messages"`), upper-cased in `TO_REGCLASS(`, or given as a literal
/// anywhere else (`'outbox_messages'::regclass`) is left as it is.
pub fn qualify(sql: &str, schema: &Schema) -> String {
    let prefix = schema.quoted();
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        let token = token_length(rest);
        let (piece, after) = rest.split_at(token);
        if (c.is_ascii_alphabetic() || c == '_') && names_object(piece) && !out.ends_with('.') {
            out.push_str(&prefix);
            out.push('.');
        } else if c == '\'' && out.trim_end().ends_with("to_regclass(") {
            let name = &piece[1..piece.len() - 1];
            if names_object(name) {
                out.push_str(&format!("'{prefix}.{name}'"));
                rest = after;
                continue;
            }
        }
        out.push_str(piece);
        rest = after;
    }
    out
}

fn names_object(word: &str) -> bool {
    OBJECTS.iter().any(|o| o.eq_ignore_ascii_case(word))
}

/// The length of the token `sql` starts with: a word, a literal, a quoted identifier, a
/// comment, a dollar-quoted body, or one character. An unterminated one runs to the end.
fn token_length(sql: &str) -> usize {
    let bytes = sql.as_bytes();
    let until = |from: usize, end: &str| {
        sql[from..]
            .find(end)
            .map_or(sql.len(), |at| from + at + end.len())
    };
    match bytes[0] {
        b'\'' | b'"' => {
            let quote = bytes[0];
            let mut at = 1;
            while at < bytes.len() {
                if bytes[at] == quote {
                    // A doubled quote is one quote inside.
                    if bytes.get(at + 1) == Some(&quote) {
                        at += 2;
                        continue;
                    }
                    return at + 1;
                }
                at += 1;
            }
            bytes.len()
        }
        b'-' if bytes.get(1) == Some(&b'-') => until(2, "\n"),
        b'/' if bytes.get(1) == Some(&b'*') => until(2, "*/"),
        b'$' => match dollar_tag(sql) {
            Some(tag) => until(tag.len(), tag),
            None => 1,
        },
        c if c.is_ascii_alphanumeric() || c == b'_' => bytes
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$'))
            .unwrap_or(bytes.len()),
        _ => sql.chars().next().map_or(1, char::len_utf8),
    }
}

/// The `$tag$` a dollar-quoted body starts with; `$1`, a parameter, is none.
fn dollar_tag(sql: &str) -> Option<&str> {
    let end = sql[1..].find('$')? + 1;
    let tag = &sql[1..end];
    let is_tag = tag
        .chars()
        .next()
        .is_none_or(|c| c.is_ascii_alphabetic() || c == '_')
        && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    is_tag.then(|| &sql[..=end])
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
