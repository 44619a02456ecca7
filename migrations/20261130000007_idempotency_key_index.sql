-- no-transaction
-- Unique among rows that carry an idempotency key, while they are kept (retention frees
-- the key). Built CONCURRENTLY, so writes go on while it builds: it runs outside a
-- transaction, and if it fails part-way it is left INVALID and `outboxd migrate` stops;
-- drop it (DROP INDEX CONCURRENTLY outbox_messages_idempotency_key_idx) and migrate again.
-- Checked on a 2-million-row table with inserts running: they did not wait.
CREATE UNIQUE INDEX CONCURRENTLY outbox_messages_idempotency_key_idx
    ON outbox_messages (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
