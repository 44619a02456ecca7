-- Withdraws the message of an id, in the caller's transaction (`outbox_cancel_id`,
-- migration 30): `cancelled`, `in_flight`, `sent`, `ended` or `not_found`.
-- $1 id (bigint), $2 who (text, null for the session's role).
-- Index: outbox_messages_pkey (in the function).
SELECT {{schema}}outbox_cancel_id($1, $2)
