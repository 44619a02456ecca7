-- name: installation_tag
-- This database's installation tag (migration 23), read once at start for the Message-IDs.
-- No parameters.
-- Index: none; the table holds one row.
SELECT tag FROM {{schema}}outbox_installation

-- name: runs_from_schema
-- The oldest release's newest migration that may run on this schema (migration 33): NULL
-- while every migration is additive. Asked only of a schema newer than this build, whose
-- migrations include 33.
-- No parameters.
-- Index: none; the table holds one row.
SELECT runs_from_schema FROM {{schema}}outbox_installation
