-- The share of sends the relay refuses whatever the pace, which the replicas learn and
-- share with the pace itself (src/dispatch/pace/replies.rs): refusals up to it do not cut
-- the pace. A column with a constant default on a table of one row per schedule: a
-- catalog change under a brief lock, and the lock timeout makes the migration give up
-- after 2 s, to be run again, rather than queue behind a transaction that holds the row.
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_send_rate
    ADD COLUMN tolerated_share float8 NOT NULL DEFAULT 0
        CHECK (tolerated_share >= 0 AND tolerated_share < 1);
