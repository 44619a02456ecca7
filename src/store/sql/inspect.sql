-- What `outboxd doctor` reads of the database. It changes nothing.

-- name: server_version
-- The server's version, as `server_version` says it, and as a number.
-- No parameters.
-- Index: none, settings.
SELECT current_setting('server_version'), current_setting('server_version_num')::int4

-- name: oldest_transaction
-- The oldest transaction or snapshot another session holds open in this database.
-- No parameters.
-- Index: none, pg_stat_activity.
SELECT pid, extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_seconds,
       state, usename::text AS user, application_name AS application
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND xact_start IS NOT NULL
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start LIMIT 1

-- name: invalid_indexes
-- Indexes of outboxd's tables (each named here, so that an application's own `outbox_*`
-- table beside them is not taken for one) that a failed `CREATE INDEX CONCURRENTLY` left
-- invalid.
-- No parameters.
-- Index: none, the catalog.
SELECT indexrelid::regclass::text FROM pg_index
WHERE NOT indisvalid
  AND indrelid IN (
      to_regclass('{{schema}}outbox_messages'), to_regclass('{{schema}}outbox_suppressions'),
      to_regclass('{{schema}}outbox_send_rate'), to_regclass('{{schema}}outbox_schema_migrations'),
      to_regclass('{{schema}}outbox_webhook_receipts'), to_regclass('{{schema}}outbox_admin_audit'),
      to_regclass('{{schema}}outbox_kind_pauses'), to_regclass('{{schema}}outbox_message_events'),
      to_regclass('{{schema}}outbox_installation'), to_regclass('{{schema}}outbox_replica_circuits'),
      to_regclass('{{schema}}outbox_lane_suppressions'))
ORDER BY 1

-- name: table_health
-- The outbox table's tuples and vacuum, from the statistics.
-- No parameters.
-- Index: none, the catalog.
SELECT coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples,
       s.last_autovacuum,
       current_setting('autovacuum')::bool
         AND coalesce(NOT ('autovacuum_enabled=false' = ANY(c.reloptions)), true)
         AS autovacuum_on
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass('{{schema}}outbox_messages')
