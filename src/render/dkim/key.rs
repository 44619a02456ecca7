//! A DKIM key: its domain, selector and algorithm, read and checked at start-up, and the
//! library that signs with it.

use base64::Engine as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{PrivatePkcs1KeyDer, PrivatePkcs8KeyDer};
use secrecy::{ExposeSecret, SecretString};

use crate::text::debug_showing_only;

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

/// What a key signs with: the signature's `a=` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    RsaSha256,
    Ed25519Sha256,
}

impl Algorithm {
    /// The `a=` tag's value.
    pub fn tag(self) -> &'static str {
        match self {
            Self::RsaSha256 => "rsa-sha256",
            Self::Ed25519Sha256 => "ed25519-sha256",
        }
    }
}

/// A signing domain, selector and key, checked at start-up.
#[derive(Clone)]
pub struct DkimKey {
    domain: String,
    selector: String,
    pem: SecretString,
    algorithm: Algorithm,
}

debug_showing_only!(DkimKey as key { domain, selector, algorithm });

/// Whether a From at `domain` aligns with a signature for `signed` under DMARC's relaxed
/// alignment: the same domain, or a subdomain of it on a label boundary.
pub(super) fn aligned(domain: &str, signed: &str) -> bool {
    let (domain, signed) = (domain.to_ascii_lowercase(), signed.to_ascii_lowercase());
    domain == signed || domain.ends_with(&format!(".{signed}"))
}

impl DkimKey {
    /// The domain it signs for (`d=`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Whether a From at `domain` aligns with its signature under DMARC's relaxed
    /// alignment: the same domain, or a subdomain of it (on a label boundary).
    pub fn aligns_with(&self, domain: &str) -> bool {
        aligned(domain, &self.domain)
    }

    /// Its selector (`s=`).
    pub fn selector(&self) -> &str {
        &self.selector
    }

    /// The DNS name its public key is published at: `selector._domainkey.domain`.
    pub fn record(&self) -> String {
        format!("{}._domainkey.{}", self.selector, self.domain)
    }

    /// Reads and checks the key: an RSA private key in PKCS#1 PEM.
    pub fn new(domain: &str, selector: &str, pem: String) -> Result<Self, String> {
        let key = Self::named(domain, selector, pem, Algorithm::RsaSha256)?;
        key.der()?;
        let bits = key.modulus_bits()?;
        if bits < MIN_KEY_BITS {
            return Err(format!(
                "the RSA key has {bits} bits: verifiers refuse keys under {MIN_KEY_BITS} (RFC 8301); use 2048"
            ));
        }
        key.signing_key()?;
        Ok(key)
    }

    /// Reads and checks an Ed25519 key (RFC 8463), in PKCS#8 PEM as `openssl genpkey
    /// -algorithm ed25519` writes it.
    pub fn ed25519(domain: &str, selector: &str, pem: String) -> Result<Self, String> {
        let key = Self::named(domain, selector, pem, Algorithm::Ed25519Sha256)?;
        key.signing_key()?;
        Ok(key)
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The TXT record's value for an Ed25519 key (`k=ed25519; p=` the raw public key, RFC
    /// 8463); an RSA key's is `openssl rsa -pubout`'s, which the book shows how to publish.
    pub fn ed25519_record_value(&self) -> Option<String> {
        match self.signing_key().ok()? {
            SigningKey::Ed25519(key) => {
                use ring::signature::KeyPair as _;
                let public = base64::engine::general_purpose::STANDARD.encode(key.public_key());
                Some(format!("v=DKIM1; k=ed25519; p={public}"))
            }
            _ => None,
        }
    }

    fn named(
        domain: &str,
        selector: &str,
        pem: String,
        algorithm: Algorithm,
    ) -> Result<Self, String> {
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
        Ok(Self {
            domain: label(domain, "the domain")?,
            selector: label(selector, "the selector")?,
            pem: SecretString::from(pem),
            algorithm,
        })
    }

    /// The size of the key's modulus, read from its PKCS#1 structure
    /// (`SEQUENCE { version INTEGER, modulus INTEGER, ... }`).
    fn modulus_bits(&self) -> Result<usize, String> {
        let unreadable = || NOT_PKCS1.to_owned();
        let der = self.der()?;
        let mut input = der.secret_pkcs1_der();
        let sequence = der_element(&mut input, 0x30).ok_or_else(unreadable)?;
        let mut fields = sequence;
        der_element(&mut fields, 0x02).ok_or_else(unreadable)?;
        let modulus = der_element(&mut fields, 0x02).ok_or_else(unreadable)?;
        let significant = modulus.iter().skip_while(|b| **b == 0).count();
        Ok(significant * 8)
    }

    fn der(&self) -> Result<PrivatePkcs1KeyDer<'static>, String> {
        PrivatePkcs1KeyDer::from_pem_slice(self.pem.expose_secret().as_bytes())
            .map_err(|_| NOT_PKCS1.to_owned())
    }

    pub(super) fn signing_key(&self) -> Result<SigningKey, String> {
        if self.algorithm == Algorithm::Ed25519Sha256 {
            let der = PrivatePkcs8KeyDer::from_pem_slice(self.pem.expose_secret().as_bytes())
                .map_err(|_| NOT_ED25519.to_owned())?;
            // openssl writes PKCS#8 v1, without the public key, which the strict parser
            // refuses; the key is checked by deriving its public key either way.
            return ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(
                der.secret_pkcs8_der(),
            )
            .map(|key| SigningKey::Ed25519(Box::new(key)))
            .map_err(|e| format!("{NOT_ED25519} ({e})"));
        }
        let der = self.der()?;
        let unusable = |e: String| format!("the RSA key cannot sign: {e}");
        if self.modulus_bits()? >= RING_MIN_BITS {
            ring::signature::RsaKeyPair::from_der(der.secret_pkcs1_der())
                .map(|key| SigningKey::Ring(Box::new(key)))
                .map_err(|e| unusable(e.to_string()))
        } else {
            use rsa::pkcs1::DecodeRsaPrivateKey as _;
            rsa::RsaPrivateKey::from_pkcs1_der(der.secret_pkcs1_der())
                .map(|key| SigningKey::Small(Box::new(key)))
                .map_err(|e| unusable(e.to_string()))
        }
    }
}

/// What a key file for Ed25519 that is not one is told.
const NOT_ED25519: &str = "expected an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----), as `openssl genpkey -algorithm ed25519` writes it";

/// What a key file that is not an RSA private key in PKCS#1 PEM is told.
const NOT_PKCS1: &str = "expected an RSA private key in PKCS#1 PEM (-----BEGIN RSA PRIVATE KEY-----); \
     convert a PKCS#8 key with `openssl rsa -in key.pem -traditional`";

/// ring's RSA signs with keys of 2048 bits and more.
const RING_MIN_BITS: usize = 2048;

/// The private key, in the library that signs with it.
pub(super) enum SigningKey {
    Ring(Box<ring::signature::RsaKeyPair>),
    Small(Box<rsa::RsaPrivateKey>),
    Ed25519(Box<ring::signature::Ed25519KeyPair>),
}

#[cfg(test)]
mod tests {
    use super::aligned;

    #[test]
    fn a_from_aligns_with_its_signed_domain_or_a_parent_on_a_label_boundary() {
        assert!(aligned("acme.example", "acme.example"));
        assert!(aligned("News.Acme.Example", "acme.example"));
        assert!(!aligned("notacme.example", "acme.example"));
        assert!(!aligned("acme.example", "news.acme.example"));
        assert!(!aligned("elsewhere.example", "acme.example"));
    }
}
