//! The suppression list at send time: the batch's listed addresses as its claim found them
//! (with one more lookup only for addresses the claim could not read), then each message's
//! envelope without the suppressed ones.

use tokio::time::Instant;
use tracing::debug;

use super::batch::Decided;
use super::recipients::Suppressed;
use super::{DispatchError, Dispatcher};
use crate::message::{ClaimedBatch, ClaimedMessage, Outcome};
use crate::render::Renderer;
use crate::suppression::ListedAtClaim;
use crate::telemetry::metrics::DatabaseOperation;
use crate::telemetry::{catch_panic_now, log_caught};

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
        Ok(Suppressed::listed(listed))
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
