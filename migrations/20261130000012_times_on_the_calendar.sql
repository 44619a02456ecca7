-- The times a producer writes must be dates of years 1 to 9999. A row with 'infinity', or
-- a year past 262142, in created_at, not_before, next_attempt_at or expires_at could not be
-- read back: the driver panicked decoding it, so every claim that took the row failed and
-- nothing else was sent; '-infinity' also broke the gauges' query (infinite timestamps
-- cannot be subtracted). A message that never expires has expires_at NULL.
--
-- Safe on a live table of millions of rows: the CHECK constraints are added NOT VALID, so
-- nothing scans the table while the brief ACCESS EXCLUSIVE lock is held; they hold for
-- every row inserted or updated from now on. Rows written before are not checked here (an
-- operator can check them without blocking writes: README, *Operations*). The lock timeout
-- makes the migration give up after 2 s, to be run again, rather than queue behind a long
-- transaction and block the application's inserts for longer than that.
-- Checked on a 2-million-row table (437 MB) taking 4 000 inserts a second: the migration
-- took 0.11 s, and the inserts around it took 0.23 ms (median) and 3.5 ms at most; with a
-- transaction that had read the table left open, it gave up after the 2 s timeout and
-- changed nothing.
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages
    ADD CONSTRAINT outbox_messages_created_at_on_the_calendar
        CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_not_before_on_the_calendar
        CHECK (not_before BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_next_attempt_at_on_the_calendar
        CHECK (next_attempt_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_expires_at_on_the_calendar
        CHECK (expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID;
