//! One-click unsubscribe (RFC 8058): the link a bulk email's `List-Unsubscribe` carries,
//! and what it says when it comes back. The link's token is sealed, not only signed: it
//! holds the recipient's address, the scope an unsubscribe stops and the message it came
//! in, encrypted and authenticated with a key derived from `OUTBOXD_UNSUBSCRIBE_SECRET`
//! (ChaCha20-Poly1305, a random nonce per email). Nobody without the secret can make one,
//! change one character of one, move one to another address, or read the address out of a
//! proxy's access log; and no database row is written per email. docs/adr/0005 says why.

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use secrecy::{ExposeSecret as _, SecretString};

use crate::suppression::{Address, Scope};
use crate::text::debug_showing_only;

/// The token's first byte: its layout, so that a later one can be told apart.
const VERSION: u8 = 1;
/// What the key is derived for: the same secret used elsewhere gives another key.
const KEY_PURPOSE: &[u8] = b"outboxd one-click unsubscribe token key v1";
/// Bound into every token's seal: a token is good for this and nothing else.
const AAD: &[u8] = b"outboxd-unsubscribe";
/// The shortest secret taken: 32 characters (`openssl rand -hex 32` writes 64).
pub const MIN_SECRET_CHARS: usize = 32;
/// The longest token read: an address of 320 characters makes one of about 480.
const MAX_TOKEN_CHARS: usize = 600;
/// The longest public URL taken: the header's line must stay under 998 octets.
const MAX_PUBLIC_URL_CHARS: usize = 300;
/// Where the links point, under the public URL.
pub const PATH: &str = "/unsubscribe/";

/// What a good link asks: stop `scope`'s mail to `address`; it came in message `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub address: Address,
    pub scope: Scope,
    pub message: i64,
}

/// Why a token is not a link outboxd made: one reason for every kind of badness, so that
/// nothing about a forgery's nearness is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not an unsubscribe link outboxd made")]
pub struct BadToken;

/// The links' settings: where the internet reaches outboxd, and the keys that seal and
/// open the tokens (the first seals; each opens, so a secret can be rotated).
pub struct OneClick {
    base: String,
    keys: Vec<LessSafeKey>,
    random: SystemRandom,
}

debug_showing_only!(OneClick as one_click { base, keys = one_click.keys.len() });

impl OneClick {
    /// Checks the public URL (HTTPS, or HTTP to a loopback host; no query, fragment or
    /// credentials) and the secrets (one or more, comma-separated, each long enough).
    pub fn new(public_url: &str, secrets: &SecretString) -> Result<Self, String> {
        let base = public_base(public_url)?;
        let keys = secrets
            .expose_secret()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(key_of)
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err("the secret is empty".to_owned());
        }
        Ok(Self {
            base,
            keys,
            random: SystemRandom::new(),
        })
    }

    /// The public URL the links start with.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL of a link that stops `scope`'s mail to `address` (from message `message`).
    pub fn url_for(&self, address: &Address, scope: Scope, message: i64) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let mut sealed = plaintext(address, scope, message);
        self.keys[0]
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(AAD),
                &mut sealed,
            )
            .map_err(|_| "the unsubscribe token could not be sealed".to_owned())?;
        let mut token = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        token.push(VERSION);
        token.extend_from_slice(&nonce);
        token.extend_from_slice(&sealed);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        Ok(format!("{}{PATH}{token}", self.base))
    }

    /// What a token says, when one of the keys made it.
    pub fn open(&self, token: &str) -> Result<Unsubscribe, BadToken> {
        if token.len() > MAX_TOKEN_CHARS {
            return Err(BadToken);
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| BadToken)?;
        let (&version, rest) = bytes.split_first().ok_or(BadToken)?;
        if version != VERSION || rest.len() < NONCE_LEN {
            return Err(BadToken);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        for key in &self.keys {
            let mut buffer = sealed.to_vec();
            let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| BadToken)?;
            if let Ok(opened) = key.open_in_place(nonce, Aad::from(AAD), &mut buffer) {
                return read_plaintext(opened);
            }
        }
        Err(BadToken)
    }
}

/// The key a secret gives: HMAC-SHA256 of the purpose, keyed with the secret.
fn key_of(secret: &str) -> Result<LessSafeKey, String> {
    if secret.chars().count() < MIN_SECRET_CHARS {
        return Err(format!(
            "a secret is at least {MIN_SECRET_CHARS} characters (`openssl rand -hex 32`)"
        ));
    }
    let derived = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes()),
        KEY_PURPOSE,
    );
    let key = UnboundKey::new(&CHACHA20_POLY1305, derived.as_ref())
        .map_err(|_| "the key could not be made".to_owned())?;
    Ok(LessSafeKey::new(key))
}

/// The public URL without its trailing `/`, checked.
fn public_base(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.chars().count() > MAX_PUBLIC_URL_CHARS {
        return Err(format!("a URL of at most {MAX_PUBLIC_URL_CHARS} characters"));
    }
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(host)) => host.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(format!("{text:?} has no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "{text:?} is HTTP: mailbox providers need HTTPS (HTTP is taken for a loopback host only, to try it out)"
            ));
        }
        other => return Err(format!("{text:?}: the scheme must be https, not {other}")),
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{text:?} has a query or a fragment: give the base URL only"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{text:?} has credentials: give the base URL only"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// `scope word, NUL, message id (8 bytes, big-endian), address`.
fn plaintext(address: &Address, scope: Scope, message: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(address.as_str().len() + 24);
    out.extend_from_slice(scope.as_str().as_bytes());
    out.push(0);
    out.extend_from_slice(&message.to_be_bytes());
    out.extend_from_slice(address.as_str().as_bytes());
    out
}

fn read_plaintext(bytes: &[u8]) -> Result<Unsubscribe, BadToken> {
    let at = bytes.iter().position(|b| *b == 0).ok_or(BadToken)?;
    let (scope, rest) = bytes.split_at(at);
    let scope: Scope = std::str::from_utf8(scope)
        .map_err(|_| BadToken)?
        .parse()
        .map_err(|_| BadToken)?;
    let rest = &rest[1..];
    if rest.len() < 8 {
        return Err(BadToken);
    }
    let (message, address) = rest.split_at(8);
    let message = i64::from_be_bytes(message.try_into().map_err(|_| BadToken)?);
    let address = std::str::from_utf8(address).map_err(|_| BadToken)?;
    let address = Address::parse(address).map_err(|_| BadToken)?;
    Ok(Unsubscribe {
        address,
        scope,
        message,
    })
}

#[cfg(test)]
mod tests;
