-- The installation's tag: the Message-ID of a message is <outbox-ID.TAG@domain>
-- (src/message/message_id.rs), so that two databases (the demo's and an application's,
-- staging's and production's, one recreated after dropdb, several applications under one
-- sender domain) never give two emails the same Message-ID, which receivers would drop as
-- duplicates. Random, made once here: a database migrated anew gets a new one.
--
-- A new table of one row: it locks no table that exists, so it runs online whatever the
-- size of outbox_messages (checked: it completes while another session holds an ACCESS
-- EXCLUSIVE lock on outbox_messages, tests/it/migrations.rs).
CREATE TABLE outbox_installation (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    tag        text        NOT NULL CHECK (tag ~ '^[a-z0-9]{1,16}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO outbox_installation (tag)
VALUES (substr(replace(gen_random_uuid()::text, '-', ''), 1, 10));

-- Read by every replica at start; nothing secret, so no role outboxd runs as can lack it.
GRANT SELECT ON outbox_installation TO PUBLIC;
