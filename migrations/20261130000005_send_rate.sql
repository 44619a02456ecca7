-- The send-rate limit every replica on this table shares (OUTBOXD_RATE_LIMIT), kept as a
-- schedule of send slots (the generic cell rate algorithm): `next_slot` is the first time
-- not yet given to a message. A claim books consecutive slots, 1/pace apart, up to a second
-- ahead, claims no more rows than it booked, and hands back the slots it could not fill
-- when nobody booked after it. Its sends then wait for their slots, so replicas together
-- never send faster than the pace. `pace` is the configured limit, halved (at most once a
-- second) when the relay answers that it is throttling, then recovering a little every
-- second.
--
-- A new table: nothing existing is locked or rewritten.
CREATE TABLE outbox_send_rate (
    name         text PRIMARY KEY,
    pace         float8      NOT NULL CHECK (pace > 0),
    next_slot    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    throttled_at timestamptz
);

COMMENT ON TABLE outbox_send_rate IS
    'Send-rate schedules shared by outboxd replicas: the next free send slot and the current pace.';
