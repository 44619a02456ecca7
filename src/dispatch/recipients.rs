//! Which recipients of a batch are not to be mailed: those on the list when it was claimed,
//! and those a server said do not exist while it was being sent; and each envelope
//! without them. Data and its filter only: the lookups are `suppress.rs`'s.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use lettre::address::Envelope;

use crate::lock::lock;
use crate::render::suppression_key;
use crate::message::Lane;
use crate::suppression::{Address, Listing, Scope, SuppressionReason};

/// The addresses of one batch that were on the list at its claim, and those a server said
/// do not exist while it was being sent.
#[derive(Debug, Default)]
pub(super) struct Suppressed {
    listed: HashMap<String, Vec<Listing>>,
    /// Shared: a send that meets a bounce adds to it, the batch's other sends read it.
    bounced: Mutex<HashSet<String>>,
}

/// What is left of an envelope.
#[derive(Debug)]
pub(super) enum Filtered {
    /// Nothing on the list: send as rendered.
    Unchanged,
    /// Some recipients dropped: send to the rest.
    Fewer(Envelope),
    /// Every recipient is on the list: the first one's entry, and how many there were.
    AllSuppressed(Listing, usize),
}

/// A hard bounce met in this batch: it stops every kind.
const BOUNCED: Listing = Listing {
    reason: SuppressionReason::HardBounce,
    scope: Scope::All,
};

impl Suppressed {
    /// The entries on the list at the batch's claim, by address.
    pub fn listed(listed: HashMap<String, Vec<Listing>>) -> Self {
        Self {
            listed,
            bounced: Mutex::new(HashSet::new()),
        }
    }

    /// An address that bounced hard in this batch: its batch-mates to it are not sent.
    pub fn bounced(&self, address: &Address) {
        lock(&self.bounced).insert(address.to_string());
    }

    /// The envelope of a message of `lane` without the recipients an entry stops (an
    /// `essential` kind's is stopped by neither an unsubscribe nor a complaint).
    pub fn filter(&self, envelope: &Envelope, lane: Lane, essential: bool) -> Filtered {
        let bounced = lock(&self.bounced);
        if self.listed.is_empty() && bounced.is_empty() {
            return Filtered::Unchanged;
        }
        let stopped_by = |key: &str| {
            let listed = self.listed.get(key).into_iter().flatten().copied();
            let bounced = bounced.contains(key).then_some(BOUNCED);
            listed
                .chain(bounced)
                .find(|listing| listing.stops(lane, essential))
        };
        let mut first = None;
        let kept: Vec<_> = envelope
            .to()
            .iter()
            .filter(|to| match stopped_by(&suppression_key(to)) {
                Some(listing) => {
                    first.get_or_insert(listing);
                    false
                }
                None => true,
            })
            .cloned()
            .collect();
        match first {
            None => Filtered::Unchanged,
            Some(listing) if kept.is_empty() => {
                Filtered::AllSuppressed(listing, envelope.to().len())
            }
            // Dropping recipients from a valid envelope leaves a valid one.
            Some(listing) => Envelope::new(envelope.from().cloned(), kept).map_or(
                Filtered::AllSuppressed(listing, envelope.to().len()),
                Filtered::Fewer,
            ),
        }
    }
}
