-- Operators' statements: the dead-letter view, retry and discard, and the audit trail.

-- name: list_dead_letters
-- Dead letters, newest first, without their payloads.
-- $1 kind (text, null for every kind), $2 after (bigint: the last id of the previous page,
-- null from the start), $3 limit (bigint), $4 tag (text, null for any)
-- Index: outbox_messages_dead_letter_idx (the tag is a filter on the few dead letters).
SELECT id, kind, {{recipients_column}}, attempts, last_error,
       coalesce(error_class, 'unknown') AS error_class,
       {{schema}}outbox_on_the_calendar(created_at) AS created_at,
       {{schema}}outbox_on_the_calendar(dead_lettered_at) AS dead_lettered_at,
       coalesce(tags, ARRAY[]::text[]) AS tags
FROM {{schema}}outbox_messages
WHERE {{dead_letter}} AND ($1::text IS NULL OR kind = $1) AND ($2::bigint IS NULL OR id < $2)
  AND ($4::text IS NULL OR tags @> ARRAY[$4::text])
ORDER BY id DESC LIMIT $3

-- name: dead_letter_groups
-- Dead letters grouped by kind and failure, largest group first, each with its newest.
-- No parameters.
-- Index: outbox_messages_dead_letter_idx; outbox_messages_pkey for each group's newest.
WITH g AS (
    SELECT kind, coalesce(error_class, 'unknown') AS error_class, count(*) AS count,
           max(id) AS newest_id
    FROM {{schema}}outbox_messages WHERE {{dead_letter}}
    GROUP BY 1, 2)
SELECT g.kind, g.error_class, g.count, g.newest_id, m.last_error,
       {{schema}}outbox_on_the_calendar(m.dead_lettered_at) AS dead_lettered_at
FROM g JOIN {{schema}}outbox_messages m ON m.id = g.newest_id
ORDER BY g.count DESC, g.kind, g.error_class

-- fragment: selected_dead_letters
-- Of an `UPDATE` of dead letters: those a selection names ($1 ids, $2 kind, $3 error class,
-- $4 all of them). Nothing is selected unless one is given.
WHERE {{dead_letter}}
  AND ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR coalesce(error_class, 'unknown') = $3)
  AND ($1::bigint[] IS NOT NULL OR $2::text IS NOT NULL OR $4)

-- name: retry_dead_letters
-- The selected dead letters back to pending: attempts reset, due now; except those whose
-- payload is no longer what was to be sent (its secret fields scrubbed, or removed), which
-- are returned unchanged (`retried` false): their application must enqueue them anew.
-- $1 ids (bigint[]), $2 kind (text), $3 error_class (text), $4 all (bool)
-- Index: outbox_messages_pkey for ids, else outbox_messages_dead_letter_idx.
WITH selected AS MATERIALIZED (
    SELECT id, secrets_scrubbed_at IS NULL AND payload_removed_at IS NULL AS retryable
    FROM {{schema}}outbox_messages
    {{selected_dead_letters}}
    FOR NO KEY UPDATE
), retried AS (
    UPDATE {{schema}}outbox_messages AS m
    SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now(),
        locked_until = NULL, locked_by = NULL, claim_token = NULL, end_reason = NULL,
        {{times_on_the_calendar}}
    FROM selected AS s WHERE m.id = s.id AND s.retryable
)
SELECT id, retryable AS changed FROM selected ORDER BY id

-- name: discard_dead_letters
-- The selected dead letters kept, marked discarded, out of the dead-letter view.
-- $1 ids (bigint[]), $2 kind (text), $3 error_class (text), $4 all (bool),
-- $5 discarded_by (text)
-- Index: outbox_messages_pkey for ids, else outbox_messages_dead_letter_idx.
UPDATE {{schema}}outbox_messages
SET discarded_at = now(), discarded_by = $5,
    next_attempt_at = {{schema}}outbox_on_the_calendar(next_attempt_at),
    {{times_on_the_calendar}}
{{selected_dead_letters}}
RETURNING id, true AS changed

-- name: wake_dispatchers
-- Tells every dispatcher's LISTEN that rows are due now (after a retry).
-- $1 channel (text)
-- Index: none.
SELECT pg_notify($1, '')

-- name: audit
-- One operator action, kept in the audit trail.
-- $1 actor (text), $2 action (text), $3 target (text), $4 rows (int4), $5 detail (text),
-- $6 token (text: the admin token's name, null for the CLI and outboxd itself)
-- Index: none, an insert.
INSERT INTO {{schema}}outbox_admin_audit (actor, action, target, rows, detail, token)
VALUES ($1, $2, $3, $4, $5, $6)

-- name: audit_log
-- The most recent actions that change something: lookups, which change nothing and come by
-- the dozen, are left out (they are in the table, for an audit of who looked at whose
-- messages).
-- $1 limit (bigint)
-- Index: outbox_admin_audit_pkey, backwards.
SELECT id, at, actor, token, action, target, rows, detail FROM {{schema}}outbox_admin_audit
WHERE action <> 'lookup' /* word: audit.lookup */
ORDER BY id DESC LIMIT $1
