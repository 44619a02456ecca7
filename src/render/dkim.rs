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
mod key;

pub use key::{Algorithm, DkimKey};
use key::{SigningKey, aligned};

use base64::Engine as _;

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
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
];

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
                    domain: key.domain().to_owned(),
                    selector: key.selector().to_owned(),
                    algorithm: key.algorithm(),
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
    /// each computed over the message without the others: one per key of the domain its
    /// From (at `from_domain`) aligns with, the nearest when several do (`news.acme.example`
    /// before `acme.example`), the main domain's when none does.
    pub fn sign(&self, message: &[u8], now_unix: u64, from_domain: &str) -> Result<Vec<u8>, String> {
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
        for signature in self.signatures_for(from_domain) {
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

    /// The signatures of the domain a From at `from_domain` aligns with most nearly.
    fn signatures_for(&self, from_domain: &str) -> impl Iterator<Item = &Signature> {
        let signed = self
            .signatures
            .iter()
            .filter(|s| aligned(from_domain, &s.domain))
            .max_by_key(|s| s.domain.len())
            .or(self.signatures.first())
            .map(|s| s.domain.clone());
        self.signatures
            .iter()
            .filter(move |s| Some(&s.domain) == signed.as_ref())
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
