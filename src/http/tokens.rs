//! The admin surface's tokens: `OUTBOXD_ADMIN_TOKEN` (may change anything) and
//! `OUTBOXD_ADMIN_READ_TOKEN` (may only read), each given as a value or in a file (`_FILE`),
//! each holding one token or several (one a line, or comma-separated) so that a new one can
//! be rolled out before the old is removed. A file is read again when it changes (checked at
//! most once a second), so a Kubernetes Secret's rotation takes effect without a restart; a
//! file that cannot be read then keeps the tokens read before. Each token is known by its
//! set's name and a fingerprint (`admin#1a2b3c4d`: the first 8 hex digits of its SHA-256),
//! which the audit trail keeps; the token itself is never kept nor logged.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ring::{digest, hmac};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq as _;

use crate::lock::lock;

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;
/// The most tokens one set holds.
const MAX_TOKENS: usize = 8;
/// The largest token file read.
const MAX_FILE_BYTES: u64 = 4096;
/// How often a token file's time is looked at.
const RECHECK: Duration = Duration::from_secs(1);

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything: retry, discard, pause, suppress, cancel, erase, and every payload.
    Admin,
    /// Lists, lookups, timelines and stats; no change, and no payload of an ended message.
    ReadOnly,
}

/// A token that matched: who it names, and the key of its page's CSRF tokens.
#[derive(Clone)]
pub struct Matched {
    /// `NAME#fingerprint`.
    pub name: String,
    pub access: Access,
    pub csrf_key: hmac::Key,
}

struct Token {
    digest: digest::Digest,
    name: String,
    /// Derived from the token, so every replica behind a load balancer agrees on the CSRF
    /// tokens it signs.
    csrf_key: hmac::Key,
}

/// One set of tokens: the admin's or the read-only one.
pub struct TokenSet {
    name: String,
    access: Access,
    file: Option<PathBuf>,
    state: Mutex<Loaded>,
}

struct Loaded {
    tokens: Arc<Vec<Token>>,
    modified: Option<SystemTime>,
    checked: Instant,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet")
            .field("name", &self.name)
            .field("access", &self.access)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl TokenSet {
    /// The tokens in `value` (a variable's), named `name`; `variable` names it in errors.
    pub fn from_value(
        value: &SecretString,
        name: &str,
        access: Access,
        variable: &str,
    ) -> Result<Self, String> {
        let tokens = parse(value.expose_secret(), name).map_err(|e| format!("{variable}: {e}"))?;
        Ok(Self::with(tokens, name, access, None, None))
    }

    /// The tokens in the file at `path`, read again whenever it changes.
    pub fn from_file(path: PathBuf, name: &str, access: Access, variable: &str) -> Result<Self, String> {
        let (text, modified) =
            read(&path).map_err(|e| format!("{variable}_FILE {}: {e}", path.display()))?;
        let tokens = parse(text.expose_secret(), name)
            .map_err(|e| format!("{variable}_FILE {}: {e}", path.display()))?;
        Ok(Self::with(tokens, name, access, Some(path), modified))
    }

    fn with(
        tokens: Vec<Token>,
        name: &str,
        access: Access,
        file: Option<PathBuf>,
        modified: Option<SystemTime>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            access,
            file,
            state: Mutex::new(Loaded {
                tokens: Arc::new(tokens),
                modified,
                checked: Instant::now(),
            }),
        }
    }

    /// Whether the set holds the token `other` holds (refused at start: a token must say
    /// what its holder may do).
    pub fn shares_a_token_with(&self, other: &TokenSet) -> bool {
        let (mine, theirs) = (self.current(), other.current());
        mine.iter().any(|a| theirs.iter().any(|b| a.digest.as_ref() == b.digest.as_ref()))
    }

    /// The token `presented` matches, compared in constant time over digests, so neither
    /// content nor length leaks.
    pub fn matches(&self, presented: &str) -> Option<Matched> {
        let presented = digest::digest(&digest::SHA256, presented.as_bytes());
        let tokens = self.current();
        let mut found = None;
        for token in tokens.iter() {
            if bool::from(presented.as_ref().ct_eq(token.digest.as_ref())) {
                found = Some(Matched {
                    name: token.name.clone(),
                    access: self.access,
                    csrf_key: token.csrf_key.clone(),
                });
            }
        }
        found
    }

    /// The tokens now: a file's read again when its time changed.
    fn current(&self) -> Arc<Vec<Token>> {
        let mut state = lock(&self.state);
        let Some(path) = &self.file else {
            return Arc::clone(&state.tokens);
        };
        if state.checked.elapsed() < RECHECK {
            return Arc::clone(&state.tokens);
        }
        state.checked = Instant::now();
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != state.modified {
            // Once a change, read or not: a file that stays bad is told of once.
            state.modified = modified;
            match read(path).and_then(|(text, _)| parse(text.expose_secret(), &self.name)) {
                Ok(tokens) => {
                    tracing::info!(tokens = %self.name, count = tokens.len(), "read the admin tokens' file again");
                    state.tokens = Arc::new(tokens);
                }
                Err(e) => tracing::warn!(tokens = %self.name, error = %e, "could not read the admin tokens' file again; the tokens read before still hold"),
            }
        }
        Arc::clone(&state.tokens)
    }
}

/// A token file's text and time.
fn read(path: &std::path::Path) -> Result<(SecretString, Option<SystemTime>), String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let modified = file.metadata().and_then(|m| m.modified()).ok();
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("not UTF-8 text: {e}"))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("longer than {MAX_FILE_BYTES} bytes"));
    }
    Ok((SecretString::from(text), modified))
}

/// The tokens of a text: one a line, or comma-separated.
fn parse(text: &str, name: &str) -> Result<Vec<Token>, String> {
    let tokens: Vec<&str> = text
        .split([',', '\n', '\r'])
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() {
        return Err("holds no token".to_owned());
    }
    if tokens.len() > MAX_TOKENS {
        return Err(format!("holds {} tokens; at most {MAX_TOKENS}", tokens.len()));
    }
    if let Some(short) = tokens.iter().position(|t| t.chars().count() < MIN_TOKEN_CHARS) {
        return Err(format!(
            "token {} is too short: use at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 24`)",
            short + 1
        ));
    }
    Ok(tokens.into_iter().map(|t| token(t, name)).collect())
}

fn token(text: &str, name: &str) -> Token {
    let digest = digest::digest(&digest::SHA256, text.as_bytes());
    let fingerprint = crate::text::hex(&digest.as_ref()[..4]);
    let root = hmac::Key::new(hmac::HMAC_SHA256, text.as_bytes());
    let csrf_key = hmac::Key::new(
        hmac::HMAC_SHA256,
        hmac::sign(&root, b"outboxd admin csrf").as_ref(),
    );
    Token {
        digest,
        name: format!("{name}#{fingerprint}"),
        csrf_key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> TokenSet {
        TokenSet::from_value(&SecretString::from(text.to_owned()), "admin", Access::Admin, "X")
            .expect("tokens")
    }

    #[test]
    fn each_token_of_a_set_is_accepted_and_named_by_its_fingerprint() {
        let tokens = set("first-token-0123456789,\nsecond-token-0123456789");
        let first = tokens.matches("first-token-0123456789").expect("first");
        let second = tokens.matches("second-token-0123456789").expect("second");
        assert!(first.name.starts_with("admin#") && first.name.len() == "admin#".len() + 8);
        assert_ne!(first.name, second.name);
        assert!(tokens.matches("first-token-012345678").is_none());
        assert!(tokens.matches("").is_none());
    }

    #[test]
    fn an_empty_or_short_token_is_refused() {
        for bad in ["", " , ", "short", "long-enough-token-1,short"] {
            let refused =
                TokenSet::from_value(&SecretString::from(bad.to_owned()), "admin", Access::Admin, "X");
            assert!(refused.is_err(), "{bad:?}");
        }
    }
}
