-- Suppression scopes (issue 49): an unsubscribe or a complaint about a bulk message stops
-- that lane's mail to the address, not its password resets. The entries of
-- outbox_suppressions keep applying to every kind (their scope is `all`); an entry for one
-- lane lives here, keyed by the address and the lane, with the same columns.
--
-- A new table, so the migration locks no table that exists and runs online whatever the
-- size of the list (checked: it completes while another session holds an ACCESS EXCLUSIVE
-- lock on outbox_suppressions, tests/it/migrations.rs). It leaves outbox_suppressions'
-- primary key as it is: a replica older than this release keeps writing hard bounces with
-- `ON CONFLICT (address)` during a rolling upgrade, and reads no lane's entries until it
-- is upgraded (so, for that while, it may mail an address that unsubscribed from one lane).
CREATE TABLE outbox_lane_suppressions (
    address          text        NOT NULL
        CHECK (address = lower(address) AND length(address) BETWEEN 3 AND 320),
    lane             text        NOT NULL CHECK (lane IN ('bulk', 'transactional')),
    -- A hard bounce applies to every lane: it is kept in outbox_suppressions, never here.
    reason           text        NOT NULL CHECK (reason IN ('complaint', 'manual', 'unsubscribe')),
    source           text        NOT NULL CHECK (length(source) BETWEEN 1 AND 100),
    detail           text        CHECK (detail IS NULL OR length(detail) <= 1000),
    message_id       bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    created_by       text,
    suppressed_until timestamptz,
    PRIMARY KEY (address, lane)
);

COMMENT ON TABLE outbox_lane_suppressions IS
    'Addresses outboxd does not mail in one lane: an unsubscribe or a complaint about a message of that lane, or an operator''s entry.';

-- Whoever may read or write the list may read or write its lane entries, with the same
-- grant option: a role set up with the book's GRANTs keeps working after the upgrade (the
-- claim reads this table). Read from the list's ACL itself, its owner's implicit rights
-- included, whoever runs the migration (tests/it/migrations.rs checks a role's rights).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee, a.privilege_type, a.is_grantable
        FROM pg_class AS c,
             aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
        WHERE c.oid = 'outbox_suppressions'::regclass
          AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
          AND a.grantee <> (SELECT relowner FROM pg_class
                            WHERE oid = 'outbox_lane_suppressions'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON outbox_lane_suppressions TO %s%s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
