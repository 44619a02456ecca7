//! The rights `outboxd run` needs on its objects: readiness checks each of them, so that a
//! role short of one is told apart from a healthy replica before its first claim fails,
//! and the book's GRANTs are tested against the same list.

/// An object outboxd uses, and one privilege on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Right {
    /// A table's name, or a function's signature.
    pub object: &'static str,
    pub privilege: &'static str,
    pub is_function: bool,
}

const fn table(object: &'static str, privilege: &'static str) -> Right {
    Right {
        object,
        privilege,
        is_function: false,
    }
}

/// Every right the dispatcher, retention and readiness use, in the order readiness names
/// the first one missing. The admin surface also inserts into `outbox_admin_audit`,
/// deletes from `outbox_suppressions` and `outbox_lane_suppressions`, writes
/// `outbox_kind_pauses`, reads `outbox_message_events` (the timelines) and executes
/// `outbox_cancel` and `outbox_cancel_id` (withdrawing messages); the webhooks
/// write `outbox_webhook_receipts` and `outbox_lane_suppressions`; the automatic pause
/// needs [`AUTO_PAUSE_RIGHTS`].
pub const RUN_RIGHTS: &[Right] = &[
    table("outbox_messages", "SELECT"),
    table("outbox_messages", "UPDATE"),
    table("outbox_messages", "DELETE"),
    table("outbox_suppressions", "SELECT"),
    table("outbox_suppressions", "INSERT"),
    table("outbox_suppressions", "UPDATE"),
    // The claim reads the lanes' entries of the list; the webhooks and the admin surface
    // write them.
    table("outbox_lane_suppressions", "SELECT"),
    table("outbox_send_rate", "SELECT"),
    table("outbox_send_rate", "INSERT"),
    table("outbox_send_rate", "UPDATE"),
    table("outbox_kind_pauses", "SELECT"),
    // Every outcome statement inserts its failures' events (even when it has none, the
    // statement needs the right), and retention deletes them with their messages (a DELETE
    // that reads `message_id` needs SELECT).
    table("outbox_message_events", "SELECT"),
    table("outbox_message_events", "INSERT"),
    table("outbox_message_events", "DELETE"),
    // Every outcome statement keeps its callbacks when they are on (even off, the statement
    // needs the right); the sampler counts those still to send, and retention deletes
    // them (a DELETE that reads `at` needs SELECT).
    table("outbox_callbacks", "SELECT"),
    table("outbox_callbacks", "INSERT"),
    table("outbox_callbacks", "DELETE"),
    // Retention deletes messages' tags with them; the lookups by tag read them.
    table("outbox_message_tags", "SELECT"),
    table("outbox_message_tags", "DELETE"),
    // The recipient lookup's index expressions: every outcome that ends a row evaluates
    // them.
    Right {
        object: "outbox_recipient_keys(jsonb)",
        privilege: "EXECUTE",
        is_function: true,
    },
    Right {
        object: "outbox_single_recipient_key(jsonb)",
        privilege: "EXECUTE",
        is_function: true,
    },
    Right {
        object: "outbox_on_the_calendar(timestamptz)",
        privilege: "EXECUTE",
        is_function: true,
    },
    // The masks of secret fields: every statement that ends a message may call them.
    Right {
        object: "outbox_masked(jsonb, text[])",
        privilege: "EXECUTE",
        is_function: true,
    },
    Right {
        object: "outbox_secret_fields_of(text, text[])",
        privilege: "EXECUTE",
        is_function: true,
    },
];

/// The rights the automatic pause adds (`OUTBOXD_AUTO_PAUSE_KINDS`): it reads a kind's last
/// resume from the audit log, and writes its pause with an audit entry.
pub const AUTO_PAUSE_RIGHTS: &[Right] = &[
    table("outbox_admin_audit", "SELECT"),
    table("outbox_kind_pauses", "INSERT"),
    table("outbox_admin_audit", "INSERT"),
];

/// The rights the delivery callbacks add (`OUTBOXD_CALLBACK_URL`): the sender leases and
/// records them. (Switching them on needs `UPDATE (callbacks)` on `outbox_installation`,
/// a column's right, which `outboxd run` asks for at start.)
pub const CALLBACK_RIGHTS: &[Right] = &[table("outbox_callbacks", "UPDATE")];

/// The rights payload retention adds (a kind's `payload_retention`): it records how far
/// each kind's sweep has gone.
pub const PAYLOAD_RETENTION_RIGHTS: &[Right] = &[table("outbox_kind_policies", "UPDATE")];

/// The rights readiness checks: [`RUN_RIGHTS`], and those of the features the
/// configuration turns on, so that a role short of one is told before the feature fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rights {
    pub auto_pause: bool,
    pub callbacks: bool,
    pub payload_retention: bool,
}

impl Rights {
    /// Each right, in the order readiness names the first one missing.
    pub fn iter(self) -> impl Iterator<Item = &'static Right> {
        let auto_pause = if self.auto_pause {
            AUTO_PAUSE_RIGHTS
        } else {
            &[]
        };
        let callbacks = if self.callbacks {
            CALLBACK_RIGHTS
        } else {
            &[]
        };
        let payloads = if self.payload_retention {
            PAYLOAD_RETENTION_RIGHTS
        } else {
            &[]
        };
        RUN_RIGHTS.iter().chain(auto_pause).chain(callbacks).chain(payloads)
    }
}

/// The rights as the three arrays of `schema_state` (`sql/schema_state.sql`), each object
/// in the store's schema.
pub(super) fn as_columns(
    store: &super::Store,
    rights: Rights,
) -> (Vec<String>, Vec<&'static str>, Vec<bool>) {
    (
        rights.iter().map(|r| store.qualified(r.object)).collect(),
        rights.iter().map(|r| r.privilege).collect(),
        rights.iter().map(|r| r.is_function).collect(),
    )
}
