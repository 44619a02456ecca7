-- The send schedule all replicas book from before they claim, so that a send-rate limit
-- holds for the table, not per process (the migration that creates `outbox_send_rate`).
-- One row a schedule (`name`); its lock serializes replicas for one statement only.

-- fragment: ramp_integral
-- How far the pace has grown, in seconds of full growth, `{{argument}}` seconds after a
-- cut, its growth ramping up from nothing over $6 seconds: the integral of
-- `min(1, t / $6)` from 0. A booking grows the pace by the difference of this between its
-- time and the last booking's, so that the growth is the same however often replicas book.
(CASE WHEN greatest(0, {{argument}}) <= $6 THEN greatest(0, {{argument}}) ^ 2 / (2 * $6)
      ELSE {{argument}} - $6 / 2 END)

-- name: book_slots
-- Books up to $3 consecutive slots within the horizon, growing the pace first (additive
-- increase, ramped after a cut); returns nothing when the schedule does not exist yet.
-- $1 name (text), $2 limit (float8 messages a second), $3 wanted (bigint),
-- $4 horizon (float8 seconds), $5 increase (float8 messages a second, each second),
-- $6 ramp (float8 seconds), $7 tolerated_share (float8, null to keep the schedule's)
-- Index: outbox_send_rate_pkey.
WITH current AS (
    SELECT r.name, c.now, greatest(r.next_slot, c.now) AS start,
           least($2, r.pace + $5 * CASE WHEN r.throttled_at IS NULL
               THEN greatest(0, extract(epoch FROM c.now - r.updated_at))
               ELSE greatest(0, {{ramp_integral(extract(epoch FROM c.now - r.throttled_at))}}
                   - {{ramp_integral(extract(epoch FROM r.updated_at - r.throttled_at))}}) END) AS pace
    FROM {{schema}}outbox_send_rate AS r, (SELECT clock_timestamp() AS now) AS c
    WHERE r.name = $1 FOR UPDATE OF r
), granted AS (
    SELECT name, now, start, pace,
           least($3, greatest(0, floor(($4 - extract(epoch FROM start - now)) * pace)))::int8 AS n
    FROM current
)
UPDATE {{schema}}outbox_send_rate AS b
SET next_slot = g.start + make_interval(secs => g.n / g.pace), pace = g.pace,
    updated_at = g.now,
    tolerated_share = coalesce($7, b.tolerated_share)
FROM granted AS g WHERE b.name = g.name
RETURNING g.n AS granted, extract(epoch FROM g.start - g.now)::float8 AS starts_in,
          g.pace::float8 AS pace, b.next_slot AS ends_at, b.tolerated_share

-- name: start_schedule
-- The first booking on this table: the schedule starts now, at the full pace.
-- $1 name (text), $2 pace (float8)
-- Index: outbox_send_rate_pkey.
INSERT INTO {{schema}}outbox_send_rate (name, pace) VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING

-- name: hand_back_slots
-- Hands back the last slots of a booking a claim could not fill, unless another booking
-- came after it (then they stay unused: slower, never faster).
-- $1 name (text), $2 the booking's end (timestamptz), $3 seconds to hand back (float8)
-- Index: outbox_send_rate_pkey.
UPDATE {{schema}}outbox_send_rate SET next_slot = next_slot - make_interval(secs => $3)
WHERE name = $1 AND next_slot = $2

-- name: slow_down
-- The relay said it is throttling: the pace times $3, at most once every 2 s for all
-- replicas, never below $2. A schedule that does not exist yet, or was not booked from for
-- $5 seconds, starts again at $4, the pace the relay was seen to accept.
-- $1 name (text), $2 min_pace (float8), $3 factor (float8), $4 start (float8),
-- $5 stale_after (float8 seconds)
-- Index: outbox_send_rate_pkey.
INSERT INTO {{schema}}outbox_send_rate AS r (name, pace, throttled_at)
VALUES ($1, greatest($2, $4), clock_timestamp())
ON CONFLICT (name) DO UPDATE
SET pace = CASE WHEN r.updated_at < clock_timestamp() - make_interval(secs => $5)
                THEN greatest($2, $4) ELSE greatest($2, r.pace * $3) END,
    throttled_at = clock_timestamp()
WHERE r.throttled_at IS NULL OR r.throttled_at < clock_timestamp() - interval '2 seconds'
