//! `outboxd preview`'s render: one email as it would be sent, with its parts and envelope,
//! without a database or a server.

use lettre::address::Envelope;
use minijinja::value::Serde;
use serde_json::Value;

use super::{Parts, RenderError, Renderer};

/// An email as `outboxd preview` shows it: its parts, its envelope and its bytes.
#[derive(Debug, Clone)]
pub struct Preview {
    pub parts: Parts,
    pub envelope: Envelope,
    pub raw: Vec<u8>,
}

impl Renderer {
    /// One email as it would be sent (as message `id`), without a database or a server:
    /// for template authors. Signed when a DKIM key is set.
    pub fn preview(&self, id: i64, kind: &str, payload: &Value) -> Result<Preview, RenderError> {
        if !payload.is_object() {
            return Err(RenderError::Payload(
                "payload is not a JSON object".to_owned(),
            ));
        }
        let email = self.render(id, kind, payload)?;
        let raw = self.formatted(&email, kind)?;
        if raw.len() > self.limits.max_message_bytes {
            return Err(RenderError::TooLarge {
                bytes: raw.len(),
                max: self.limits.max_message_bytes,
            });
        }
        let parts = self.parts(kind, &minijinja::Value::from(Serde(payload)))?;
        Ok(Preview {
            parts,
            envelope: email.envelope().clone(),
            raw,
        })
    }

}
