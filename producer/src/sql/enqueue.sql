-- The insert of one message, with `enqueue`. With a key, a second insert of it does
-- nothing and the first row's id comes back. When another transaction inserted the same key
-- and committed while this one waited for it, the row is newer than this statement's
-- snapshot and neither part returns it: the caller is told to retry (`KeyInFlight`).
-- $1 kind (text), $2 payload (jsonb), $3 not_before (timestamptz, null for now),
-- $4 traceparent (text), $5 priority (smallint), $6 expires_at (timestamptz),
-- $7 idempotency_key (text), $8 tags (text[], null for none), $9 secret_fields (text[], null
-- for none: the kind's own still apply)
-- Index: outbox_messages_idempotency_key_idx (unique, partial: the key is not null), which the
-- ON CONFLICT names by its predicate and the second part reads.
WITH inserted AS (
    INSERT INTO {{schema}}outbox_messages
        (kind, payload, not_before, traceparent, priority, expires_at, idempotency_key, tags,
         secret_fields)
    VALUES ($1, $2, coalesce($3, now()), $4, $5, $6, $7, $8, $9)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id FROM inserted
UNION ALL
SELECT id FROM {{schema}}outbox_messages
WHERE idempotency_key = $7 AND NOT EXISTS (SELECT FROM inserted)
