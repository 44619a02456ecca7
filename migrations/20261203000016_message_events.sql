-- Each message's timeline: what happened to it besides being enqueued and accepted at once.
--
-- outbox_message_events is a new, empty table. outbox_messages gains three nullable
-- columns with no default, which change the catalog only (no rewrite, no scan); their
-- ACCESS EXCLUSIVE lock is brief, and the lock timeout makes the migration give up after
-- 2 s, to be run again, rather than queue behind a long transaction (and every insert
-- behind it). The function is new. Checked on a table of 2 million sent rows with a
-- session inserting 200 rows a second: this migration and the next (the index build)
-- took 47 s together while the inserts went on (p50 2.0 ms, p99 8.9 ms, the slowest
-- 376 ms, on a 2-core machine the build kept busy); with a transaction that had read the
-- table left open, it gave up after 2.1 s and changed nothing.
SET LOCAL lock_timeout = '2s';

-- The relay's reply when it accepted the message (`250 2.0.0 Ok: queued as 4XyZ`: the
-- queue id is the key a provider's support looks up), which replica sent it and how long
-- the send took. On the row, not in the events: most messages are accepted at once, and
-- an event row each would write more than the rest of the send does.
ALTER TABLE outbox_messages
    ADD COLUMN smtp_reply text,
    ADD COLUMN sent_by    text,
    ADD COLUMN send_ms    integer;

-- One row per thing that happened to a message that is not on its row: an attempt that
-- failed (retry, dead), a release (unreachable, throttled, not started, abandoned), an
-- expiry or suppression, a bounce or complaint a provider reported, an operator's retry
-- or discard. Written by the statements that record those (no round trip of its own),
-- deleted with its message by retention. No foreign key: retention deletes both in one
-- statement, and a producer's DELETE of a message must not fail or cascade a lock.
CREATE TABLE outbox_message_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  bigint      NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    -- What happened: an outcome's action, a feedback mark, or an operator's action.
    event       text        NOT NULL CHECK (length(event) BETWEEN 1 AND 40),
    -- Who: the replica's worker id, the provider, or the operator.
    actor       text,
    -- The failure's short name (smtp_451, unreachable, throttled, ...).
    error_class text,
    -- The relay's reply or the error, the provider's diagnostic, the operator's note.
    detail      text,
    -- How long the send took, when there was one.
    duration_ms integer
);

CREATE INDEX outbox_message_events_message_idx
    ON outbox_message_events (message_id, at);

COMMENT ON TABLE outbox_message_events IS
    'Each outbox message''s timeline beyond its row: failed attempts, releases, feedback, operators'' actions. Written by outboxd.';

-- A message's envelope addresses (the strings of `to`, `cc` and `bcc`), each reduced to
-- the part between `<` and `>` when there is one, trimmed, ASCII letters lower-cased: the
-- rule the claim reads addresses by, and the one the recipient lookup searches with (its
-- index is the next migration). Never fails, whatever a payload holds.
-- A plain SQL body (not SQL-standard RETURN, which needs PostgreSQL 14); its subquery keeps
-- PostgreSQL from inlining it, so each call costs about 5 µs.
CREATE FUNCTION outbox_recipient_keys(payload jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT ARRAY(
        SELECT translate(btrim(CASE WHEN strpos(a, '<') > 0
                                    THEN coalesce(substring(a FROM '<([^<>]*)>[[:space:]]*$'), a)
                                    ELSE a END),
                         'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
        FROM jsonb_array_elements_text(
                 jsonb_path_query_array(payload, '$.to[*] ? (@.type() == "string")')
                 || jsonb_path_query_array(payload, '$.cc[*] ? (@.type() == "string")')
                 || jsonb_path_query_array(payload, '$.bcc[*] ? (@.type() == "string")')) AS e(a)
    )
    $$;
