-- The gauges' sample, in one transaction the server cancels past its time (`sample`). Each
-- part walks a partial index on pending or dead-lettered rows, never the dispatched
-- history. A time of `-infinity` (a row from before migration 12) counts as year 1: the age
-- is absurd and its alert fires, where the statement used to fail.

-- name: sample_totals
-- The table's totals but the oldest pending age (the kinds' walk finds it; an index of its
-- own cost each message two entries), and the oldest transaction or snapshot another
-- session holds open: what keeps vacuum from removing what was sent.
-- No parameters.
-- Index: outbox_messages_due_idx (pending); outbox_messages_dead_letter_idx.
SELECT
   (SELECT count(*) FROM {{schema}}outbox_messages WHERE {{pending}}) AS pending,
   (SELECT count(*) FROM {{schema}}outbox_messages WHERE {{dead_letter}}) AS dead_letters,
   (SELECT coalesce(extract(epoch FROM now() - {{schema}}outbox_on_the_calendar(min(next_attempt_at))), 0)::float8
      FROM {{schema}}outbox_messages
     WHERE {{pending}} AND next_attempt_at <= now()) AS oldest_ready_age,
   (SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)) AS oldest_transaction_age,
   coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
              WHERE relid = to_regclass('{{schema}}outbox_messages')), 0) AS dead_tuples

-- name: sample_kinds
-- Per kind: its messages due now (neither backing off nor leased), how long the oldest of
-- them has waited, and how long the oldest pending one has been due. One walk of the
-- pending rows, as the total's count is.
-- No parameters.
-- Index: outbox_messages_due_idx (pending).
SELECT kind, count(*) FILTER (WHERE next_attempt_at <= now()) AS ready,
       coalesce(extract(epoch FROM now() - {{schema}}outbox_on_the_calendar(
           min(next_attempt_at) FILTER (WHERE next_attempt_at <= now()))), 0)::float8
           AS oldest_ready_age,
       coalesce(extract(epoch FROM now() - {{schema}}outbox_on_the_calendar(
           min(greatest(created_at, not_before))
           FILTER (WHERE greatest(created_at, not_before) <= now()))), 0)::float8
           AS oldest_pending_age
FROM {{schema}}outbox_messages WHERE {{pending}}
GROUP BY kind ORDER BY kind

-- name: sample_paused
-- The paused kinds, and for how long.
-- No parameters.
-- Index: none; a row a paused kind.
SELECT kind, extract(epoch FROM now() - paused_at)::float8 AS paused_for, automatic
FROM {{schema}}outbox_kind_pauses ORDER BY kind

-- name: sample_events
-- The timeline's events written after the event $1 (null at the first sample: none, only
-- the newest id is read): how many were cancellations, the producers' `outbox_cancel`
-- included, which outboxd does not see happen. Every replica counts every one.
-- $1 after (bigint, null at the first sample): the newest event the last sample read.
-- Index: outbox_message_events_pkey (a range scan from $1; the newest entry at first).
WITH after AS (
    SELECT coalesce($1, (SELECT coalesce(max(id), 0) FROM {{schema}}outbox_message_events)) AS id
)
SELECT greatest((SELECT id FROM after), coalesce(max(e.id), 0)) AS last_id,
       count(*) FILTER (WHERE e.event = 'cancelled' /* word: action.cancelled */) AS cancelled
FROM {{schema}}outbox_message_events AS e
WHERE e.id > (SELECT id FROM after)
