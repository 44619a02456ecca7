-- `outboxd stats`: counts per kind, each from a partial index (pending rows, dead letters,
-- and the last hour of ended rows), never the whole history.

-- name: stats_pending
-- Per kind: pending, due now, leased, and how long the oldest pending one has been due.
-- No parameters.
-- Index: outbox_messages_due_idx (pending).
SELECT kind, count(*) AS pending,
       count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE locked_until > now()) AS in_flight,
       coalesce(extract(epoch FROM now() - {{schema}}outbox_on_the_calendar(
           min(greatest(created_at, not_before))
           FILTER (WHERE greatest(created_at, not_before) <= now()))), 0)::float8 AS oldest
FROM {{schema}}outbox_messages WHERE {{pending}}
GROUP BY kind

-- name: stats_dead_letters
-- Dead letters per kind.
-- No parameters.
-- Index: outbox_messages_dead_letter_idx.
SELECT kind, count(*) FROM {{schema}}outbox_messages WHERE {{dead_letter}} GROUP BY kind

-- name: stats_sent_last_hour
-- Rows sent in the last hour, per kind.
-- No parameters.
-- Index: outbox_messages_dispatched_idx.
SELECT kind, count(*) FROM {{schema}}outbox_messages
WHERE dispatched_at > now() - interval '1 hour' GROUP BY kind

-- name: stats_ended_last_hour
-- Rows that ended unsent in the last hour for one reason (their `end_reason`), per kind.
-- $1 end_reason (text: `expired`, `suppressed` or `logged_only`)
-- Index: outbox_messages_discarded_idx.
SELECT kind, count(*) FROM {{schema}}outbox_messages
WHERE discarded_at > now() - interval '1 hour' AND end_reason = $1 GROUP BY kind
