-- no-transaction
-- Due messages with a priority, few among many: the claim looks at them first. Built
-- CONCURRENTLY, as the idempotency key's index (same recovery if it fails part-way).
CREATE INDEX CONCURRENTLY outbox_messages_priority_due_idx
    ON outbox_messages (next_attempt_at, id)
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND priority > 0;
