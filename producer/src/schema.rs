//! Where outboxd's objects live: in the schemas of the role's `search_path` (`public`, by
//! default), or in a schema of their own (`OUTBOXD_SCHEMA`), beside an application's.
//!
//! With a schema, every statement names it. A session's `search_path` would be simpler,
//! but it does not survive a transaction pooler: PgBouncer refuses a startup `options`
//! it does not know, and a session's `SET` stays on whichever server session ran it.
//! Each statement marks where the schema goes (`{{schema}}outbox_messages`), and
//! [`crate::template`] renders it; an application that queries outboxd's tables itself
//! can do the same.

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

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
