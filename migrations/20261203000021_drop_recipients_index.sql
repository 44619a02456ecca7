-- no-transaction
-- Migration 17's index, which the two before this one replace. Dropped CONCURRENTLY: it
-- waits for transactions using it to end, without blocking writes. A replica older than
-- this release looks recipients up without an index (a walk of the ended rows: seconds on
-- millions) until it is upgraded; the lookup is an operator's, and nothing else reads it.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_recipients_idx;
