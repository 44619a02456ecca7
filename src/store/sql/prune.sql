-- Retention: rows dispatched (or discarded) before a cutoff are deleted, oldest first, in
-- small batches, with their timelines' events. Rows another transaction holds are skipped,
-- so the pruner never waits on the dispatcher.
-- $1 cutoff (timestamptz), $2 limit (bigint): the most rows one batch deletes.

-- name: prune_dispatched
-- Index: outbox_messages_dispatched_idx; outbox_message_events_message_idx.
WITH doomed AS (
    SELECT id FROM {{schema}}outbox_messages WHERE dispatched_at < $1
    ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM {{schema}}outbox_message_events WHERE message_id IN (SELECT id FROM doomed)
)
DELETE FROM {{schema}}outbox_messages AS m USING doomed WHERE m.id = doomed.id

-- name: prune_discarded
-- Index: outbox_messages_discarded_idx; outbox_message_events_message_idx.
WITH doomed AS (
    SELECT id FROM {{schema}}outbox_messages WHERE discarded_at < $1
    ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM {{schema}}outbox_message_events WHERE message_id IN (SELECT id FROM doomed)
)
DELETE FROM {{schema}}outbox_messages AS m USING doomed WHERE m.id = doomed.id
