-- One message as an operator sees it, by id or by recipient. Every read goes through one
-- column list (`message_columns`), so the two agree.

-- name: message_by_id
-- $1 id (bigint)
-- Index: outbox_messages_pkey.
{{message_columns}}
FROM {{schema}}outbox_messages AS m WHERE id = $1

-- name: messages_by_recipient
-- The recipient lookup, newest first. The matches are gathered first, whole
-- (MATERIALIZED), and only then ordered and cut: asked for the newest 50 at once, the
-- planner walks the primary key backwards and reads every row's payload (9.5 s on 2 million
-- rows) instead of the index (under 1 ms). Ended rows come from the indexes of migrations
-- 19 and 20, whose predicates these conditions repeat (`ended`, `single_recipient`).
-- Pending rows have no index of their own (it would cost every enqueue): the first $4 of
-- the due index, and those among the newest $4 ids (a range of the primary key; the
-- message just enqueued, which a question is usually about).
-- $1 addresses (text[], in the lookup's form: `outbox_recipient_keys`), $2 after (bigint:
-- the last id of the previous page, null from the start), $3 limit (bigint), $4 pending
-- rows to read (bigint)
-- Index: outbox_messages_single_recipient_idx; outbox_messages_many_recipients_idx;
-- outbox_messages_due_idx; outbox_messages_pkey.
WITH ended AS MATERIALIZED (
    SELECT id FROM {{schema}}outbox_messages
    WHERE {{ended}} AND {{single_recipient}}
      AND {{schema}}outbox_single_recipient_key(payload) = ANY($1)
      AND ($2::bigint IS NULL OR id < $2)
    UNION ALL
    SELECT id FROM {{schema}}outbox_messages
    WHERE {{ended}} AND NOT ({{single_recipient}})
      AND {{schema}}outbox_recipient_keys(payload) && $1
      AND ($2::bigint IS NULL OR id < $2)
), scanned AS MATERIALIZED (
    (SELECT id, payload FROM {{schema}}outbox_messages WHERE {{pending}}
     ORDER BY next_attempt_at, id LIMIT $4)
    UNION ALL
    (SELECT id, payload FROM {{schema}}outbox_messages WHERE {{pending}}
     AND id > (SELECT max(id) FROM {{schema}}outbox_messages) - $4)
), waiting AS (
    SELECT DISTINCT id FROM scanned
    WHERE {{schema}}outbox_recipient_keys(payload) && $1 AND ($2::bigint IS NULL OR id < $2)
), chosen AS (
    SELECT id FROM ended UNION ALL SELECT id FROM waiting
    ORDER BY id DESC LIMIT $3
)
{{message_columns}}
FROM {{schema}}outbox_messages AS m WHERE id IN (SELECT id FROM chosen) ORDER BY id DESC

-- name: messages_by_tag
-- The messages a producer tagged `$1`, in any state, newest first, read from the tags' rows
-- (migration 28) a page at a time: each page reads `$3` rows of the index, whatever the
-- number of messages tagged so.
-- $1 tag (text), $2 after (bigint: the last id of the previous page, null from the start),
-- $3 limit (bigint)
-- Index: outbox_message_tags_pkey; outbox_messages_pkey.
WITH chosen AS (
    SELECT message_id AS id FROM {{schema}}outbox_message_tags
    WHERE tag = $1 AND ($2::bigint IS NULL OR message_id < $2)
    ORDER BY message_id DESC LIMIT $3
)
{{message_columns}}
FROM {{schema}}outbox_messages AS m WHERE id IN (SELECT id FROM chosen) ORDER BY id DESC

-- name: more_pending_than
-- Whether more than $1 rows are pending, read from the due index as the lookup reads them:
-- then the lookup did not read them all.
-- $1 rows (bigint)
-- Index: outbox_messages_due_idx.
SELECT count(*) > $1 FROM (SELECT FROM {{schema}}outbox_messages WHERE {{pending}}
                           ORDER BY next_attempt_at, id LIMIT $1 + 1) AS p
