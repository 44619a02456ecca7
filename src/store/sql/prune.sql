-- Retention: rows dispatched (or discarded) before a cutoff are deleted, oldest first, in
-- small batches, with their timelines' events and their tags. Rows another transaction holds are skipped,
-- so the pruner never waits on the dispatcher.
-- $1 cutoff (timestamptz), $2 limit (bigint): the most rows one batch deletes.

-- fragment: prune_by
-- The delete of rows whose `{{argument}}` is before the cutoff, by that column's index.
WITH doomed AS (
    SELECT id FROM {{schema}}outbox_messages WHERE {{argument}} < $1
    ORDER BY {{argument}} LIMIT $2 FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM {{schema}}outbox_message_events WHERE message_id IN (SELECT id FROM doomed)
), tags AS (
    DELETE FROM {{schema}}outbox_message_tags WHERE message_id IN (SELECT id FROM doomed)
)
DELETE FROM {{schema}}outbox_messages AS m USING doomed WHERE m.id = doomed.id

-- name: prune_dispatched
-- Index: outbox_messages_dispatched_idx; outbox_message_events_message_idx;
-- outbox_message_tags_message_idx.
{{prune_by(dispatched_at)}}

-- name: prune_discarded
-- Index: outbox_messages_discarded_idx; outbox_message_events_message_idx;
-- outbox_message_tags_message_idx.
{{prune_by(discarded_at)}}
