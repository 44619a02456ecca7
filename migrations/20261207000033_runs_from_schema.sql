-- Which releases may run on this schema. A release starts on a schema newer than itself
-- (migrated ahead of it by a newer release's migrate Job during a rolling upgrade, or left
-- by a release rolled back) unless `runs_from_schema` is past the newest migration that
-- release embeds: migrations are additive, so an older release keeps working beside the
-- new columns and tables. None so far has needed it: NULL. A migration that an older
-- release cannot run beside sets it to its own version, so that those releases refuse to
-- start rather than misread the table (docs/src/deployment.md, *Which releases may run
-- side by side*; src/store/schema_state.rs).
--
-- A nullable column without a default on a table of one row: the catalog alone changes,
-- and no lock is taken on outbox_messages (checked as migration 23 was: it completes
-- while another session holds an ACCESS EXCLUSIVE lock on outbox_messages,
-- tests/it/migrations.rs).
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_installation ADD COLUMN runs_from_schema bigint;
