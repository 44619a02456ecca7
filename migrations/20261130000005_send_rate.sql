-- The send-rate limit every replica on this table shares (OUTBOXD_RATE_LIMIT): a token
-- bucket per limit. A claim takes tokens before it takes rows and gives back what it could
-- not use, so replicas together never send faster than the limit. `pace` is the rate the
-- bucket refills at now: the configured limit, halved (at most once a second) when the
-- relay answers that it is throttling, then recovering a little every second.
--
-- A new table: nothing existing is locked or rewritten.
CREATE TABLE outbox_send_rate (
    name         text PRIMARY KEY,
    tokens       float8      NOT NULL CHECK (tokens >= 0),
    pace         float8      NOT NULL CHECK (pace > 0),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    throttled_at timestamptz
);

COMMENT ON TABLE outbox_send_rate IS
    'Token buckets shared by outboxd replicas: the send-rate limit and its current pace.';
