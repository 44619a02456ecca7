-- Enqueues, or replaces the still-pending message of the same key, the latest winning
-- (`outbox_replace`, migration 30): `enqueued`, `replaced`, or what stopped it
-- (`in_flight`, `sent`, `ended`).
-- $1 kind (text), $2 payload (jsonb), $3 key (text), $4 not_before (timestamptz, null for
-- now), $5 expires_at (timestamptz), $6 priority (smallint), $7 tags (text[], null for
-- none), $8 traceparent (text).
-- Index: outbox_messages_idempotency_key_idx (in the function).
SELECT id, result FROM {{schema}}outbox_replace($1, $2, $3, $4, $5, $6, $7, $8)
