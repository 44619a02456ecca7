-- no-transaction
-- Migration 17's index, which the two before this one replace. Dropped CONCURRENTLY: it
-- waits for transactions using it to end, without blocking writes.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_recipients_idx;
