//! A callback's JSON, the Standard Webhooks way (`type`, `timestamp`, `data`):
//!
//! ```json
//! {"type": "message.sent", "timestamp": "2026-12-07T09:30:00.123456Z",
//!  "data": {"message_id": 42, "idempotency_key": "signup-42", "kind": "account_verification",
//!           "tags": ["tenant:7"], "detail": "250 2.0.0 Ok: queued as 4XyZ"}}
//! ```
//! `timestamp` is when the event happened; `detail` the relay's reply to a send, the error
//! of a dead letter, a provider's diagnostic, or who withdrew it. A message retention has
//! deleted by then has only its id.

use serde_json::{Value, json};

use crate::store::callbacks::DueCallback;

/// The body of one callback.
pub fn callback_body(callback: &DueCallback) -> Value {
    json!({
        "type": callback.event,
        "timestamp": callback.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "data": {
            "message_id": callback.message_id,
            "idempotency_key": callback.idempotency_key,
            "kind": callback.kind,
            "tags": callback.tags,
            "detail": callback.detail,
        },
    })
}
