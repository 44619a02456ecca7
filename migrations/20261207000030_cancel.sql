-- Recall by key or id, in the producer's own transaction: `outbox_cancel(key)` and
-- `outbox_cancel_id(id)` answer what became of the message, and end a pending one with
-- end_reason 'cancelled' (docs/src/producer.md, *Withdrawing and replacing an email*).
--
-- - `cancelled`: it was pending and is ended; rolled back with the caller's transaction, it
--   stays pending and is sent. The row is locked (FOR NO KEY UPDATE) until the caller's
--   transaction ends, and the claim skips locked rows, so no replica takes it meanwhile.
-- - `in_flight`: a replica holds it now (its lease runs): it may be sent. It is marked
--   (`cancel_requested_at`): if that send fails or is given back, it ends as cancelled and is
--   never tried again; a replica that claims it after a crash ends it unsent.
-- - `sent`, `ended` (dead-lettered, expired, suppressed, cancelled before), `not_found`.
--
-- Replace by key, the latest wins: `outbox_replace(kind, payload, key, not_before,
-- expires_at)` enqueues, or, when the key names a message still pending and not held by a
-- replica, replaces its payload, due time and deadline (`replaced`); otherwise it answers
-- what stopped it (`in_flight`, `sent`, `ended`) and changes nothing. A key of another
-- kind is an error. A replacement also takes the new priority and trace context; the tags
-- stay those of the first insert (the insert trigger keeps them). Concurrent calls queue on the key's index entry, as inserts do. The
-- insert trigger tells the dispatchers the new due time, as for a new row.
--
-- The functions run as their owner (SECURITY DEFINER, with the search_path of the migration
-- fixed on them), so that an application's role needs only EXECUTE on them (granted by the
-- operator: docs/src/deployment.md); PUBLIC may not run them. `who` is written on the
-- timeline (the session's role when null).
--
-- Two nullable columns with no default and a CHECK replaced NOT VALID: catalog changes
-- only, no rewrite and no scan. The ACCESS EXCLUSIVE lock is brief and bounded by
-- lock_timeout: behind a long transaction the migration gives up after 2 s, to be run
-- again (tests/it/migrations.rs checks this of every migration on a live table).
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancelled_by        text;

ALTER TABLE outbox_messages
    DROP CONSTRAINT outbox_messages_end_reason_check,
    ADD CONSTRAINT outbox_messages_end_reason_check
        CHECK (end_reason IS NULL OR (end_reason IN ('expired', 'suppressed', 'logged_only',
                                                     'cancelled')
                                      AND dead_lettered_at IS NOT NULL)) NOT VALID;

CREATE FUNCTION outbox_cancel_id(message_id bigint, who text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    m   record;
    by_ text := left(coalesce(who, session_user::text), 200);
BEGIN
    SELECT id, dispatched_at, dead_lettered_at, claim_token, locked_until, cancel_requested_at
      INTO m FROM outbox_messages WHERE id = message_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    ELSIF m.dispatched_at IS NOT NULL THEN
        RETURN 'sent';
    ELSIF m.dead_lettered_at IS NOT NULL THEN
        RETURN 'ended';
    ELSIF m.claim_token IS NOT NULL AND m.locked_until > now() THEN
        IF m.cancel_requested_at IS NULL THEN
            UPDATE outbox_messages SET cancel_requested_at = now(), cancelled_by = by_
            WHERE id = m.id;
            INSERT INTO outbox_message_events (message_id, event, actor)
            VALUES (m.id, 'cancel_requested', by_);
        END IF;
        RETURN 'in_flight';
    END IF;
    UPDATE outbox_messages
    SET dead_lettered_at = now(), end_reason = 'cancelled', discarded_at = now(),
        discarded_by = by_, cancel_requested_at = now(), cancelled_by = by_,
        locked_until = NULL, locked_by = NULL, claim_token = NULL
    WHERE id = m.id;
    INSERT INTO outbox_message_events (message_id, event, actor) VALUES (m.id, 'cancelled', by_);
    RETURN 'cancelled';
END
$$;

CREATE FUNCTION outbox_cancel(key text, who text DEFAULT NULL) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT coalesce(
        (SELECT outbox_cancel_id(id, who) FROM outbox_messages WHERE idempotency_key = key),
        'not_found')
$$;

CREATE FUNCTION outbox_replace(kind text, payload jsonb, key text,
                               not_before timestamptz DEFAULT NULL,
                               expires_at timestamptz DEFAULT NULL,
                               priority smallint DEFAULT 0, tags text[] DEFAULT NULL,
                               traceparent text DEFAULT NULL, who text DEFAULT NULL)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    by_      text := left(coalesce(who, session_user::text), 200);
    row_id   bigint;
    inserted boolean;
    m        record;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'outbox_replace needs a key: the message it replaces is found by it'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO outbox_messages AS o
        (kind, payload, not_before, expires_at, idempotency_key, priority, tags, traceparent)
    VALUES (outbox_replace.kind, outbox_replace.payload,
            coalesce(outbox_replace.not_before, now()), outbox_replace.expires_at,
            outbox_replace.key, coalesce(outbox_replace.priority, 0), outbox_replace.tags,
            outbox_replace.traceparent)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO UPDATE
    SET payload = excluded.payload, not_before = excluded.not_before,
        next_attempt_at = excluded.not_before, expires_at = excluded.expires_at,
        priority = excluded.priority, traceparent = excluded.traceparent
    WHERE o.kind = excluded.kind AND o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
      AND o.cancel_requested_at IS NULL AND (o.claim_token IS NULL OR o.locked_until <= now())
    RETURNING o.id, o.xmax = 0 INTO row_id, inserted;
    IF row_id IS NOT NULL THEN
        IF NOT inserted THEN
            INSERT INTO outbox_message_events (message_id, event, actor)
            VALUES (row_id, 'replaced', by_);
        END IF;
        RETURN QUERY SELECT row_id, CASE WHEN inserted THEN 'enqueued' ELSE 'replaced' END;
        RETURN;
    END IF;
    SELECT o.id, o.kind, o.dispatched_at, o.dead_lettered_at INTO m
    FROM outbox_messages AS o WHERE o.idempotency_key = outbox_replace.key;
    IF m.kind <> outbox_replace.kind THEN
        RAISE EXCEPTION 'outbox_replace: key % belongs to a message of kind %, not %',
            outbox_replace.key, m.kind, outbox_replace.kind
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN QUERY SELECT m.id, CASE WHEN m.dispatched_at IS NOT NULL THEN 'sent'
                                   WHEN m.dead_lettered_at IS NOT NULL THEN 'ended'
                                   ELSE 'in_flight' END;
END
$$;

REVOKE ALL ON FUNCTION outbox_replace(text, jsonb, text, timestamptz, timestamptz, smallint,
                                      text[], text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_cancel_id(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_cancel(text, text) FROM PUBLIC;
