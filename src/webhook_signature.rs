//! The Standard Webhooks signature, both ways: HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}` with a shared secret written `whsec_` and its
//! base64, sent as `webhook-signature: v1,<base64>`. The bounce and complaint webhook
//! (`feedback::standard`) checks it on what it receives; the delivery callbacks
//! (`callbacks`) sign what they send with it.

use base64::Engine as _;
use secrecy::{ExposeSecret as _, SecretSlice};

/// The fewest bytes a secret holds.
const MIN_SECRET_BYTES: usize = 24;

/// A shared secret, never logged.
pub struct WebhookSecret {
    key: SecretSlice<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl WebhookSecret {
    /// `whsec_` followed by the base64 of at least 24 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let encoded = text
            .trim()
            .strip_prefix("whsec_")
            .ok_or("expected whsec_ followed by base64")?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| "the part after whsec_ is not base64".to_owned())?;
        if key.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the secret must be at least {MIN_SECRET_BYTES} bytes"
            ));
        }
        Ok(Self {
            key: SecretSlice::from(key),
        })
    }

    /// The HMAC-SHA256 tag of one request.
    pub fn tag(&self, id: &str, timestamp: &str, body: &[u8]) -> [u8; 32] {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.key.expose_secret());
        let mut context = ring::hmac::Context::with_key(&key);
        context.update(id.as_bytes());
        context.update(b".");
        context.update(timestamp.as_bytes());
        context.update(b".");
        context.update(body);
        let mut tag = [0; 32];
        tag.copy_from_slice(context.sign().as_ref());
        tag
    }

    /// The `webhook-signature` header of one request.
    pub fn signature(&self, id: &str, timestamp: &str, body: &[u8]) -> String {
        let tag = self.tag(id, timestamp, body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::WebhookSecret;

    #[test]
    fn a_signature_is_the_one_the_standard_webhooks_libraries_make() {
        // The vector of the Standard Webhooks libraries' own tests; the `standardwebhooks`
        // package from PyPI (1.3.0) signs it the same.
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature = secret.signature(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_secret_that_is_not_the_specifications_form_is_refused() {
        for (bad, says) in [
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "expected whsec_"),
            ("whsec_not base64!", "not base64"),
            ("whsec_c2hvcnQ=", "at least 24 bytes"),
        ] {
            let error = WebhookSecret::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
