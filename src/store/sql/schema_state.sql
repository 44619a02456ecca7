-- name: schema_state
-- What start-up, the command line and readiness ask of the database, in one round trip
-- (readiness runs it often): the migrations applied and failed, whether the table exists,
-- and why outboxd could not write: a standby, a read-only database, or the first right the
-- role lacks, in the order readiness names them. An object that does not exist yet is
-- skipped: the schema's own check tells of that.
-- $1 objects (text[]: tables, or functions' signatures, in the schema), $2 privileges
-- (text[]), $3 whether each is a function (bool[])
-- Index: outbox_schema_migrations_pkey.
SELECT ARRAY(SELECT version FROM {{schema}}outbox_schema_migrations WHERE success ORDER BY version) AS applied,
       ARRAY(SELECT version FROM {{schema}}outbox_schema_migrations WHERE NOT success ORDER BY version) AS failed,
       to_regclass('{{schema}}outbox_messages') IS NOT NULL AS table_exists,
       CASE WHEN pg_is_in_recovery() THEN 'the server is a read-only standby'
            WHEN current_setting('transaction_read_only') = 'on'
              THEN 'the database is read-only (default_transaction_read_only)'
            ELSE (SELECT 'the role ' || current_user || ' may not ' || r.privilege || ' ' || r.object
                  FROM unnest($1::text[], $2::text[], $3::bool[]) WITH ORDINALITY
                       AS r(object, privilege, is_function, place)
                  WHERE CASE WHEN r.is_function
                             THEN to_regprocedure(r.object) IS NOT NULL
                                  AND NOT has_function_privilege(to_regprocedure(r.object), r.privilege)
                             ELSE to_regclass(r.object) IS NOT NULL
                                  AND NOT has_table_privilege(to_regclass(r.object), r.privilege) END
                  ORDER BY r.place LIMIT 1)
       END AS not_writable
