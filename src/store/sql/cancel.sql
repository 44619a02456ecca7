-- Withdrawing messages for operators: one by id or key through migration 30's functions
-- (the producers' own way, so both answer alike), and pending messages by filter, counted
-- first, then cancelled a bounded batch a statement. Each is audited by its caller, in the
-- same transaction.

-- name: cancel_by_id
-- $1 id (bigint), $2 who (text): the operator, written on the timeline.
-- Index: outbox_messages_pkey (in the function).
SELECT {{schema}}outbox_cancel_id($1, $2) AS answer

-- name: cancel_by_key
-- $1 key (text): the producer's idempotency key, $2 who (text).
-- Index: outbox_messages_idempotency_key_idx (in the function).
SELECT {{schema}}outbox_cancel($1, $2) AS answer

-- fragment: pending_filter
-- The pending rows a bulk action is about: each criterion ignored when null. `$1` a kind,
-- `$2` a tag, `$3` created before, `$4` created at or after, `$5` a recipient domain
-- (lower-case; an envelope address ending in `@` and it).
{{pending}}
AND ($1::text IS NULL OR m.kind = $1)
AND ($2::text IS NULL OR EXISTS (SELECT FROM {{schema}}outbox_message_tags AS t
                                 WHERE t.tag = $2 AND t.message_id = m.id))
AND ($3::timestamptz IS NULL OR m.created_at < $3)
AND ($4::timestamptz IS NULL OR m.created_at >= $4)
AND ($5::text IS NULL OR EXISTS (SELECT FROM unnest({{schema}}outbox_recipient_keys(m.payload)) AS r(a)
                                 WHERE r.a LIKE '%@' || $5))

-- name: count_pending
-- How many pending messages a filter matches, and how many of them a replica holds now.
-- $1 kind (text), $2 tag (text), $3 created_before (timestamptz), $4 created_after
-- (timestamptz), $5 recipient_domain (text): the filter (`pending_filter`), each null for any.
-- Index: outbox_messages_due_idx (pending), one walk.
SELECT count(*) AS matching,
       count(*) FILTER (WHERE m.claim_token IS NOT NULL AND m.locked_until > now()) AS in_flight
FROM {{schema}}outbox_messages AS m
WHERE {{pending_filter}}

-- fragment: cancel_effects
-- What follows from the rows `changed` (id, in_flight) a bulk withdrawal changed: each
-- one's timeline event, and a callback for each that ended. The argument is the parameter
-- that says who withdrew them.
events AS (
    INSERT INTO {{schema}}outbox_message_events (message_id, event, actor)
    SELECT id, CASE WHEN in_flight THEN 'cancel_requested' /* word: event.cancel_requested */
                    ELSE 'cancelled' /* word: action.cancelled */ END, {{argument}}
    FROM changed
), callbacks AS (
    INSERT INTO {{schema}}outbox_callbacks (message_id, event, detail)
    SELECT id, 'message.cancelled' /* word: callback.cancelled */, {{argument}}
    FROM changed WHERE NOT in_flight AND {{callbacks_on}}
)

-- name: cancel_pending
-- Cancels the next batch of pending messages a filter matches, in due order after the
-- keyset ($7, $8): those no replica holds end with end_reason 'cancelled'; those a replica
-- holds are marked, as `outbox_cancel_id` marks them. Rows another transaction has locked
-- are skipped (the caller's next pass takes them). A cancelled message's secret fields
-- are scrubbed. Returns the batch's last key and counts.
-- $1 kind (text), $2 tag (text), $3 created_before (timestamptz), $4 created_after
-- (timestamptz), $5 recipient_domain (text): the filter (`pending_filter`), each null for any.
-- $6 batch (bigint): the most rows a statement changes. $7 after due
-- (timestamptz, null from the start), $8 after id (bigint). $9 who (text).
-- Index: outbox_messages_due_idx (pending), walked from the keyset on.
WITH batch AS MATERIALIZED (
    SELECT m.id, m.next_attempt_at,
           m.claim_token IS NOT NULL AND m.locked_until > now() AS in_flight
    FROM {{schema}}outbox_messages AS m
    WHERE {{pending_filter}}
      AND ($7::timestamptz IS NULL OR (m.next_attempt_at, m.id) > ($7, $8))
      AND m.cancel_requested_at IS NULL
    ORDER BY m.next_attempt_at, m.id
    LIMIT $6
    FOR NO KEY UPDATE OF m SKIP LOCKED
), changed AS (
    UPDATE {{schema}}outbox_messages AS m
    SET cancel_requested_at = now(), cancelled_by = $9,
        dead_lettered_at = CASE WHEN b.in_flight THEN NULL ELSE now() END,
        end_reason = CASE WHEN b.in_flight THEN NULL ELSE 'cancelled' /* word: action.cancelled */ END,
        discarded_at = CASE WHEN b.in_flight THEN NULL ELSE now() END,
        discarded_by = CASE WHEN b.in_flight THEN NULL ELSE $9 END,
        locked_until = CASE WHEN b.in_flight THEN m.locked_until END,
        locked_by = CASE WHEN b.in_flight THEN m.locked_by END,
        claim_token = CASE WHEN b.in_flight THEN m.claim_token END,
        payload = CASE WHEN NOT b.in_flight AND {{has_secrets(m)}} THEN {{masked_payload(m)}}
                       ELSE m.payload END,
        secrets_scrubbed_at = CASE WHEN NOT b.in_flight AND {{has_secrets(m)}} THEN now() END
    FROM batch AS b
    WHERE m.id = b.id
    RETURNING m.id, b.in_flight
), {{cancel_effects($9)}}
SELECT (SELECT next_attempt_at FROM batch ORDER BY next_attempt_at DESC, id DESC LIMIT 1) AS last_due,
       (SELECT id FROM batch ORDER BY next_attempt_at DESC, id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM batch) AS scanned,
       (SELECT count(*) FROM changed WHERE NOT in_flight) AS cancelled,
       (SELECT count(*) FROM changed WHERE in_flight) AS in_flight
