-- Where messages are found by tag: one row per tag and message, written at the insert by a
-- trigger, read newest first by `messages_by_tag` through its primary key, and deleted
-- with the message by retention. A GIN index on `outbox_messages.tags` was measured first
-- and refused: it cannot return rows in id order (a page of a big campaign's tag read every
-- tagged row, up to the lookup's timeout), and the claim and the outcome write, which are
-- not HOT updates, wrote each tagged row's GIN entries again (the drain's PostgreSQL CPU
-- rose a quarter; docs/src/benchmark-history.md, *One-click unsubscribe and tags*). Here an
-- update of a message touches nothing, and a message without tags costs one trigger
-- condition at its insert. A tagged one costs the trigger and its rows: 100 000 messages of
-- two tags each took 4.6 to 5.8 s to insert in one statement, against 0.9 to 1.2 s
-- without tags (about 40 microseconds of PostgreSQL a tagged message).
--
-- The trigger's function runs as its owner (SECURITY DEFINER, with the search_path of the
-- migration fixed on it): an application's role that may only INSERT into outbox_messages
-- still tags. A tag written later by an UPDATE is not found (tags are the producer's, at
-- the insert).
--
-- A new table, and a trigger whose creation takes a brief SHARE ROW EXCLUSIVE lock on
-- outbox_messages, bounded by lock_timeout: behind a long transaction the migration gives
-- up after 2 s, to be run again. Nothing is backfilled: migration 27 made the column in the
-- same release, and no row has tags before this runs.
SET LOCAL lock_timeout = '2s';

CREATE TABLE outbox_message_tags (
    tag        text   NOT NULL,
    message_id bigint NOT NULL,
    PRIMARY KEY (tag, message_id)
);

CREATE INDEX outbox_message_tags_message_idx ON outbox_message_tags (message_id);

COMMENT ON TABLE outbox_message_tags IS
    'Each tag of each message (outbox_messages.tags), kept by a trigger at the insert: the lookup by tag reads it.';

CREATE FUNCTION outbox_keep_tags() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_message_tags (tag, message_id)
    SELECT DISTINCT tag, NEW.id FROM unnest(NEW.tags) AS tag
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION outbox_keep_tags() FROM PUBLIC;

CREATE TRIGGER outbox_messages_keep_tags AFTER INSERT ON outbox_messages
    FOR EACH ROW WHEN (NEW.tags IS NOT NULL) EXECUTE FUNCTION outbox_keep_tags();

-- Whoever may read or delete messages may read or delete their tags (the lookups read
-- them; retention deletes them with their messages), with the same grant option.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee, a.privilege_type, a.is_grantable
        FROM pg_class AS c,
             aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
        WHERE c.oid = 'outbox_messages'::regclass
          AND a.privilege_type IN ('SELECT', 'DELETE')
          AND a.grantee <> (SELECT relowner FROM pg_class
                            WHERE oid = 'outbox_message_tags'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON outbox_message_tags TO %s%s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
