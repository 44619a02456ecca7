-- Withdraws the message enqueued with a key, in the caller's transaction
-- (`outbox_cancel`, migration 30): `cancelled`, `in_flight`, `sent`, `ended` or `not_found`.
-- $1 key (text), $2 who (text, null for the session's role): written on the timeline.
-- Index: outbox_messages_idempotency_key_idx (in the function).
SELECT {{schema}}outbox_cancel($1, $2)
