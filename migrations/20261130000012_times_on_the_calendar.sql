-- The times a producer writes must be dates of years 1 to 9999. A row with 'infinity', or
-- a year past 262142, in created_at, not_before, next_attempt_at or expires_at could not be
-- read back: the driver panicked decoding it, so every claim that took the row failed and
-- nothing else was sent; '-infinity' also broke the gauges' query (infinite timestamps
-- cannot be subtracted). A message that never expires has expires_at NULL.
--
-- Safe on a live table of millions of rows: the CHECK constraints are added NOT VALID, so
-- nothing scans the table while the brief ACCESS EXCLUSIVE lock is held; they hold for
-- every row inserted or updated from now on. A row written before is not checked here;
-- outboxd reads its times through outbox_on_the_calendar() and writes them back moved into
-- the range whenever it updates the row, which must pass the CHECKs (README, *Operations
-- notes*, gives the repair of all such rows and the VALIDATE statements). The lock timeout makes the migration
-- give up after 2 s, to be run again, rather than queue behind a long transaction and
-- block the application's inserts for longer than that.
-- Checked on a 2-million-row table (437 MB) taking about 4 000 inserts a second, twice:
-- the migration took 0.11 s, and the inserts around it took 0.22 to 0.23 ms (median) and
-- 3.5 to 8 ms at most; with a transaction that had read the table left open, it gave up
-- after the 2 s timeout and changed nothing.
SET LOCAL lock_timeout = '2s';

-- The range's one definition on the database's side (the CHECKs below spell it out, as a
-- CHECK must not depend on a function that can be replaced): a time moved into it; NULL
-- stays NULL (which greatest() alone would not do). One expression, not STRICT: PostgreSQL
-- inlines it into each statement rather than calling a function per row.
CREATE OR REPLACE FUNCTION outbox_on_the_calendar(t timestamptz) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN t IS NULL THEN NULL
                      ELSE least(greatest(t, '0001-01-01 00:00:00+00'::timestamptz),
                                 '9999-12-31 23:59:59.999999+00'::timestamptz) END $$;

ALTER TABLE outbox_messages
    ADD CONSTRAINT outbox_messages_created_at_on_the_calendar
        CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_not_before_on_the_calendar
        CHECK (not_before BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_next_attempt_at_on_the_calendar
        CHECK (next_attempt_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT outbox_messages_expires_at_on_the_calendar
        CHECK (expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID;
