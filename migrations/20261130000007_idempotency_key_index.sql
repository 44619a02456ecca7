-- no-transaction
-- Unique among rows that carry an idempotency key, while they are kept (retention frees
-- the key). Built CONCURRENTLY, so writes go on while it builds: it runs outside a
-- transaction, and if it fails part-way it is left INVALID and `outboxd migrate` stops;
-- drop it (DROP INDEX CONCURRENTLY outbox_messages_idempotency_key_idx) and migrate again.
-- Checked with 6 (its comment has the figures): the inserts running did not wait. It does
-- wait for transactions older than itself to end (without blocking anyone meanwhile): run
-- `outboxd migrate` when no transaction has been left open for long.
CREATE UNIQUE INDEX CONCURRENTLY outbox_messages_idempotency_key_idx
    ON outbox_messages (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
