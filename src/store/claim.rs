//! The claim: due rows taken under a lease, in three tiers (transactional priorities, then
//! the transactional and the bulk lane from the due index, each from its own floor).

use super::statements::query_as;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgExecutor};
use uuid::Uuid;

use crate::message::{ClaimedBatch, ClaimedMessage, LaneScan};
use crate::suppression::ListedAtClaim;

/// The claim's tiers, as its rows name them (`tier` in [`CLAIM`]): one definition for the
/// statement and for the code that reads its rows.
macro_rules! tier_urgent {
    () => {
        "urgent"
    };
}
macro_rules! tier_regular {
    () => {
        "regular"
    };
}
macro_rules! tier_bulk {
    () => {
        "bulk"
    };
}
/// The transactional lane's due rows from its floor, in due order, locked and skipped as
/// every tier locks and skips, `$limit` of them: the `regular` tier, and its head, which
/// the `urgent` tier measures a priority row's turn against. One text for both, so that
/// the head is always a row the tier could take.
macro_rules! regular_due {
    ($limit:literal) => {
        concat!(
            "FROM outbox_messages WHERE ",
            pending!(),
            " AND next_attempt_at <= coalesce($4, now()) \
              AND next_attempt_at >= coalesce($7, '-infinity') AND priority = 0 \
              AND kind <> ALL($8) AND kind <> ALL((SELECT kinds FROM paused)::text[]) \
            ORDER BY next_attempt_at, id LIMIT ",
            $limit,
            " FOR NO KEY UPDATE SKIP LOCKED"
        )
    };
}

const URGENT: &str = tier_urgent!();
const REGULAR: &str = tier_regular!();
const BULK: &str = tier_bulk!();

/// A request for a batch of due rows.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub limit: i64,
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
}

/// The claim, in three tiers, none taking a kind in `outbox_kind_pauses` (read once per
/// claim). `urgent` takes transactional due rows with a priority from their own small
/// index, in order of due time less a minute per priority point, but only those that
/// would go before the oldest due transactional row without one that can be claimed now
/// (`regular_head`, which skips and locks as the tiers do: a row an application's
/// transaction held open used to hold back every priority row due a minute after it for
/// as long as it was held): a point is a minute of waiting, so priority-0 rows are never
/// starved. `regular` fills the batch with the transactional lane's other due rows from
/// the due index, from the floor up (see `dispatch::floor`). `bulk` fills what is left with the bulk lane's rows, from the due
/// index and the bulk floor, and runs only when there are bulk kinds. All are index scans
/// whatever the mix. A tier skips the rows of the other lane and of paused kinds that lie
/// above its floor; each tier's floor passes them once it claims a row due after them, or
/// once it comes back short ([`lane_scans`]).
///
/// The claim also reads each row's envelope addresses (`to`, `cc`, `bcc`: the strings among
/// them, of a payload within the size limit) and which of them are on the suppression list,
/// which saves the dispatcher a round trip per batch. It reads them by a simpler rule than
/// the renderer's parser (`address_key!`, the list's normal form): the dispatcher looks up
/// separately any address the renderer finds that this rule did not (an internationalized
/// domain, say), so the list is always checked for exactly the addresses mailed. Nothing a
/// payload holds can fail this part of the statement, which would fail the claim of its
/// whole batch. A one-address envelope, the usual one, is keyed by an expression; only a
/// longer one runs a set-returning function, which keeps the planner's estimate far under
/// `jit_above_cost` (docs/src/benchmark-history.md, *Second round*). The list is read once
/// for the whole batch: read row by row, a list of a thousand addresses was a sequential
/// scan for each row (85 us each, 34 ms a claim of 400).
///
/// It moves a row's times into the years 1 to 9999 (`outbox_on_the_calendar`, migration 12):
/// a row written before that migration's CHECKs may hold an infinite time, which the driver
/// cannot read back, and which the CHECKs refuse in any update of the row.
///
/// `SKIP LOCKED` lets any number of replicas claim concurrently without waiting on or
/// taking each other's rows. The lock is `FOR NO KEY UPDATE`, the one the update itself
/// takes: a row an application's foreign key check holds `FOR KEY SHARE` is not skipped.
/// The lease also moves `next_attempt_at` to its expiry, so a claimed row leaves the due
/// range, and comes back by itself if its claimer dies.
///
/// Public for the test that reads its plan; [`claim`] binds its parameters in order.
pub const CLAIM: &str = concat!(
    "    WITH paused AS ( \
        SELECT coalesce(array_agg(kind), '{}') AS kinds FROM outbox_kind_pauses \
    ), regular_head AS ( \
        SELECT next_attempt_at ",
    regular_due!("1"),
    " \
    ), urgent AS ( \
        SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text, \
               '",
    tier_urgent!(),
    "' AS tier \
        FROM outbox_messages \
        WHERE ",
    pending!(),
    " AND priority > 0 \
          AND next_attempt_at <= coalesce($4, now()) \
          AND kind <> ALL($8) AND kind <> ALL((SELECT kinds FROM paused)::text[]) \
          AND next_attempt_at - make_interval(mins => priority) \
              <= coalesce((SELECT next_attempt_at FROM regular_head), 'infinity') \
        ORDER BY next_attempt_at - make_interval(mins => priority), id \
        LIMIT $1 \
        FOR NO KEY UPDATE SKIP LOCKED \
    ), regular AS ( \
        SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text, \
               '",
    tier_regular!(),
    "' AS tier ",
    regular_due!("$1 - (SELECT count(*) FROM urgent)"),
    " \
    ), bulk AS ( \
        SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text, \
               '",
    tier_bulk!(),
    "' AS tier \
        FROM outbox_messages \
        WHERE ",
    pending!(),
    " \
          AND cardinality($8) > 0 \
          AND next_attempt_at <= coalesce($4, now()) \
          AND next_attempt_at >= coalesce($9, '-infinity') \
          AND kind = ANY($8) AND kind <> ALL((SELECT kinds FROM paused)::text[]) \
        ORDER BY next_attempt_at, id \
        LIMIT $1 - (SELECT count(*) FROM urgent) - (SELECT count(*) FROM regular) \
        FOR NO KEY UPDATE SKIP LOCKED \
    ), due AS ( \
        SELECT * FROM urgent UNION ALL SELECT * FROM regular UNION ALL SELECT * FROM bulk \
    ), claimed AS ( \
        UPDATE outbox_messages AS m \
        SET locked_until = now() + make_interval(secs => $2), \
            next_attempt_at = now() + make_interval(secs => $2), \
            locked_by = $3, \
            claim_token = $5, ",
    times_on_the_calendar!(),
    " \
        FROM due \
        WHERE m.id = due.id \
        RETURNING m.id, m.kind, m.attempts, m.traceparent, m.created_at, m.expires_at, m.priority, \
                  m.throttled_releases, \
                  CASE WHEN octet_length(due.payload_text) <= $6 THEN due.payload_text END AS payload, \
                  octet_length(due.payload_text) AS payload_bytes, \
                  due.previous_lease IS NOT NULL AS reclaimed, \
                  greatest(m.created_at, m.not_before) AS due_at, due.tier, \
                  now() AS claimed_at, outbox_on_the_calendar(due.next_attempt_at) AS was_due_at, \
                  CASE WHEN octet_length(due.payload_text) <= $6 THEN \
                      jsonb_path_query_array(m.payload, '$.to[*] ? (@.type() == \"string\")') \
                      || jsonb_path_query_array(m.payload, '$.cc[*] ? (@.type() == \"string\")') \
                      || jsonb_path_query_array(m.payload, '$.bcc[*] ? (@.type() == \"string\")') \
                  ELSE '[]'::jsonb END AS envelope \
    ), looked AS ( \
        SELECT c.*, \
               CASE jsonb_array_length(c.envelope) \
                   WHEN 0 THEN '{}'::text[] \
                   WHEN 1 THEN ARRAY[",
    address_key!("(c.envelope ->> 0)"),
    "] \
                   ELSE ARRAY(SELECT ",
    address_key!("e.a"),
    " FROM jsonb_array_elements_text(c.envelope) AS e(a)) \
               END AS looked_up \
        FROM claimed AS c \
    ), listed AS MATERIALIZED ( \
        SELECT address, reason FROM outbox_suppressions \
        WHERE address IN (SELECT unnest(looked_up) FROM looked) \
          AND ",
    active_suppression!(),
    " \
    ) \
    SELECT c.id, c.kind, c.attempts, c.traceparent, c.created_at, c.expires_at, c.priority, \
           c.throttled_releases, c.payload, c.payload_bytes, c.reclaimed, c.due_at, c.claimed_at, \
           c.was_due_at, c.tier, c.looked_up, s.listed, s.reasons \
    FROM looked AS c \
    CROSS JOIN LATERAL ( \
        SELECT coalesce(array_agg(address), '{}') AS listed, \
               coalesce(array_agg(reason), '{}') AS reasons \
        FROM listed WHERE address = ANY(c.looked_up) \
    ) AS s",
);

/// Claims up to `limit` due rows under a new lease, in the tiers' order (see [`CLAIM`]),
/// and returns them highest priority first, then oldest due.
pub async fn claim<'e>(
    executor: impl PgExecutor<'e>,
    request: &ClaimRequest<'_>,
) -> Result<Claimed, sqlx::Error> {
    let token = Uuid::new_v4();
    let rows: Vec<ClaimedRow> = query_as(CLAIM)
        .bind(request.limit)
        .bind(request.lease.as_secs_f64())
        .bind(request.worker_id)
        .bind(request.due_by)
        .bind(token)
        .bind(request.max_payload_bytes)
        .bind(request.floor)
        .bind(request.bulk_kinds)
        .bind(request.bulk_floor)
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
        // The table's CHECK allows only known reasons; an unknown one would be skipped here
        // as `suppressed_among` skips it.
        let reasons = row.reasons.iter().map(|reason| reason.parse().ok());
        for (address, reason) in row.listed.into_iter().zip(reasons) {
            if let Some(reason) = reason {
                suppression.listed.insert(address, reason);
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
    let room_bulk = room_regular.saturating_sub(taken(REGULAR));
    let scan = |tier: &str, room: usize| LaneScan {
        lowest_due: rows
            .iter()
            .filter(|r| r.tier == tier)
            .map(|r| r.was_due_at)
            .min(),
        emptied_to: bound.filter(|_| taken(tier) < room),
    };
    (scan(REGULAR, room_regular), scan(BULK, room_bulk))
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
}
