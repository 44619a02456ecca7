-- What a payload carries (docs/src/payloads.md): secret fields, scrubbed when their
-- message ends; payloads kept for less time than their rows, per kind; erasure by
-- recipient, which leaves a one-way mark where the address was; and which admin token
-- made each change.
--
-- * `outbox_kind_policies`: each kind's secret fields and payload retention, as its
--   `kind.toml` says them. `outboxd run` writes it at start, so that every statement that
--   ends a message (outboxd's, and a producer's `outbox_cancel`) scrubs the same fields,
--   and every reader masks them, whichever program reads.
-- * `outbox_messages.secret_fields`: more secret fields, one message's (its producer's).
-- * `outbox_messages.secrets_scrubbed_at`: when a message with secret fields ended and
--   they were scrubbed (it cannot be retried: its payload is no longer what was sent).
-- * `outbox_messages.payload_removed_at`: when retention or an erasure removed the payload
--   (what is left: its recipient lists, an erased address marked).
-- * `outbox_masked(payload, fields)`: the payload with each field's value "[secret]".
-- * `outbox_erasure_mark(key)`: an address's one-way mark, keyed by this installation's
--   own salt (`outbox_installation.erasure_salt`), so that a mark cannot be matched
--   against a list of addresses hashed elsewhere.
-- * `outbox_installation.marked_suppressions`: whether some suppression list entry is a
--   mark, which the claim then honours (it costs the claim nothing until then).
-- * `outbox_admin_audit.token`: the name of the admin token that made a change.
--
-- Safe on a live table of millions of rows: the columns of outbox_messages have no
-- default, so adding them rewrites nothing; the CHECK is added NOT VALID (nothing is
-- scanned: every existing row holds NULL); the one-row installation table's rewrite (its
-- new column's default is volatile) takes no time. Checked as migration 23 was: it
-- completes on a table of a million rows in milliseconds, and tests/it/migrations.rs runs
-- it while another session holds a row lock on outbox_messages.
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages
    ADD COLUMN secret_fields text[],
    ADD COLUMN secrets_scrubbed_at timestamptz,
    ADD COLUMN payload_removed_at timestamptz,
    -- At most 32 fields, each a dotted path of up to 8 names of 1 to 64 of A-Z a-z 0-9 _ -.
    ADD CONSTRAINT outbox_messages_secret_fields_check CHECK (
        secret_fields IS NULL OR (
            array_ndims(secret_fields) = 1
            AND cardinality(secret_fields) BETWEEN 1 AND 32
            AND array_position(secret_fields, NULL) IS NULL
            AND array_to_string(secret_fields, ',')
                ~ '^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}(,[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7})*$'
            AND cardinality(regexp_split_to_array(array_to_string(secret_fields, ','), ','))
                = cardinality(secret_fields)
        )) NOT VALID;

COMMENT ON COLUMN outbox_messages.secret_fields IS
    'Payload fields (dotted paths, at most 32) never shown and scrubbed when the message ends, besides its kind''s (outbox_kind_policies).';

CREATE TABLE outbox_kind_policies (
    kind              text        PRIMARY KEY CHECK (kind <> '' AND length(kind) <= 100),
    secret_fields     text[]      NOT NULL DEFAULT '{}' CHECK (
        array_ndims(secret_fields) IS NULL OR (
            array_ndims(secret_fields) = 1
            AND cardinality(secret_fields) <= 32
            AND array_position(secret_fields, NULL) IS NULL
            AND array_to_string(secret_fields, ',')
                ~ '^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}(,[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7})*$'
            AND cardinality(regexp_split_to_array(array_to_string(secret_fields, ','), ','))
                = cardinality(secret_fields))),
    -- How long after its message ends a payload is kept; NULL: as long as the row.
    payload_retention interval    CHECK (payload_retention > interval '0'),
    -- Payload retention's progress: messages that ended before this are done.
    payload_swept_until timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE outbox_kind_policies IS
    'Each kind''s secret payload fields and payload retention, as its kind.toml says; written by outboxd run at start.';

-- The payload with the value of each field that is there replaced by "[secret]": a
-- field's presence is kept, its value never shown. A name that is a number picks an
-- array's element; a path that does not lead to a value changes nothing.
CREATE FUNCTION outbox_masked(payload jsonb, fields text[]) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    field text;
    path  text[];
BEGIN
    IF payload IS NULL OR fields IS NULL THEN
        RETURN payload;
    END IF;
    FOREACH field IN ARRAY fields LOOP
        path := string_to_array(field, '.');
        IF payload #> path IS NOT NULL THEN
            payload := jsonb_set(payload, path, '"[secret]"');
        END IF;
    END LOOP;
    RETURN payload;
END
$$;

-- A message's secret fields: its kind's and its own.
CREATE FUNCTION outbox_secret_fields_of(kind text, own text[]) RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE SET search_path FROM CURRENT
    AS $$
    SELECT coalesce(own, '{}')
           || coalesce((SELECT p.secret_fields FROM outbox_kind_policies AS p
                        WHERE p.kind = outbox_secret_fields_of.kind), '{}')
    $$;

ALTER TABLE outbox_installation
    ADD COLUMN erasure_salt bytea NOT NULL
        DEFAULT sha256(convert_to(gen_random_uuid()::text || clock_timestamp()::text, 'UTF8')),
    ADD COLUMN marked_suppressions boolean NOT NULL DEFAULT false;

-- An address's one-way mark: `erased-<32 hex>@erased.invalid` (a name that can never be
-- mailed: RFC 2606 reserves .invalid). `key` is the address as the claim reads it
-- (outbox_recipient_keys' rule: the part in <>, trimmed, ASCII lower-cased).
CREATE FUNCTION outbox_erasure_mark(key text) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE SET search_path FROM CURRENT
    AS $$
    SELECT 'erased-' || left(encode(sha256(i.erasure_salt || convert_to(key, 'UTF8')), 'hex'), 32)
           || '@erased.invalid'
    FROM outbox_installation AS i
    $$;

ALTER TABLE outbox_admin_audit ADD COLUMN token text;

COMMENT ON COLUMN outbox_admin_audit.token IS
    'The name of the admin token that made the change (OUTBOXD_ADMIN_TOKEN_NAME and a fingerprint); NULL for the CLI and outboxd itself.';

-- Everyone may read the policies (field names and durations, no secret): every reader
-- masks by them, as everyone may read outbox_installation. Whoever may record outcomes
-- (UPDATE on outbox_messages) writes them at start.
GRANT SELECT ON outbox_kind_policies TO PUBLIC;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, p.privilege
        FROM pg_class AS c,
             aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a,
             LATERAL (SELECT unnest(ARRAY['INSERT', 'UPDATE', 'DELETE']) AS privilege) AS p
        WHERE c.oid = 'outbox_messages'::regclass
          AND a.privilege_type = 'UPDATE'
          AND a.grantee <> (SELECT relowner FROM pg_class
                            WHERE oid = 'outbox_kind_policies'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON outbox_kind_policies TO %s', g.privilege,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
    END LOOP;
END
$$;

-- A producer's cancel scrubs the message's secret fields too (the function of migration
-- 31, with the scrub in its UPDATE: CREATE OR REPLACE keeps its owner and grants).
CREATE OR REPLACE FUNCTION outbox_cancel_id(message_id bigint, who text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    m      record;
    by_    text := left(coalesce(who, session_user::text), 200);
    fields text[];
BEGIN
    SELECT id, kind, payload, secret_fields, dispatched_at, dead_lettered_at, claim_token,
           locked_until, cancel_requested_at
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
    fields := outbox_secret_fields_of(m.kind, m.secret_fields);
    UPDATE outbox_messages
    SET dead_lettered_at = now(), end_reason = 'cancelled', discarded_at = now(),
        discarded_by = by_, cancel_requested_at = now(), cancelled_by = by_,
        locked_until = NULL, locked_by = NULL, claim_token = NULL,
        payload = outbox_masked(m.payload, fields),
        secrets_scrubbed_at = CASE WHEN cardinality(fields) > 0 THEN now() END
    WHERE id = m.id;
    INSERT INTO outbox_message_events (message_id, event, actor) VALUES (m.id, 'cancelled', by_);
    INSERT INTO outbox_callbacks (message_id, event, detail)
    SELECT m.id, 'message.cancelled', by_ FROM outbox_installation WHERE callbacks;
    RETURN 'cancelled';
END
$$;
