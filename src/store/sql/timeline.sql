-- name: timelines
-- The timelines of some messages, each oldest first: the events kept in
-- `outbox_message_events` (written by the statements that record outcomes, providers'
-- reports and operators' actions), with the two every message has on its row, its
-- enqueueing and its send. A reply's code is read from the failure's class
-- (`smtp_451`) or from the reply itself.
-- $1 ids (bigint[])
-- Index: outbox_messages_pkey; outbox_message_events_message_idx.
WITH e AS (
    SELECT id AS message_id, 'enqueued' /* word: event.enqueued */ AS event,
           {{schema}}outbox_on_the_calendar(created_at) AS at, NULL::text AS actor,
           NULL::text AS error_class, NULL::text AS reply, NULL::text AS detail,
           NULL::int4 AS duration_ms, 0 AS seq
    FROM {{schema}}outbox_messages WHERE id = ANY($1)
    UNION ALL
    SELECT message_id, event, at, actor, error_class,
           CASE WHEN error_class LIKE 'smtp\_%' THEN detail END,
           CASE WHEN error_class LIKE 'smtp\_%' THEN NULL ELSE detail END,
           duration_ms, id
    FROM {{schema}}outbox_message_events WHERE message_id = ANY($1)
    UNION ALL
    SELECT id, 'sent' /* word: action.sent */, {{schema}}outbox_on_the_calendar(dispatched_at),
           sent_by, NULL, smtp_reply, 'relay ' || relay, send_ms, 9223372036854775807
    FROM {{schema}}outbox_messages WHERE id = ANY($1) AND dispatched_at IS NOT NULL
)
SELECT message_id, event, at, actor,
       CASE WHEN error_class ~ '^smtp_[2-5][0-9][0-9]$'
            THEN substring(error_class FROM 6)::int4
            WHEN reply ~ '^[2-5][0-9][0-9]' THEN substring(reply FROM 1 FOR 3)::int4
       END AS smtp_code,
       reply AS smtp_reply, error_class, duration_ms, detail
FROM e ORDER BY message_id, at, seq

-- name: operator_action_events
-- An operator's action on some messages, in each one's timeline, in the action's
-- transaction.
-- $1 ids (bigint[]), $2 event (text), $3 actor (text)
-- Index: none, an insert.
INSERT INTO {{schema}}outbox_message_events (message_id, event, actor)
SELECT unnest($1::bigint[]), $2, $3
