-- name: linger
-- Sleeps on the listening connection: PostgreSQL delivers the notifications of commits
-- meanwhile together when the command ends.
-- $1 seconds (float8)
-- Index: none.
SELECT pg_sleep($1)
