-- Each kind's secret fields and payload retention (`outbox_kind_policies`, migration 32), as
-- its kind.toml says them: written at start, read by every statement that ends or shows a
-- message (the fragments `has_secrets` and `masked_payload`) and by payload retention.

-- name: kind_policies
-- The policies in the table now.
-- No parameters.
-- Index: none; the table holds a row per kind that declares one.
SELECT kind, secret_fields, extract(epoch FROM payload_retention)::float8 AS payload_retention,
       payload_swept_until
FROM {{schema}}outbox_kind_policies ORDER BY kind COLLATE "C"

-- name: publish_kind_policies
-- Makes the table say what this replica's kinds say: a kind no longer declaring either is
-- removed, a changed one rewritten. Its sweep's progress is kept: a shorter retention goes
-- on from it, a longer one waits for its cutoff to pass it.
-- $1 kinds (text[]), $2 secret fields (text[]: each kind's, joined by ','), $3 payload
-- retentions (float8[] seconds, null for none): one element a kind.
-- Index: outbox_kind_policies_pkey.
WITH wanted AS (
    SELECT w.kind,
           CASE WHEN w.fields = '' THEN '{}'::text[] ELSE string_to_array(w.fields, ',') END AS fields,
           CASE WHEN w.retention IS NOT NULL THEN make_interval(secs => w.retention) END AS retention
    FROM unnest($1::text[], $2::text[], $3::float8[]) AS w(kind, fields, retention)
), gone AS (
    DELETE FROM {{schema}}outbox_kind_policies AS p
    WHERE p.kind NOT IN (SELECT kind FROM wanted)
)
INSERT INTO {{schema}}outbox_kind_policies AS p (kind, secret_fields, payload_retention)
SELECT kind, fields, retention FROM wanted
ON CONFLICT (kind) DO UPDATE
SET secret_fields = excluded.secret_fields, payload_retention = excluded.payload_retention,
    updated_at = now()
WHERE (p.secret_fields, p.payload_retention)
      IS DISTINCT FROM (excluded.secret_fields, excluded.payload_retention)

-- fragment: recipients_only
-- What payload retention and erasure keep of the payload of the message named by the
-- argument: its recipient lists, so that the lookup by recipient still finds it.
jsonb_strip_nulls(jsonb_build_object('to', {{argument}}.payload -> 'to',
                                     'cc', {{argument}}.payload -> 'cc',
                                     'bcc', {{argument}}.payload -> 'bcc'))

-- fragment: remove_payloads_by
-- Removes the payloads of a kind's messages that ended (by the column `{{argument}}`)
-- before the cutoff, walking that column's index from where the last pass stopped, a
-- bounded number of rows at a time, whatever their kind. Rows another transaction holds
-- are skipped (the pass then keeps its place, and the next walks them again). Returns the
-- last key walked, the rows walked, those due and those removed.
WITH scanned AS MATERIALIZED (
    SELECT id, kind, payload_removed_at, {{argument}} AS ended_at
    FROM {{schema}}outbox_messages
    WHERE {{argument}} < $3
      AND {{argument}} >= coalesce($4, $2, '-infinity')
      AND ($4::timestamptz IS NULL OR ({{argument}}, id) > ($4, $5))
    ORDER BY {{argument}}, id
    LIMIT $6
), doomed AS (
    SELECT m.id FROM {{schema}}outbox_messages AS m JOIN scanned AS s ON s.id = m.id
    WHERE s.kind = $1 AND s.payload_removed_at IS NULL
    FOR NO KEY UPDATE OF m SKIP LOCKED
), removed AS (
    UPDATE {{schema}}outbox_messages AS m
    SET payload = {{recipients_only(m)}}, payload_removed_at = now()
    FROM doomed WHERE m.id = doomed.id
    RETURNING m.id
)
SELECT (SELECT ended_at FROM scanned ORDER BY ended_at DESC, id DESC LIMIT 1) AS last_at,
       (SELECT id FROM scanned ORDER BY ended_at DESC, id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM scanned) AS scanned,
       (SELECT count(*) FROM scanned WHERE kind = $1 AND payload_removed_at IS NULL) AS due,
       (SELECT count(*) FROM removed) AS removed

-- name: remove_sent_payloads
-- $1 kind (text), $2 from (timestamptz: the kind's `payload_swept_until`, null for the
-- first), $3 cutoff (timestamptz), $4 after at (timestamptz, null from the start), $5 after
-- id (bigint), $6 limit (bigint): the most rows a statement walks.
-- Index: outbox_messages_dispatched_idx, from $2 on.
{{remove_payloads_by(dispatched_at)}}

-- name: remove_discarded_payloads
-- $1 kind (text), $2 from (timestamptz: the kind's `payload_swept_until`, null for the
-- first), $3 cutoff (timestamptz), $4 after at (timestamptz, null from the start), $5 after
-- id (bigint), $6 limit (bigint): the most rows a statement walks.
-- Index: outbox_messages_discarded_idx, from $2 on.
{{remove_payloads_by(discarded_at)}}

-- name: payloads_swept
-- A kind's payload retention pass is done up to the cutoff.
-- $1 kind (text), $2 cutoff (timestamptz)
-- Index: outbox_kind_policies_pkey.
UPDATE {{schema}}outbox_kind_policies SET payload_swept_until = $2 WHERE kind = $1
