//! DKIM signing (RFC 6376) with lettre's signer: RSA-SHA256, relaxed/relaxed
//! canonicalization (a relay that refolds a header does not break the signature), over the
//! headers outboxd writes and those the kinds declare.

use lettre::message::dkim::{
    DkimCanonicalization, DkimCanonicalizationType, DkimConfig, DkimSigningAlgorithm,
    DkimSigningKey,
};
use lettre::message::header::HeaderName;
use rustls_pki_types::PrivatePkcs1KeyDer;
use rustls_pki_types::pem::PemObject as _;
use secrecy::{ExposeSecret, SecretString};

/// Headers every signature covers; an absent one is signed as absent, so that nobody can
/// add it on the way. Not `Content-Type`: lettre writes a MIME body's own headers after it
/// signs, so it would sign that header as absent and every verifier would fail (the body
/// hash still covers the parts).
const SIGNED_HEADERS: &[&str] = &[
    "From",
    "Reply-To",
    "Subject",
    "Date",
    "To",
    "Cc",
    "Message-ID",
    "MIME-Version",
    "X-Outbox-Id",
];

/// The smallest RSA key verifiers accept (RFC 8301).
const MIN_KEY_BITS: usize = 1024;

/// Takes one DER element of this tag off the front of `input`; its contents.
fn der_element<'a>(input: &mut &'a [u8], tag: u8) -> Option<&'a [u8]> {
    let (&found, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let octets = usize::from(first & 0x7f);
        if octets == 0 || octets > 4 || rest.len() < octets {
            return None;
        }
        let (bytes, after) = rest.split_at(octets);
        rest = after;
        bytes.iter().fold(0, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < length {
        return None;
    }
    let (contents, after) = rest.split_at(length);
    *input = after;
    Some(contents)
}

/// A signing domain, selector and RSA key, checked at start-up.
#[derive(Clone)]
pub struct DkimKey {
    domain: String,
    selector: String,
    pem: SecretString,
}

impl std::fmt::Debug for DkimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DkimKey")
            .field("domain", &self.domain)
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

impl DkimKey {
    /// Reads and checks the key: an RSA private key in PKCS#1 PEM.
    pub fn new(domain: &str, selector: &str, pem: String) -> Result<Self, String> {
        let label = |text: &str, what: &str| {
            let valid = !text.is_empty()
                && text.split('.').all(|part| {
                    !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                });
            if valid {
                Ok(text.to_ascii_lowercase())
            } else {
                Err(format!("{what} {text:?} is not a DNS name"))
            }
        };
        let key = Self {
            domain: label(domain, "the domain")?,
            selector: label(selector, "the selector")?,
            pem: SecretString::from(pem),
        };
        key.signing_key()?;
        let bits = key.modulus_bits()?;
        if bits < MIN_KEY_BITS {
            return Err(format!(
                "the RSA key has {bits} bits: verifiers refuse keys under {MIN_KEY_BITS} (RFC 8301); use 2048"
            ));
        }
        Ok(key)
    }

    /// The size of the key's modulus, read from its PKCS#1 structure
    /// (`SEQUENCE { version INTEGER, modulus INTEGER, ... }`).
    fn modulus_bits(&self) -> Result<usize, String> {
        let unreadable = || "the RSA key's structure cannot be read".to_owned();
        let der = PrivatePkcs1KeyDer::from_pem_slice(self.pem.expose_secret().as_bytes())
            .map_err(|_| unreadable())?;
        let mut input = der.secret_pkcs1_der();
        let sequence = der_element(&mut input, 0x30).ok_or_else(unreadable)?;
        let mut fields = sequence;
        der_element(&mut fields, 0x02).ok_or_else(unreadable)?;
        let modulus = der_element(&mut fields, 0x02).ok_or_else(unreadable)?;
        let significant = modulus.iter().skip_while(|b| **b == 0).count();
        Ok(significant * 8)
    }

    fn signing_key(&self) -> Result<DkimSigningKey, String> {
        DkimSigningKey::new(self.pem.expose_secret(), DkimSigningAlgorithm::Rsa).map_err(|_| {
            "expected an RSA private key in PKCS#1 PEM (-----BEGIN RSA PRIVATE KEY-----); \
             convert a PKCS#8 key with `openssl rsa -in key.pem -traditional`"
                .to_owned()
        })
    }

    /// lettre's signer for these headers besides [`SIGNED_HEADERS`].
    pub(super) fn config(&self, extra_headers: &[String]) -> Result<DkimConfig, String> {
        let mut headers: Vec<HeaderName> = Vec::new();
        for name in SIGNED_HEADERS
            .iter()
            .map(|h| (*h).to_owned())
            .chain(extra_headers.iter().cloned())
        {
            let taken = headers
                .iter()
                .any(|h| AsRef::<str>::as_ref(h).eq_ignore_ascii_case(&name));
            if !taken {
                headers.push(HeaderName::new_from_ascii(name).map_err(|e| e.to_string())?);
            }
        }
        Ok(DkimConfig::new(
            self.selector.clone(),
            self.domain.clone(),
            self.signing_key()?,
            headers,
            DkimCanonicalization {
                header: DkimCanonicalizationType::Relaxed,
                body: DkimCanonicalizationType::Relaxed,
            },
        ))
    }
}
