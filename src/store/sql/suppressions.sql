-- The suppression list (`outbox_suppressions`, keyed by the address's normal form): the
-- dispatcher's lookup, the operators' list, add and remove, and the bounces and complaints
-- that providers report.

-- fragment: suppression_columns
-- The columns of a listed entry, in either table, for a `WHERE` to follow.
SELECT address, scope, reason, source, detail, message_id, created_at, created_by,
       suppressed_until, {{active_suppression()}} AS active
FROM ({{suppression_entries}}) AS entries

-- name: suppressed_among
-- Which of these addresses (in the list's normal form) are suppressed now, with the reason
-- and the scope of each entry: the dispatcher's lookup of addresses the claim did not read.
-- $1 addresses (text[])
-- Index: outbox_suppressions_pkey; outbox_lane_suppressions_pkey.
SELECT key AS address, reason, scope FROM ({{listed_entries(SELECT unnest($1::text[]))}}) AS entries

-- name: suppressed_recipients_of
-- The recipients of some messages that are suppressed now, with each entry's scope, the
-- first $2 by message: what a retry of them may not reach. `all_suppressed` counts the
-- entries for every kind only: whether a lane's entry stops a message depends on its
-- kind's lane, which the command line does not know.
-- $1 ids (bigint[]), $2 limit (bigint)
-- Index: outbox_messages_pkey; outbox_suppressions_pkey; outbox_lane_suppressions_pkey.
SELECT m.id AS message_id, s.address, s.reason, s.scope,
       NOT EXISTS (SELECT FROM unnest({{schema}}outbox_recipient_keys(m.payload)) AS r(address)
                   WHERE NOT EXISTS (SELECT FROM {{schema}}outbox_suppressions AS o
                                     WHERE o.address = r.address
                                       AND {{active_suppression(o.)}}))
           AS all_suppressed
FROM {{schema}}outbox_messages AS m
CROSS JOIN LATERAL unnest({{schema}}outbox_recipient_keys(m.payload)) AS k(address)
JOIN ({{suppression_entries}}) AS s
  ON s.address = k.address AND {{active_suppression(s.)}}
WHERE m.id = ANY($1) ORDER BY m.id, s.address, s.scope LIMIT $2

-- name: list_suppressions
-- A page of the list in address order: $3 addresses, each with all its entries (`all`
-- first), so that a page never ends between two entries of one address; $1 matches any
-- part of the address (already in the normal form's case), $2 is the last address of the
-- previous page.
-- $1 search (text, null for all), $2 after (text, null from the start), $3 limit (bigint)
-- Index: outbox_suppressions_pkey and outbox_lane_suppressions_pkey (a range from $2 each,
-- merged; the search filters them).
WITH page AS (
    SELECT DISTINCT address FROM ({{suppression_entries}}) AS entries
    WHERE ($1::text IS NULL OR strpos(address, $1) > 0)
      AND ($2::text IS NULL OR address > $2)
    ORDER BY address LIMIT $3
)
{{suppression_columns}}
WHERE address IN (SELECT address FROM page)
ORDER BY address, scope

-- name: get_suppression
-- One address's entries, `all` first.
-- $1 address (text)
-- Index: outbox_suppressions_pkey; outbox_lane_suppressions_pkey.
{{suppression_columns}}
WHERE address = $1 ORDER BY scope

-- name: remove_suppression
-- An operator lifts an address's entry for every kind.
-- $1 address (text)
-- Index: outbox_suppressions_pkey.
DELETE FROM {{schema}}outbox_suppressions WHERE address = $1

-- name: remove_lane_suppressions
-- An operator lifts an address's entries for one lane, or for both ($2 null).
-- $1 address (text), $2 lane (text, null for both)
-- Index: outbox_lane_suppressions_pkey.
DELETE FROM {{schema}}outbox_lane_suppressions
WHERE address = $1 AND ($2::text IS NULL OR lane = $2)

-- name: upsert_suppression
-- Inserts an entry, or replaces one that has lapsed or that an operator is replacing, and
-- a temporary one with a report that suppresses for good (a complaint or an unsubscribe
-- while an operator's pause is on must outlast the pause). An active entry for good keeps
-- its first reason: a complaint after a hard bounce changes nothing that matters to
-- sending. It affects a row only when the list changed.
-- $1 address (text), $2 reason (text), $3 source (text), $4 detail (text),
-- $5 message_id (bigint), $6 created_by (text, null for a provider's report),
-- $7 suppressed_until (timestamptz, null for good)
-- Index: outbox_suppressions_pkey.
INSERT INTO {{schema}}outbox_suppressions
    (address, reason, source, detail, message_id, created_by, suppressed_until)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (address) DO UPDATE SET
    reason = excluded.reason, source = excluded.source, detail = excluded.detail,
    message_id = excluded.message_id, created_at = now(),
    created_by = excluded.created_by, suppressed_until = excluded.suppressed_until
WHERE excluded.created_by IS NOT NULL
   OR outbox_suppressions.suppressed_until <= now()
   OR (excluded.suppressed_until IS NULL AND {{replaced_for_good}})

-- name: upsert_lane_suppression
-- As `upsert_suppression`, for one lane's entry: an unsubscribe or a complaint about a
-- message of the lane, or an operator's entry for it. A report for an address already
-- suppressed for good for every kind writes nothing: it changes nothing that matters.
-- $1 address (text), $2 reason (text), $3 source (text), $4 detail (text),
-- $5 message_id (bigint), $6 created_by (text, null for a provider's report),
-- $7 suppressed_until (timestamptz, null for good), $8 lane (text)
-- Index: outbox_lane_suppressions_pkey.
INSERT INTO {{schema}}outbox_lane_suppressions
    (address, reason, source, detail, message_id, created_by, suppressed_until, lane)
SELECT $1, $2, $3, $4, $5, $6, $7, $8
WHERE $6::text IS NOT NULL
   OR NOT EXISTS (SELECT FROM {{schema}}outbox_suppressions AS a
                  WHERE a.address = $1 AND a.suppressed_until IS NULL)
ON CONFLICT (address, lane) DO UPDATE SET
    reason = excluded.reason, source = excluded.source, detail = excluded.detail,
    message_id = excluded.message_id, created_at = now(),
    created_by = excluded.created_by, suppressed_until = excluded.suppressed_until
WHERE excluded.created_by IS NOT NULL
   OR outbox_lane_suppressions.suppressed_until <= now()
   OR (excluded.suppressed_until IS NULL
       AND outbox_lane_suppressions.suppressed_until IS NOT NULL)

-- name: first_receipt
-- Keeps a provider's notification id; its row comes back true only the first time. Old
-- receipts go in the same statement, a few at a time, so the table stays about a day long
-- without a task of its own.
-- $1 source (text), $2 notification_id (text)
-- Index: outbox_webhook_receipts_pkey; outbox_webhook_receipts_received_at.
WITH expired AS (
    DELETE FROM {{schema}}outbox_webhook_receipts WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {{schema}}outbox_webhook_receipts
        WHERE received_at < now() - interval '1 day' LIMIT 100))
), kept AS (
    INSERT INTO {{schema}}outbox_webhook_receipts (source, notification_id) VALUES ($1, $2)
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM kept)

-- name: envelope_of
-- A message's kind (whose lane a complaint or an unsubscribe about it stops) and its
-- envelope addresses as written, its row locked for the report's mark.
-- $1 id (bigint)
-- Index: outbox_messages_pkey.
SELECT kind, ARRAY(SELECT jsonb_array_elements_text(
    jsonb_path_query_array(payload, '$.to[*] ? (@.type() == "string")')
    || jsonb_path_query_array(payload, '$.cc[*] ? (@.type() == "string")')
    || jsonb_path_query_array(payload, '$.bcc[*] ? (@.type() == "string")')))
FROM {{schema}}outbox_messages WHERE id = $1 FOR NO KEY UPDATE

-- name: mark_feedback
-- A provider's report on the row it names: an event of its timeline, its mark (a
-- complaint outranks a bounce, and a hard bounce a soft one), and with callbacks on, a hard
-- bounce's or a complaint's callback, in one statement.
-- $1 id (bigint), $2 mark (text, null for none), $3 event (text), $4 actor: the source
-- (text), $5 detail (text)
-- Index: outbox_messages_pkey.
WITH event AS (
    INSERT INTO {{schema}}outbox_message_events (message_id, event, actor, detail)
    VALUES ($1, $3, $4, left($5, 1000 /* word: limit.detail_chars */))
), callback AS (
    INSERT INTO {{schema}}outbox_callbacks (message_id, event, detail)
    SELECT $1, CASE $2 WHEN 'complaint' /* word: mark.complaint */
                       THEN 'message.complained' /* word: callback.complained */
                       ELSE 'message.bounced' /* word: callback.bounced */ END,
           left($5, 1000 /* word: limit.detail_chars */)
    WHERE $2 IN ('hard_bounce' /* word: mark.hard_bounce */, 'complaint' /* word: mark.complaint */)
      AND {{callbacks_on}}
      AND EXISTS (SELECT FROM {{schema}}outbox_messages WHERE id = $1))
UPDATE {{schema}}outbox_messages
SET feedback = $2, feedback_at = now(),
    next_attempt_at = {{schema}}outbox_on_the_calendar(next_attempt_at),
    {{times_on_the_calendar}}
WHERE id = $1 AND $2::text IS NOT NULL
  AND (feedback IS NULL OR feedback = 'soft_bounce' /* word: mark.soft_bounce */
       OR (feedback = 'hard_bounce' /* word: mark.hard_bounce */
           AND $2 = 'complaint' /* word: mark.complaint */))
