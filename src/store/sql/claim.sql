-- name: claim
-- Claims up to $1 due rows under a new lease, in three tiers, none taking a kind in
-- `outbox_kind_pauses` (read once per claim). `urgent` takes transactional due rows with a
-- priority from their own small index, in order of due time less a minute per priority
-- point, but only those that would go before the oldest due transactional row without one
-- that can be claimed now (`regular_head`, which locks and skips as the tiers do): a point
-- is a minute of waiting, so priority-0 rows are never starved. `regular` fills the batch
-- with the transactional lane's other due rows from its floor up (`dispatch::floor`).
-- `bulk` fills what is left with the bulk lane's rows from the bulk floor, and runs only
-- when there are bulk kinds. A tier skips the rows of the other lane and of paused kinds
-- above its floor; each floor passes them once its tier claims a row due after them or
-- comes back short. docs/adr/0001-the-claim.md says why each part is shaped as it is: the
-- lock mode, the lease in `next_attempt_at`, the envelope read and the suppression list
-- read once per batch, and the times moved onto the calendar.
-- $1 limit (bigint): the most rows to claim: of the transactional tiers, and of all when
--    $11 is null.
-- $2 lease (float8 seconds): how long the claim holds them.
-- $3 worker_id (text): the claiming replica, kept in `locked_by`.
-- $4 due_by (timestamptz, null for now): only rows due at or before it (a drain passes
--    the time of its previous claim).
-- $5 claim_token (uuid): the claim's token, which its outcomes must still hold.
-- $6 max_payload_bytes (bigint): a longer payload stays in the database; its row comes
--    back without it, to be dead-lettered.
-- $7 floor (timestamptz, null from the start): the transactional lane's floor.
-- $8 bulk_kinds (text[]): the kinds of the bulk lane.
-- $9 bulk_floor (timestamptz, null from the start): the bulk lane's floor.
-- $10 lanes (text[]): the lanes to claim (`transactional`, `bulk`): those whose relays'
--    circuit is closed. `urgent` and `regular` run only with `transactional`, `bulk` only
--    with `bulk`.
-- $11 bulk_limit (bigint, null when the lanes share their relays): the most rows of
--    `bulk`, whose relays have a pace of their own.
-- Index: outbox_messages_due_idx (next_attempt_at, id WHERE pending) for `regular` and
-- `bulk`, outbox_messages_priority_due_idx for `urgent`, outbox_suppressions' and outbox_lane_suppressions' primary keys.
WITH paused AS (
    SELECT coalesce(array_agg(kind), '{}') AS kinds FROM {{schema}}outbox_kind_pauses
), regular_head AS (
    SELECT next_attempt_at {{regular_due(1)}}
), urgent AS (
    SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text,
           'urgent' /* word: tier.urgent */ AS tier
    FROM {{schema}}outbox_messages
    WHERE {{pending}} AND priority > 0
      AND 'transactional' /* word: lane.transactional */ = ANY($10)
      AND next_attempt_at <= coalesce($4, now())
      AND kind <> ALL($8) AND kind <> ALL((SELECT kinds FROM paused)::text[])
      AND next_attempt_at - make_interval(mins => priority)
          <= coalesce((SELECT next_attempt_at FROM regular_head), 'infinity')
    ORDER BY next_attempt_at - make_interval(mins => priority), id
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
), regular AS (
    SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text,
           'regular' /* word: tier.regular */ AS tier
    {{regular_due($1 - (SELECT count(*) FROM urgent))}}
), bulk AS (
    SELECT id, next_attempt_at, locked_until AS previous_lease, payload::text AS payload_text,
           'bulk' /* word: tier.bulk */ AS tier
    FROM {{schema}}outbox_messages
    WHERE {{pending}}
      AND cardinality($8) > 0 AND 'bulk' /* word: lane.bulk */ = ANY($10)
      AND next_attempt_at <= coalesce($4, now())
      AND next_attempt_at >= coalesce($9, '-infinity')
      AND kind = ANY($8) AND kind <> ALL((SELECT kinds FROM paused)::text[])
    ORDER BY next_attempt_at, id
    LIMIT coalesce($11, $1 - (SELECT count(*) FROM urgent) - (SELECT count(*) FROM regular))
    FOR NO KEY UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM urgent UNION ALL SELECT * FROM regular UNION ALL SELECT * FROM bulk
), claimed AS (
    UPDATE {{schema}}outbox_messages AS m
    SET locked_until = now() + make_interval(secs => $2),
        next_attempt_at = now() + make_interval(secs => $2),
        locked_by = $3,
        claim_token = $5,
        {{times_on_the_calendar}}
    FROM due
    WHERE m.id = due.id
    RETURNING m.id, m.kind, m.attempts, m.traceparent, m.created_at, m.expires_at, m.priority,
              m.throttled_releases, m.cancel_requested_at IS NOT NULL AS cancel_requested,
              CASE WHEN octet_length(due.payload_text) <= $6 THEN due.payload_text END AS payload,
              octet_length(due.payload_text) AS payload_bytes,
              due.previous_lease IS NOT NULL AS reclaimed,
              greatest(m.created_at, m.not_before) AS due_at, due.tier,
              now() AS claimed_at,
              {{schema}}outbox_on_the_calendar(due.next_attempt_at) AS was_due_at,
              CASE WHEN octet_length(due.payload_text) <= $6 THEN
                  jsonb_path_query_array(m.payload, '$.to[*] ? (@.type() == "string")')
                  || jsonb_path_query_array(m.payload, '$.cc[*] ? (@.type() == "string")')
                  || jsonb_path_query_array(m.payload, '$.bcc[*] ? (@.type() == "string")')
              ELSE '[]'::jsonb END AS envelope
), looked AS (
    SELECT c.*,
           CASE jsonb_array_length(c.envelope)
               WHEN 0 THEN '{}'::text[]
               WHEN 1 THEN ARRAY[{{address_key((c.envelope ->> 0))}}]
               ELSE ARRAY(SELECT {{address_key(e.a)}}
                          FROM jsonb_array_elements_text(c.envelope) AS e(a))
           END AS looked_up
    FROM claimed AS c
), listed AS MATERIALIZED (
    SELECT key AS address, reason, scope
    FROM ({{listed_entries(SELECT unnest(looked_up) FROM looked)}}) AS entries
)
SELECT c.id, c.kind, c.attempts, c.traceparent, c.created_at, c.expires_at, c.priority,
       c.throttled_releases, c.cancel_requested, c.payload, c.payload_bytes, c.reclaimed, c.due_at, c.claimed_at,
       c.was_due_at, c.tier, c.looked_up, s.listed, s.reasons, s.scopes
FROM looked AS c
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(address), '{}') AS listed,
           coalesce(array_agg(reason), '{}') AS reasons,
           coalesce(array_agg(scope), '{}') AS scopes
    FROM listed WHERE address = ANY(c.looked_up)
) AS s
