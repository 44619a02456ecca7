//! Each email's own envelope sender (VERP) when `OUTBOXD_BOUNCE_DOMAIN` is set:
//! `bounces+42.3f9a0c1d2e4b5a69@bounces.acme.example`. A bounce (a DSN) that comes back
//! later is sent to it, and so names its message; the signature (HMAC-SHA256 over this
//! installation's tag and the row's id, cut to 64 bits, with a key derived from
//! `OUTBOXD_BOUNCE_SECRET`) tells our addresses from any other, so that nobody can make a
//! bounce about a message by guessing its id.

use ring::hmac;
use secrecy::{ExposeSecret as _, SecretString};
use subtle::ConstantTimeEq as _;

use super::InstallationTag;
use crate::text::debug_showing_only;

/// The local part's fixed start.
const PREFIX: &str = "bounces+";
/// What the key is derived for: the same secret used elsewhere gives another key.
const KEY_PURPOSE: &[u8] = b"outboxd return-path signature key v1";
/// The signature's length in bytes (16 hex digits).
const SIGNATURE_BYTES: usize = 8;
/// The shortest secret taken, as for the unsubscribe links.
pub const MIN_SECRET_CHARS: usize = 32;

/// Why an address is not one outboxd made: one reason for every kind of forgery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a return path outboxd made")]
pub struct Forged;

/// Makes and reads the signed return paths of one installation.
pub struct ReturnPaths {
    domain: String,
    tag: InstallationTag,
    /// The first signs; each verifies, so that a secret can be rotated.
    keys: Vec<hmac::Key>,
}

debug_showing_only!(ReturnPaths as paths { domain, keys = paths.keys.len() });

impl ReturnPaths {
    /// Checks the secrets (one or more, comma-separated, each long enough); `domain` is
    /// checked by the configuration.
    pub fn new(domain: &str, secrets: &SecretString, tag: InstallationTag) -> Result<Self, String> {
        let keys = secrets
            .expose_secret()
            .split(',')
            .map(str::trim)
            .map(|secret| {
                if secret.chars().count() < MIN_SECRET_CHARS {
                    return Err(format!("each secret must be {MIN_SECRET_CHARS} characters at least"));
                }
                let derive = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
                Ok(hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&derive, KEY_PURPOSE).as_ref()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            domain: domain.to_ascii_lowercase(),
            tag,
            keys,
        })
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The envelope sender of row `id`'s email.
    pub fn of(&self, id: i64) -> String {
        let signature = crate::text::hex(&self.signature(&self.keys[0], id));
        format!("{PREFIX}{id}.{signature}@{}", self.domain)
    }

    /// The row a return path names, if outboxd made it for this installation. Local parts
    /// are read without regard to case, as some relays fold them.
    pub fn read(&self, address: &str) -> Result<i64, Forged> {
        let (local, domain) = address.rsplit_once('@').ok_or(Forged)?;
        if !domain.eq_ignore_ascii_case(&self.domain) {
            return Err(Forged);
        }
        let local = local.to_ascii_lowercase();
        let (id, signature) = local
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .ok_or(Forged)?;
        // One spelling per row: `+42`, `042` are not ours.
        let id: i64 = id.parse().map_err(|_| Forged)?;
        if id.to_string() != id_text(&local) {
            return Err(Forged);
        }
        if signature.len() != SIGNATURE_BYTES * 2 {
            return Err(Forged);
        }
        let given = unhex(signature).ok_or(Forged)?;
        let genuine = self
            .keys
            .iter()
            .any(|key| bool::from(self.signature(key, id).ct_eq(&given)));
        if genuine { Ok(id) } else { Err(Forged) }
    }

    fn signature(&self, key: &hmac::Key, id: i64) -> [u8; SIGNATURE_BYTES] {
        let signed = hmac::sign(key, format!("{}:{id}", self.tag.as_str()).as_bytes());
        let mut cut = [0; SIGNATURE_BYTES];
        cut.copy_from_slice(&signed.as_ref()[..SIGNATURE_BYTES]);
        cut
    }
}

/// The id's text in a local part already read as `bounces+ID.SIG`.
fn id_text(local: &str) -> &str {
    local
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('.'))
        .map_or("", |(id, _)| id)
}


fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Forged, ReturnPaths};
    use crate::message::InstallationTag;

    fn paths(secrets: &str, tag: &str) -> ReturnPaths {
        let tag = InstallationTag::parse(tag).unwrap();
        ReturnPaths::new("Bounces.Example", &secrets.to_owned().into(), tag).unwrap()
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_return_path_names_its_row_and_only_its_maker_reads_it() {
        let ours = paths(SECRET, "k3f9q2");
        let address = ours.of(42);
        assert!(address.starts_with("bounces+42."), "{address}");
        assert!(address.ends_with("@bounces.example"), "{address}");
        assert_eq!(ours.read(&address), Ok(42));
        assert_eq!(ours.read(&address.to_uppercase()), Ok(42), "a relay folded its case");
        // Another row's id with this signature, one digit changed, another key, another
        // installation (staging sharing the secret), another domain, junk: one answer.
        let forgeries = [
            address.replacen("+42.", "+43.", 1),
            address.replacen("@bounces.example", "@elsewhere.example", 1),
            paths(OTHER, "k3f9q2").of(42),
            paths(SECRET, "a0b1c2").of(42),
            "bounces+42@bounces.example".to_owned(),
            "bounces+42.zz@bounces.example".to_owned(),
            "postmaster@bounces.example".to_owned(),
            "bounces+-1.00@bounces.example".to_owned(),
            address.replacen("+42.", "+042.", 1),
            "no at sign".to_owned(),
        ];
        for forged in forgeries {
            assert_eq!(ours.read(&forged), Err(Forged), "{forged}");
        }
        let mut changed = address.clone().into_bytes();
        let at = changed.iter().position(|&b| b == b'@').unwrap() - 1;
        changed[at] = if changed[at] == b'0' { b'1' } else { b'0' };
        assert_eq!(ours.read(&String::from_utf8(changed).unwrap()), Err(Forged));
    }

    #[test]
    fn a_rotated_secret_still_reads_what_the_old_one_signed() {
        let old = paths(SECRET, "k3f9q2").of(7);
        let rotated = paths(&format!("{OTHER},{SECRET}"), "k3f9q2");
        assert_eq!(rotated.read(&old), Ok(7));
        assert_ne!(rotated.of(7), old, "the first secret signs");
        assert!(ReturnPaths::new("b.example", &"short".to_owned().into(), InstallationTag::parse("k3f9q2").unwrap()).is_err());
    }
}
