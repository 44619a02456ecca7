-- The migrations' own statements. They run before outboxd's objects exist, and, in a
-- schema of outboxd's own, with it as the connection's `search_path` (the migrations' text
-- names no schema): these name none either.

-- name: schema_exists
-- $1 schema (text, quoted)
-- Index: none, the catalog.
SELECT to_regnamespace($1) IS NOT NULL

-- name: applied_migrations
-- No parameters.
-- Index: outbox_schema_migrations_pkey.
SELECT version FROM outbox_schema_migrations WHERE success

-- name: lock_migrations_table
-- Held while the migrations table is carried over, so that a concurrent `migrate` waits.
-- No parameters.
-- Index: none.
SELECT pg_advisory_xact_lock(hashtext('outbox_schema_migrations'))

-- name: migrations_tables
-- Whether outboxd's migrations table exists, and whether sqlx's does.
-- No parameters.
-- Index: none, the catalog.
SELECT to_regclass('outbox_schema_migrations') IS NOT NULL,
       to_regclass('_sqlx_migrations') IS NOT NULL

-- name: count_old_migrations
-- $1 versions (bigint[]): this build's.
-- Index: _sqlx_migrations' primary key.
SELECT count(*) FROM _sqlx_migrations WHERE version = ANY($1)

-- name: create_migrations_table
-- The same columns sqlx gives a migrations table.
-- No parameters.
-- Index: none.
CREATE TABLE outbox_schema_migrations (
    version BIGINT PRIMARY KEY, description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)

-- name: copy_old_migrations
-- $1 versions (bigint[]): this build's.
-- Index: _sqlx_migrations' primary key.
INSERT INTO outbox_schema_migrations
    (version, description, installed_on, success, checksum, execution_time)
SELECT version, description, installed_on, success, checksum, execution_time
FROM _sqlx_migrations WHERE version = ANY($1)

-- name: set_search_path
-- The connection's `search_path` for the migrations in a schema of outboxd's own: on a
-- connection of its own, closed after them.
-- $1 search_path (text: the schema, quoted)
-- Index: none.
SELECT set_config('search_path', $1, false)
