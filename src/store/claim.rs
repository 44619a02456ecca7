//! The claim: due rows taken under a lease, in three tiers (transactional priorities, then
//! the transactional and the bulk lane from the due index, each from its own floor), in
//! one statement (`sql/claim.sql`; why it is shaped so: docs/adr/0001-the-claim.md).

use super::statement::Sql;
use super::statements::Store;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgExecutor};
use uuid::Uuid;

use crate::message::{ClaimedBatch, ClaimedMessage, Lane, LaneScan};
use crate::suppression::{ListedAtClaim, Listing};

/// The claim's tiers, as its rows name them (`tier`, `sql/claim.sql`).
pub(crate) const URGENT: &str = "urgent";
pub(crate) const REGULAR: &str = "regular";
pub(crate) const BULK: &str = "bulk";

/// A request for a batch of due rows.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The most rows of the transactional tiers, and of all when `bulk_limit` is `None`.
    pub limit: i64,
    /// The most rows of the bulk lane when its pace is its own (relays of its own).
    pub bulk_limit: Option<i64>,
    pub lease: Duration,
    pub worker_id: &'a str,
    /// Only rows due at or before this time; `None` means now. A drain passes the time of
    /// its previous claim (see `Dispatcher::drain`).
    pub due_by: Option<DateTime<Utc>>,
    /// A payload whose text is longer stays in the database: the row comes back without
    /// it, to be dead-lettered, and costs no memory here.
    pub max_payload_bytes: i64,
    /// Only rows due at or after this time; `None` scans from the start. Below the floor
    /// the due index may hold only the entries of rows already sent, which PostgreSQL
    /// cannot remove while a transaction elsewhere is older than them.
    pub floor: Option<DateTime<Utc>>,
    /// The kinds of the bulk lane (`message::Lanes`): claimed after every other kind's due
    /// rows, in due order whatever their priority, from a floor of their own.
    pub bulk_kinds: &'a [String],
    pub bulk_floor: Option<DateTime<Utc>>,
    /// The lanes to claim: those whose relays' circuit is closed.
    pub lanes: &'a [Lane],
}

/// Claims up to `limit` due rows under a new lease, in the tiers' order (`sql/claim.sql`),
/// and returns them highest priority first, then oldest due. The claim also reads each
/// row's envelope addresses and which of them are on the suppression list, by a simpler rule
/// than the renderer's parser: the dispatcher looks up separately any address the renderer
/// finds that this rule did not.
pub async fn claim<'e>(
    store: &Store,
    executor: impl PgExecutor<'e>,
    request: &ClaimRequest<'_>,
) -> Result<Claimed, sqlx::Error> {
    let token = Uuid::new_v4();
    let rows: Vec<ClaimedRow> = store
        .query_as(Sql::Claim)
        .bind(request.limit)
        .bind(request.lease.as_secs_f64())
        .bind(request.worker_id)
        .bind(request.due_by)
        .bind(token)
        .bind(request.max_payload_bytes)
        .bind(request.floor)
        .bind(request.bulk_kinds)
        .bind(request.bulk_floor)
        .bind(request.lanes.iter().map(|lane| lane.as_str()).collect::<Vec<_>>())
        .bind(request.bulk_limit)
        .fetch_all(executor)
        .await?;

    let claimed_at = rows
        .first()
        .map_or_else(|| request.due_by.unwrap_or_else(Utc::now), |r| r.claimed_at);
    let (transactional, bulk) = lane_scans(request, &rows);
    let mut suppression = ListedAtClaim::default();
    let mut messages = Vec::with_capacity(rows.len());
    for row in rows {
        suppression.looked_up.extend(row.looked_up);
        // The tables' CHECKs allow only known reasons and scopes; an unknown one would be
        // skipped here as `suppressed_among` skips it.
        let entries = row.reasons.iter().zip(&row.scopes);
        for (address, (reason, scope)) in row.listed.into_iter().zip(entries) {
            if let Some(listing) = listing(reason, scope) {
                suppression.listed.entry(address).or_default().push(listing);
            }
        }
        messages.push(row.message);
    }
    messages.sort_unstable_by_key(|m| (std::cmp::Reverse(m.priority), m.due_at, m.id));
    Ok(Claimed {
        batch: ClaimedBatch {
            token,
            claimed_at,
            transactional,
            bulk,
            messages: messages.into(),
        },
        suppression,
    })
}

/// What the transactional (`regular`) and the bulk tier found, each against what it could
/// take: the limit less what the tiers before it took. Only these two scan from a floor; a
/// row of the `urgent` tier may be due after priority-0 rows left behind, so it says
/// nothing of where the next scan can start. The bound of the due range is known only from
/// the database (a row's `claimed_at`) or from the request, never from this host's clock.
fn lane_scans(request: &ClaimRequest<'_>, rows: &[ClaimedRow]) -> (LaneScan, LaneScan) {
    let bound = request.due_by.or(rows.first().map(|r| r.claimed_at));
    let taken = |tier: &str| rows.iter().filter(|r| r.tier == tier).count();
    let room = usize::try_from(request.limit).unwrap_or(0);
    let room_regular = room.saturating_sub(taken(URGENT));
    let room_bulk = match request.bulk_limit {
        Some(limit) => usize::try_from(limit).unwrap_or(0),
        None => room_regular.saturating_sub(taken(REGULAR)),
    };
    // A lane not claimed was not scanned: its floor stays.
    let scan = |tier: &str, lane: Lane, room: usize| LaneScan {
        lowest_due: rows
            .iter()
            .filter(|r| r.tier == tier)
            .map(|r| r.was_due_at)
            .min(),
        emptied_to: bound.filter(|_| taken(tier) < room && request.lanes.contains(&lane)),
    };
    (
        scan(REGULAR, Lane::Transactional, room_regular),
        scan(BULK, Lane::Bulk, room_bulk),
    )
}

/// What a claim took, and, apart, what it found of the suppression list.
#[derive(Debug)]
pub struct Claimed {
    pub batch: ClaimedBatch,
    /// The batch's envelope addresses the claim read, and those of them listed.
    pub suppression: ListedAtClaim,
}

/// A claimed row, with the database's clock at the claim.
#[derive(FromRow)]
struct ClaimedRow {
    #[sqlx(flatten)]
    message: ClaimedMessage,
    claimed_at: DateTime<Utc>,
    /// `next_attempt_at` before the claim moved it to the lease's end.
    was_due_at: DateTime<Utc>,
    /// Which part of the claim took it: `urgent`, `regular` or `bulk`.
    tier: String,
    /// The envelope addresses the claim read from the payload, ASCII letters lower-cased.
    looked_up: Vec<String>,
    /// Those of them on the suppression list now, and the reason of each.
    listed: Vec<String>,
    reasons: Vec<String>,
    scopes: Vec<String>,
}

/// An entry of the list as its columns hold it, if both words are known.
pub(super) fn listing(reason: &str, scope: &str) -> Option<Listing> {
    Some(Listing {
        reason: reason.parse().ok()?,
        scope: scope.parse().ok()?,
    })
}
