-- no-transaction
-- Replaced by outbox_messages_pending_since_idx (see the migration before). DROP INDEX
-- CONCURRENTLY takes no lock that blocks reads or writes.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_pending_due_since_idx;
