-- Dispatchers scan the due index from a floor instead of from its start: under a
-- transaction held open elsewhere, the entries of rows already sent cannot be removed, and
-- a scan from the start would walk all of them. A row may commit with a next_attempt_at
-- below a dispatcher's floor (a long producer transaction, or a not_before in the past), so
-- the insert trigger now tells dispatchers the due time of each row it inserts, in whole
-- milliseconds since the epoch; they lower their floor to it. Identical payloads fold into
-- one notification per transaction (a multi-row INSERT shares one now()).
--
-- Safe on a live table: CREATE OR REPLACE FUNCTION takes no lock on outbox_messages, and
-- the triggers themselves are unchanged. Checked with a 2-million-row table and a
-- transaction holding ROW EXCLUSIVE on it (an open INSERT): the migration did not wait.
CREATE OR REPLACE FUNCTION outbox_messages_set_next_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.next_attempt_at := coalesce(NEW.next_attempt_at, NEW.not_before);
    -- An infinite time (never, or always due) has no number: tell dispatchers to rescan.
    PERFORM pg_notify('outbox_messages',
        CASE WHEN isfinite(NEW.next_attempt_at)
             THEN floor(extract(epoch FROM NEW.next_attempt_at) * 1000)::bigint::text
             ELSE '' END);
    RETURN NEW;
END
$$;

-- The per-statement notification (with no payload) would tell dispatchers nothing the
-- per-row one does not, and would make them rescan from the start: it stays a no-op, so
-- that dropping the trigger needs no lock on a live table.
CREATE OR REPLACE FUNCTION outbox_messages_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;
