//! Secret payload fields: a password-reset link, a sign-in code. Their values are never
//! shown by outboxd (its API, admin page, CLI, logs, traces and callbacks show
//! `"[secret]"`), and are scrubbed from the stored payload when the message ends. A kind
//! declares its own in its `kind.toml` (`secret_fields`); a producer may add more to one
//! message ([`crate::NewMessage::with_secret_fields`]).

use crate::InvalidMessage;

/// The most secret fields one message may name.
pub const MAX_SECRET_FIELDS: usize = 32;
/// The most names in one field's path.
pub const MAX_SECRET_PATH_NAMES: usize = 8;
/// The longest name in a path, in characters.
pub const MAX_SECRET_NAME_CHARS: usize = 64;

/// A payload field, named by its path: names joined by `.` (`reset_url`, `user.code`), each
/// 1 to [`MAX_SECRET_NAME_CHARS`] ASCII letters, digits, `_` or `-`, at most
/// [`MAX_SECRET_PATH_NAMES`] of them, as the table's CHECK takes it
/// (`migrations/*_secret_fields.sql`). A name that is a number picks an array's element
/// (`links.0`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretField(String);

impl SecretField {
    /// `text` as a field's path, or why it cannot be one.
    pub fn parse(text: impl Into<String>) -> Result<Self, InvalidMessage> {
        let text = text.into();
        let names: Vec<&str> = text.split('.').collect();
        let valid = names.len() <= MAX_SECRET_PATH_NAMES
            && names.iter().all(|name| {
                (1..=MAX_SECRET_NAME_CHARS).contains(&name.len())
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
            });
        if valid {
            Ok(Self(text))
        } else {
            Err(InvalidMessage::SecretField(text))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SecretField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_a_dotted_path_of_short_plain_names() {
        for good in ["reset_url", "user.code", "a-b.c_d.e", &"x".repeat(64)] {
            assert!(SecretField::parse(good).is_ok(), "{good}");
        }
        let nine = ["a"; 9].join(".");
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a..b",
            "a b",
            "ä",
            "a,b",
            &"x".repeat(65),
            &nine,
        ] {
            assert_eq!(
                SecretField::parse(bad),
                Err(InvalidMessage::SecretField(bad.to_owned())),
                "{bad}"
            );
        }
    }
}
