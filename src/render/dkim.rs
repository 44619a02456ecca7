//! DKIM signing (RFC 6376): RSA-SHA256, and Ed25519-SHA256 (RFC 8463) beside it,
//! relaxed/relaxed canonicalization (a relay that
//! refolds a header does not break the signature), over the formatted email's headers that
//! outboxd writes and those the kinds declare, each oversigned: listed once more than it
//! occurs, so that a header added on the way, even one more `Subject:`, breaks the
//! signature (lettre's signer signed each once, and a prepended `Subject:` still verified).
//! RSA is ring's (constant-time, blinded) for keys of 2048 bits and more, and the `rsa`
//! crate's for the 1024- to 2047-bit keys that ring does not take and verifiers still
//! accept (RFC 8301). Ed25519 is ring's too. An Ed25519 signature is always a second one,
//! beside an RSA one (RFC 8463 asks signers to do both): verifiers that do not know
//! Ed25519 (Gmail's, in 2026) ignore it and check the RSA one.

mod canonical;

use base64::Engine as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{PrivatePkcs1KeyDer, PrivatePkcs8KeyDer};
use secrecy::{ExposeSecret, SecretString};

use crate::text::debug_showing_only;

/// Headers every signature covers; an absent one is signed as absent, so that nobody can
/// add it on the way.
const SIGNED_HEADERS: &[&str] = &[
    "From",
    "Reply-To",
    "Subject",
    "Date",
    "To",
    "Cc",
    "Message-ID",
    "MIME-Version",
    "Content-Type",
    "Content-Transfer-Encoding",
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
fn aligned(domain: &str, signed: &str) -> bool {
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

    fn signing_key(&self) -> Result<SigningKey, String> {
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

impl DkimSigner {
    /// The signer of one signature per key, over these headers besides [`SIGNED_HEADERS`].
    pub(super) fn new(keys: &[DkimKey], extra_headers: &[String]) -> Result<Self, String> {
        let mut headers: Vec<String> = Vec::new();
        for name in SIGNED_HEADERS
            .iter()
            .map(|h| (*h).to_owned())
            .chain(extra_headers.iter().cloned())
        {
            if !headers.iter().any(|h| h.eq_ignore_ascii_case(&name)) {
                headers.push(name);
            }
        }
        let signatures = keys
            .iter()
            .map(|key| {
                Ok(Signature {
                    domain: key.domain.clone(),
                    selector: key.selector.clone(),
                    algorithm: key.algorithm,
                    key: key.signing_key()?,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(DkimSigner {
            signatures,
            headers,
            random: ring::rand::SystemRandom::new(),
        })
    }
}

/// What a key file for Ed25519 that is not one is told.
const NOT_ED25519: &str = "expected an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----), as `openssl genpkey -algorithm ed25519` writes it";

/// What a key file that is not an RSA private key in PKCS#1 PEM is told.
const NOT_PKCS1: &str = "expected an RSA private key in PKCS#1 PEM (-----BEGIN RSA PRIVATE KEY-----); \
     convert a PKCS#8 key with `openssl rsa -in key.pem -traditional`";

/// The `h=` list, folded after a colon wherever a line would pass 72 characters: a kind
/// may declare many headers, and a header line may not pass 998 octets.
fn folded_list(names: &[&str]) -> String {
    let mut out = String::new();
    let mut line = 0;
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.push(':');
            line += 1;
            if line + name.len() > 72 {
                out.push_str("\r\n\t");
                line = 0;
            }
        }
        out.push_str(&name.to_ascii_lowercase());
        line += name.len();
    }
    out
}

/// ring's system random source, as the generator the rsa crate's blinding takes.
struct SystemRng<'r>(&'r ring::rand::SystemRandom);

impl rsa::rand_core::RngCore for SystemRng<'_> {
    fn next_u32(&mut self) -> u32 {
        let mut bytes = [0; 4];
        self.fill_bytes(&mut bytes);
        u32::from_le_bytes(bytes)
    }

    fn next_u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        self.fill_bytes(&mut bytes);
        u64::from_le_bytes(bytes)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // The system's generator does not fail once it has started; should it, the bytes
        // stay zero and the blinding is weaker, the signature still right.
        let _ = ring::rand::SecureRandom::fill(self.0, dest);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl rsa::rand_core::CryptoRng for SystemRng<'_> {}

/// ring's RSA signs with keys of 2048 bits and more.
const RING_MIN_BITS: usize = 2048;

/// The private key, in the library that signs with it.
enum SigningKey {
    Ring(Box<ring::signature::RsaKeyPair>),
    Small(Box<rsa::RsaPrivateKey>),
    Ed25519(Box<ring::signature::Ed25519KeyPair>),
}

/// One `DKIM-Signature` a signer adds.
struct Signature {
    domain: String,
    selector: String,
    algorithm: Algorithm,
    key: SigningKey,
}

/// Signs formatted emails: one signature per key, over the same headers.
pub struct DkimSigner {
    signatures: Vec<Signature>,
    headers: Vec<String>,
    random: ring::rand::SystemRandom,
}

debug_showing_only!(DkimSigner as signer { headers });

impl DkimSigner {
    /// `message` (a formatted email, CRLF line ends) with its `DKIM-Signature` fields first,
    /// each computed over the message without the others.
    pub fn sign(&self, message: &[u8], now_unix: u64) -> Result<Vec<u8>, String> {
        let (head, body) = match message.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => (&message[..at], &message[at + 4..]),
            None => (message, &b""[..]),
        };
        let body_hash = ring::digest::digest(&ring::digest::SHA256, &canonical::relaxed_body(body));
        let fields = canonical::fields(head);
        let names: Vec<&str> = self.headers.iter().map(String::as_str).collect();
        let list = canonical::signed_names(&names, &fields);
        let b64 = base64::engine::general_purpose::STANDARD;
        let covered = canonical::signed_headers(&list, &fields);
        let mut out = Vec::with_capacity(message.len() + 500 * self.signatures.len());
        for signature in &self.signatures {
            // Folded at its tags, so no line of it passes 998 octets; `b=` last and empty
            // here, as a verifier sees it once it has taken the signature out.
            let unsigned = format!(
                "DKIM-Signature: v=1; a={}; c=relaxed/relaxed; d={}; s={};\r\n\tt={now_unix}; h={};\r\n\tbh={};\r\n\tb=",
                signature.algorithm.tag(),
                signature.domain,
                signature.selector,
                folded_list(&list),
                b64.encode(body_hash.as_ref()),
            );
            let mut signed = covered.clone();
            let own = canonical::relaxed_header(unsigned.as_bytes());
            signed.extend_from_slice(own.strip_suffix(b"\r\n").unwrap_or(&own));
            let value = self.signed(&signature.key, &signed)?;
            out.extend_from_slice(unsigned.as_bytes());
            for (i, chunk) in b64.encode(value).as_bytes().chunks(72).enumerate() {
                if i > 0 {
                    out.extend_from_slice(b"\r\n\t");
                }
                out.extend_from_slice(chunk);
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(message);
        Ok(out)
    }

    /// The signature of `data` (the covered headers, canonical) with `key`.
    fn signed(&self, key: &SigningKey, data: &[u8]) -> Result<Vec<u8>, String> {
        match key {
            // RFC 8463: Ed25519 (PureEdDSA) over the SHA-256 hash of the data.
            SigningKey::Ed25519(key) => {
                let digest = ring::digest::digest(&ring::digest::SHA256, data);
                Ok(key.sign(digest.as_ref()).as_ref().to_vec())
            }
            SigningKey::Ring(key) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(
                    &ring::signature::RSA_PKCS1_SHA256,
                    &self.random,
                    data,
                    &mut signature,
                )
                .map_err(|_| "the RSA signature failed".to_owned())?;
                Ok(signature)
            }
            SigningKey::Small(key) => {
                let digest = ring::digest::digest(&ring::digest::SHA256, data);
                // With a random generator the rsa crate blinds its private-key operation,
                // which is not constant-time (RUSTSEC-2023-0071) on its own.
                key.sign_with_rng(
                    &mut SystemRng(&self.random),
                    rsa::Pkcs1v15Sign::new::<sha2::Sha256>(),
                    digest.as_ref(),
                )
                .map_err(|e| format!("the RSA signature failed: {e}"))
            }
        }
    }
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
