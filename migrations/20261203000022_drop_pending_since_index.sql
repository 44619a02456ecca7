-- no-transaction
-- The oldest-pending gauge's own index (migration 9) goes: the sample reads the same
-- figure from its walk of every pending row per kind (`store::sample`, which it made
-- anyway), so the index only cost each message two entries, one when it was inserted and
-- one when it was claimed, 130 B of WAL and their CPU (bench/run.py dbcost). Dropped
-- CONCURRENTLY: it waits for transactions using it to end, without blocking writes. A
-- replica older than this release reads the gauge from the due index, as the sample's
-- other figures, until it is upgraded.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_pending_since_idx;
