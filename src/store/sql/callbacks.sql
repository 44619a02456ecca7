-- Delivery callbacks (migration 31): switched on and off with the configuration, claimed a
-- batch at a time in order per message, and their sends recorded. `src/callbacks/` sends
-- them.

-- fragment: callback_unsent
-- A callback still to send: the due indexes' predicate, of the callback named by the
-- argument.
{{argument}}.failed_at IS NULL

-- fragment: callbacks_on
-- Whether outcomes keep callbacks (`set_callbacks`).
(SELECT callbacks FROM {{schema}}outbox_installation)

-- name: callbacks_switched
-- Whether outcomes keep callbacks now.
-- No parameters.
-- Index: none; the table holds one row.
SELECT callbacks FROM {{schema}}outbox_installation

-- name: set_callbacks
-- Whether outcomes keep callbacks, as this replica's configuration says
-- (OUTBOXD_CALLBACK_URL); read by every statement that records an outcome.
-- $1 on (bool)
-- Index: none; the table holds one row.
UPDATE {{schema}}outbox_installation SET callbacks = $1 WHERE callbacks IS DISTINCT FROM $1

-- name: claim_callbacks
-- The next callbacks due, each the oldest not yet sent of its message (a later one waits
-- for it), leased for $2 seconds; with what the callback says of its message (which
-- retention may have deleted: then only its id).
-- $1 limit (bigint), $2 lease (float8 seconds)
-- Index: outbox_callbacks_due_idx; outbox_callbacks_message_idx for the order per message;
-- outbox_messages_pkey.
WITH candidates AS MATERIALIZED (
    -- The first due in order, by the index alone: the check of each message's order, which
    -- reads another index entry, runs on these few, not on every row due.
    SELECT c.id, c.message_id FROM {{schema}}outbox_callbacks AS c
    WHERE {{callback_unsent(c)}} AND c.next_attempt_at <= now()
      AND (c.locked_until IS NULL OR c.locked_until <= now())
    ORDER BY c.next_attempt_at, c.id
    LIMIT $1
), due AS (
    SELECT c.id FROM {{schema}}outbox_callbacks AS c JOIN candidates AS k ON k.id = c.id
    -- A subquery, not NOT EXISTS: a scalar subquery runs per row with the message id bound,
    -- so it reads one index entry whatever the statistics (on a table never analysed, the
    -- anti join walked the whole index for each row: a second a claim).
    WHERE c.id = (SELECT min(e.id) FROM {{schema}}outbox_callbacks AS e
                  WHERE e.message_id = k.message_id AND {{callback_unsent(e)}})
    FOR UPDATE OF c SKIP LOCKED
), leased AS (
    UPDATE {{schema}}outbox_callbacks AS c
    SET locked_until = now() + make_interval(secs => $2)
    FROM due WHERE c.id = due.id
    RETURNING c.id, c.message_id, c.event, c.at, c.detail, c.attempts
)
SELECT l.id, l.message_id, l.event, l.at, l.detail, l.attempts,
       m.kind, m.idempotency_key, coalesce(m.tags, '{}') AS tags
FROM leased AS l LEFT JOIN {{schema}}outbox_messages AS m ON m.id = l.message_id
ORDER BY l.id

-- name: callbacks_delivered
-- The callbacks the endpoint took: deleted, which costs less than marking them (no new
-- index entries).
-- $1 ids (bigint[])
-- Index: outbox_callbacks_pkey.
DELETE FROM {{schema}}outbox_callbacks WHERE id = ANY($1)

-- name: callback_failed
-- A send that failed: tried again after $3 seconds, or given up on once the callback is
-- older than $4 seconds (then kept, failed, for an operator). Returns whether it was given
-- up on.
-- $1 id (bigint), $2 error (text), $3 delay (float8 seconds), $4 max_age (float8 seconds)
-- Index: outbox_callbacks_pkey.
UPDATE {{schema}}outbox_callbacks
SET attempts = least(attempts, 2147483646) + 1, last_error = left($2, 500),
    next_attempt_at = now() + make_interval(secs => $3), locked_until = NULL,
    failed_at = CASE WHEN at < now() - make_interval(secs => $4) THEN now() END
WHERE id = $1
RETURNING failed_at IS NOT NULL AS given_up

-- name: sample_callbacks
-- The callbacks still to send, and how long the oldest has waited since its event.
-- No parameters.
-- Index: outbox_callbacks_due_idx (its predicate).
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(at)), 0)::float8 AS oldest_age
FROM {{schema}}outbox_callbacks AS c WHERE {{callback_unsent(c)}}

-- name: prune_callbacks
-- Deletes up to $2 callbacks given up on whose event is older than $1 seconds.
-- $1 older_than (float8 seconds), $2 limit (bigint)
-- Index: outbox_callbacks_failed_idx.
DELETE FROM {{schema}}outbox_callbacks WHERE id IN (
    SELECT id FROM {{schema}}outbox_callbacks
    WHERE failed_at IS NOT NULL AND at < now() - make_interval(secs => $1)
    ORDER BY at LIMIT $2)
