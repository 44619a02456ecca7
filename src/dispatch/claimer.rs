//! The claimer: where a claim starts scanning (the floor), how many rows it may take (the
//! pace and the claim size), the claim itself, each payload read once, and the batch's
//! recipients on the suppression list.

use std::sync::Arc;

use crate::store::Store;
use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::debug;

use super::batch::{Claim, Claiming};
use super::floor::{ClaimFloor, Floors};
use super::pace::{Paces, Plan, Planned};
use super::recipients::Suppressed;
use super::{DispatchError, DispatchSettings};
use crate::backlog::Backlog;
use crate::message::{ClaimedBatch, Lane};
use crate::render::{Renderer, envelope_keys};
use crate::store::{ClaimRequest, KeptConnection};
use crate::suppression::ListedAtClaim;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// Claims batches of due rows for this replica.
pub(super) struct Claimer {
    database: Arc<KeptConnection>,
    renderer: Arc<Renderer>,
    metrics: Arc<Metrics>,
    floor: ClaimFloor,
    paces: Paces,
    /// The claim size now: grows while batches come back full, back to `batch_size` after
    /// a short one.
    claim_size: u32,
    settings: DispatchSettings,
    /// Where the loop listens for the insert trigger's notifications, which move the floor.
    listen: Listen,
    /// Told of each full claim, for the work that yields to a drain.
    backlog: Arc<Backlog>,
}

/// Where the dispatcher listens: nowhere past a transaction pooler.
#[derive(Clone)]
pub(super) struct Listen {
    pub pool: Option<Store>,
}

impl Claimer {
    pub fn new(
        database: Arc<KeptConnection>,
        renderer: Arc<Renderer>,
        metrics: Arc<Metrics>,
        paces: Paces,
        settings: DispatchSettings,
    ) -> Self {
        Self {
            renderer,
            metrics,
            floor: ClaimFloor::new(),
            paces,
            claim_size: settings.batch_size,
            listen: Listen {
                pool: Some(database.store().clone()),
            },
            database,
            settings,
            backlog: Arc::default(),
        }
    }

    /// Tells `backlog` of each full claim.
    pub fn report_backlog_to(&mut self, backlog: Arc<Backlog>) {
        self.backlog = backlog;
    }

    /// Listens on `pool` instead of the claim's own (a direct connection past a transaction
    /// pooler), or nowhere.
    pub fn listen_on(&mut self, pool: Option<Store>) {
        self.listen = Listen { pool };
    }

    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    /// The connection the claimer keeps, shared with the recorder, and its pool.
    pub fn database(&self) -> &KeptConnection {
        &self.database
    }

    pub fn floor(&mut self) -> &mut ClaimFloor {
        &mut self.floor
    }

    /// Claims the next batch, as many rows as each route's pace and the claim size allow,
    /// or says that nothing is due or how long the paces say to wait.
    pub async fn claim(
        &mut self,
        due_by: Option<DateTime<Utc>>,
        lanes: &[Lane],
    ) -> Result<Claiming, DispatchError> {
        let wanted = self.claim_size;
        let planned = match self
            .paces
            .plan(self.database.store(), wanted, lanes, &self.metrics)
            .await
            .map_err(DispatchError::database(DatabaseOperation::Claim))?
        {
            Plan::Claim(planned) => planned,
            Plan::Wait(wait) => return Ok(Claiming::Paced(Instant::now() + wait)),
        };
        // The lease starts in the database during the claim; counting from before it
        // errs on the safe side. The send slots count from the booking, just before.
        let lease_start = Instant::now();
        let (claimed, at_claim) = self.claim_rows(&planned, due_by).await?;
        let (slots, full) = self
            .paces
            .claimed(
                self.database.store(),
                planned,
                &claimed.messages,
                &self.settings.lanes,
                &self.metrics,
            )
            .await;
        self.adapt_claim_size(full);
        if full {
            self.backlog.claimed_full();
        }
        if claimed.messages.is_empty() {
            return Ok(Claiming::NothingDue);
        }
        // Each payload is read here, once: the suppression lookup and the render share it.
        let payloads = claimed
            .messages
            .iter()
            .map(|message| self.renderer.read_payload(message))
            .collect();
        Ok(Claiming::Rows(Box::new(Claim {
            claimed,
            payloads,
            at_claim,
            lease_start,
            full,
            slots,
        })))
    }

    /// Which addresses of a claimed batch are suppressed: as the claim found them, and for
    /// any address the renderer finds that the claim did not read, from one more query.
    pub async fn suppressed(&self, claim: &mut Claim) -> Result<Suppressed, DispatchError> {
        let at_claim = std::mem::take(&mut claim.at_claim);
        let mut unread: Vec<String> = claim
            .payloads
            .iter()
            .filter_map(|payload| payload.as_ref().ok())
            .flat_map(envelope_keys)
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
            for (address, listing) in found {
                listed.entry(address).or_default().push(listing);
            }
        }
        Ok(Suppressed::listed(listed))
    }

    /// Doubles the claim after a full batch, up to the most allowed, so that a backlog
    /// drains in large batches with default options; a short batch means the backlog is
    /// gone, and the claim starts small again (low latency, little held per claim).
    fn adapt_claim_size(&mut self, full: bool) {
        self.claim_size = if full {
            self.claim_size
                .saturating_mul(2)
                .min(self.settings.max_batch_size)
        } else {
            self.settings.batch_size
        };
    }

    /// Claims the planned due rows from the claim floor up, and moves the floor.
    async fn claim_rows(
        &mut self,
        planned: &Planned,
        due_by: Option<DateTime<Utc>>,
    ) -> Result<(ClaimedBatch, ListedAtClaim), DispatchError> {
        let scan = self.floor.start();
        let bulk_kinds = self.settings.lanes.bulk_kinds();
        let claimed = self
            .database
            .claim(&ClaimRequest {
                limit: i64::from(planned.limit),
                bulk_limit: planned.bulk_limit.map(i64::from),
                lease: self.settings.lease,
                worker_id: &self.settings.worker_id,
                due_by,
                max_payload_bytes: i64::try_from(self.settings.max_payload_bytes)
                    .unwrap_or(i64::MAX),
                floor: scan.floor.transactional,
                bulk_kinds: &bulk_kinds,
                bulk_floor: scan.floor.bulk,
                lanes: &planned.lanes,
            })
            .await
            .map_err(DispatchError::database(DatabaseOperation::Claim))?;
        let after = Floors::after(claimed.batch.transactional, claimed.batch.bulk);
        self.floor.claimed(scan, after);
        Ok((claimed.batch, claimed.suppression))
    }
}
