-- name: installation_tag
-- This database's installation tag (migration 23), read once at start for the Message-IDs.
-- No parameters.
-- Index: none; the table holds one row.
SELECT tag FROM {{schema}}outbox_installation
