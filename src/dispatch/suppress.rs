//! The suppression list at send time: the batch's listed addresses as its claim found them
//! (with one more lookup only for addresses the claim could not read), then each message's
//! envelope without the suppressed ones.

use std::collections::HashMap;
use std::sync::Mutex;

use lettre::address::Envelope;

use tokio::time::Instant;
use tracing::debug;

use super::batch::Decided;
use super::{DispatchError, Dispatcher};
use crate::lock::lock;
use crate::message::{ClaimedBatch, ClaimedMessage, Outcome};
use crate::render::{Renderer, suppression_key};
use crate::suppression::{ListedAtClaim, SuppressionReason};
use crate::telemetry::metrics::DatabaseOperation;
use crate::telemetry::{catch_panic_now, log_caught};

/// The addresses of one batch that were on the list at its claim, and those a server said
/// do not exist while it was being sent.
#[derive(Debug, Default)]
pub(super) struct Suppressed {
    listed: HashMap<String, SuppressionReason>,
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
    /// An address that bounced hard in this batch: its batch-mates to it are not sent.
    pub fn bounced(&self, address: &str) {
        lock(&self.bounced).insert(address.to_owned(), SuppressionReason::HardBounce);
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

impl Dispatcher {
    /// The batch's suppressed addresses. Nothing is sent without them: on a failure the rows
    /// go back at once (or are held, if the database does not take that either), and the
    /// error makes the loop back off as after any database failure, rather than claim them
    /// again in a tight loop.
    pub(super) async fn suppressed_or_release(
        &self,
        claimed: &ClaimedBatch,
        at_claim: ListedAtClaim,
        lease_start: Instant,
    ) -> Result<Suppressed, DispatchError> {
        let error = match self.suppressed_in(claimed, at_claim).await {
            Ok(suppressed) => return Ok(suppressed),
            Err(e) => e,
        };
        let releases = (0..claimed.messages.len())
            .map(|index| Decided {
                index,
                outcome: Outcome::not_started(),
                after: lease_start.elapsed(),
                bounced: None,
            })
            .collect();
        if let Err(held) = self
            .record_decided(claimed, releases, tracing::Span::none())
            .await
        {
            debug!(error = %held, "the releases are held to record before the next claim");
        }
        Err(error)
    }

    /// Which addresses of a claimed batch are suppressed: as the claim found them, and for
    /// any address the renderer finds that the claim did not read, from one more query.
    pub(super) async fn suppressed_in(
        &self,
        claimed: &ClaimedBatch,
        at_claim: ListedAtClaim,
    ) -> Result<Suppressed, DispatchError> {
        let mut unread: Vec<String> = claimed
            .messages
            .iter()
            .flat_map(|message| keys_of(&self.sender.renderer, message))
            .filter(|address| !at_claim.looked_up.contains(address))
            .collect();
        unread.sort_unstable();
        unread.dedup();
        let mut listed = at_claim.listed;
        if !unread.is_empty() {
            debug!(
                addresses = unread.len(),
                "looking up recipients the claim did not read"
            );
            let found = self
                .database
                .suppressed_among(&unread)
                .await
                .map_err(DispatchError::database(DatabaseOperation::Claim))?;
            listed.extend(found);
        }
        Ok(Suppressed {
            listed,
            bounced: Mutex::new(HashMap::new()),
        })
    }
}

/// A message's envelope addresses as the list keeps them. A parser that panics on this
/// payload yields none here: the render then meets the same panic where it is caught and
/// counted (see `attempt::caught`), rather than ending the dispatch loop before any send.
fn keys_of(renderer: &Renderer, message: &ClaimedMessage) -> Vec<String> {
    catch_panic_now(|| renderer.suppression_keys(message)).unwrap_or_else(|panic| {
        log_caught(
            &panic,
            Some(message.id),
            None,
            "reading a message's recipients for the suppression list panicked; its render meets the same panic",
        );
        Vec::new()
    })
}
