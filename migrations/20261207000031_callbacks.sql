-- Delivery callbacks to the application (OUTBOXD_CALLBACK_URL): each message's terminal
-- events (`message.sent`, `message.dead_lettered`, `message.bounced`, `message.complained`,
-- `message.suppressed`, `message.expired`, `message.cancelled`), kept in a table of their
-- own by the statement that records the outcome (no round trip of its own, and a crash
-- loses none), then POSTed, signed per the Standard Webhooks specification, in order per
-- message, by every replica's callback sender (src/callbacks/). Docs:
-- docs/src/callbacks.md.
--
-- `outbox_installation.callbacks` says whether they are kept at all: `outboxd run` sets it
-- from its configuration at start, and every statement that records an outcome, a
-- provider's report or a producer's cancel reads it, so that a database whose replicas
-- send no callbacks fills no table.
--
-- A new table; a column with a constant default on a table of one row; a grant copied from
-- the events table, so that a role that records outcomes (and inserts their events) may
-- insert their callbacks. Nothing existing is rewritten, and no lock is taken on
-- outbox_messages (checked as migration 23 was: it completes while another session holds
-- an ACCESS EXCLUSIVE lock on outbox_messages, tests/it/migrations.rs).
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_installation ADD COLUMN callbacks boolean NOT NULL DEFAULT false;

CREATE TABLE outbox_callbacks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      bigint      NOT NULL,
    -- The event type, as the callback's `type` says it.
    event           text        NOT NULL CHECK (event IN (
                        'message.sent', 'message.dead_lettered', 'message.bounced',
                        'message.complained', 'message.suppressed', 'message.expired',
                        'message.cancelled')),
    -- When it happened.
    at              timestamptz NOT NULL DEFAULT now(),
    -- The relay's reply to a send, the error of a dead letter, a provider's diagnostic.
    detail          text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    -- The sender holding it now, until then: not indexed, so that the lease is a HOT
    -- update (the table leaves room in each page for it).
    locked_until    timestamptz,
    -- Given up on after OUTBOXD_CALLBACK_MAX_AGE; kept, and shown, for an operator. A
    -- callback the endpoint took is deleted at once.
    failed_at       timestamptz
) WITH (fillfactor = 70);

-- The callbacks still to send, in due order: the sender's claim and the gauges walk it.
CREATE INDEX outbox_callbacks_due_idx ON outbox_callbacks (next_attempt_at, id)
    WHERE failed_at IS NULL;
-- A message's callbacks still to send, oldest first: a later one waits for the earlier.
CREATE INDEX outbox_callbacks_message_idx ON outbox_callbacks (message_id, id)
    WHERE failed_at IS NULL;
-- Retention deletes failed callbacks by age.
CREATE INDEX outbox_callbacks_failed_idx ON outbox_callbacks (at)
    WHERE failed_at IS NOT NULL;

COMMENT ON TABLE outbox_callbacks IS
    'Terminal events of outbox messages to POST to the application (OUTBOXD_CALLBACK_URL), written with each outcome by outboxd.';

-- Whoever may insert a message's events may insert its callbacks; whoever may read or
-- delete the events (the replicas: retention) may read, update and delete them.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, p.privilege, a.is_grantable
        FROM pg_class AS c,
             aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a,
             LATERAL (SELECT unnest(CASE a.privilege_type
                                        WHEN 'INSERT' THEN ARRAY['INSERT']
                                        WHEN 'DELETE' THEN ARRAY['SELECT', 'UPDATE', 'DELETE']
                                    END) AS privilege) AS p
        WHERE c.oid = 'outbox_message_events'::regclass
          AND a.privilege_type IN ('INSERT', 'DELETE')
          AND a.grantee <> (SELECT relowner FROM pg_class
                            WHERE oid = 'outbox_callbacks'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON outbox_callbacks TO %s%s', g.privilege,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- Whoever may record outcomes (UPDATE on outbox_messages) may switch callbacks on and off.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee
        FROM pg_class AS c,
             aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
        WHERE c.oid = 'outbox_messages'::regclass AND a.privilege_type = 'UPDATE'
          AND a.grantee <> (SELECT relowner FROM pg_class
                            WHERE oid = 'outbox_installation'::regclass)
    LOOP
        EXECUTE format('GRANT UPDATE (callbacks) ON outbox_installation TO %s',
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
    END LOOP;
END
$$;

-- A producer's cancel keeps its callback too (the function of migration 30, with one more
-- statement: CREATE OR REPLACE keeps its owner and grants).
CREATE OR REPLACE FUNCTION outbox_cancel_id(message_id bigint, who text DEFAULT NULL) RETURNS text
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
    INSERT INTO outbox_callbacks (message_id, event, detail)
    SELECT m.id, 'message.cancelled', by_ FROM outbox_installation WHERE callbacks;
    RETURN 'cancelled';
END
$$;
