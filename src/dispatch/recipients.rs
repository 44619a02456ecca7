//! Which recipients of a batch are not to be mailed: those on the list when it was claimed,
//! and those a server said do not exist while it was being sent; and each envelope
//! without them. Data and its filter only: the lookups are `suppress.rs`'s.

use std::collections::HashMap;
use std::sync::Mutex;

use lettre::address::Envelope;

use crate::lock::lock;
use crate::render::suppression_key;
use crate::suppression::{Address, SuppressionReason};

/// The addresses of one batch that were on the list at its claim, and those a server said
/// do not exist while it was being sent.
#[derive(Debug, Default)]
pub(super) struct Suppressed {
    listed: HashMap<String, SuppressionReason>,
    /// Shared: a send that meets a bounce adds to it, the batch's other sends read it.
    bounced: Mutex<HashMap<String, SuppressionReason>>,
}

/// What is left of an envelope.
#[derive(Debug)]
pub(super) enum Filtered {
    /// Nothing on the list: send as rendered.
    Unchanged,
    /// Some recipients dropped: send to the rest.
    Fewer(Envelope),
    /// Every recipient is on the list: the first one's reason, and how many there were.
    AllSuppressed(SuppressionReason, usize),
}

impl Suppressed {
    /// The addresses on the list at the batch's claim, with their reasons.
    pub fn listed(listed: HashMap<String, SuppressionReason>) -> Self {
        Self {
            listed,
            bounced: Mutex::new(HashMap::new()),
        }
    }

    /// An address that bounced hard in this batch: its batch-mates to it are not sent.
    pub fn bounced(&self, address: &Address) {
        lock(&self.bounced).insert(address.to_string(), SuppressionReason::HardBounce);
    }

    pub fn filter(&self, envelope: &Envelope) -> Filtered {
        let bounced = lock(&self.bounced);
        if self.listed.is_empty() && bounced.is_empty() {
            return Filtered::Unchanged;
        }
        let reason_of = |key: &str| self.listed.get(key).or_else(|| bounced.get(key)).copied();
        let mut first_reason = None;
        let kept: Vec<_> = envelope
            .to()
            .iter()
            .filter(|to| match reason_of(&suppression_key(to)) {
                Some(reason) => {
                    first_reason.get_or_insert(reason);
                    false
                }
                None => true,
            })
            .cloned()
            .collect();
        match first_reason {
            None => Filtered::Unchanged,
            Some(reason) if kept.is_empty() => Filtered::AllSuppressed(reason, envelope.to().len()),
            // Dropping recipients from a valid envelope leaves a valid one.
            Some(reason) => Envelope::new(envelope.from().cloned(), kept).map_or(
                Filtered::AllSuppressed(reason, envelope.to().len()),
                Filtered::Fewer,
            ),
        }
    }
}
