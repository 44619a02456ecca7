-- The outbox table is a public contract: applications in any language insert into it
-- inside their own transactions, and outboxd delivers what they commit.

CREATE TABLE outbox_messages (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Which email to render; matches a template set's directory name.
    kind             text        NOT NULL CHECK (kind <> '' AND length(kind) <= 100),
    payload          jsonb       NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The producer's requested send time.
    not_before       timestamptz NOT NULL DEFAULT now(),
    -- When a dispatcher may try next: not_before at first, then moved by backoff and by leases.
    next_attempt_at  timestamptz NOT NULL,
    -- Failed attempts so far.
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- The first 500 characters of the last error.
    last_error       text,
    dispatched_at    timestamptz,
    dead_lettered_at timestamptz,
    -- The lease: a claimed row belongs to locked_by until locked_until; claim_token
    -- identifies one claim, so that only its holder can record the outcome.
    locked_until     timestamptz,
    locked_by        text,
    claim_token      uuid
);

COMMENT ON TABLE outbox_messages IS
    'Transactional outbox for emails, delivered by outboxd. Producers insert (kind, payload[, not_before]).';

-- Pending rows (neither dispatched nor dead-lettered) in the order they fall due.
-- The predicate is matched at plan time: dispatcher queries repeat it as literals.
CREATE INDEX outbox_messages_due_idx
    ON outbox_messages (next_attempt_at, id)
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL;

CREATE INDEX outbox_messages_dead_letter_idx
    ON outbox_messages (dead_lettered_at DESC, id DESC)
    WHERE dead_lettered_at IS NOT NULL;

-- A producer may leave next_attempt_at out: it starts at not_before.
CREATE FUNCTION outbox_messages_set_next_attempt() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.next_attempt_at := coalesce(NEW.next_attempt_at, NEW.not_before);
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_messages_set_next_attempt
    BEFORE INSERT ON outbox_messages
    FOR EACH ROW EXECUTE FUNCTION outbox_messages_set_next_attempt();

-- One notification per inserting statement; PostgreSQL delivers it at commit and
-- drops it on rollback, so a dispatcher wakes exactly when there is work to see.
CREATE FUNCTION outbox_messages_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_messages', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_messages_notify
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_messages_notify();
