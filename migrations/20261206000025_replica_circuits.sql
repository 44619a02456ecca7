-- Each replica's SMTP circuit, as `outboxd stats` and `outboxd messages` show it: while a
-- replica's relay does not answer, it claims nothing, and its pending mail waits. Written
-- when the circuit opens and at each probe while it stays open, removed when it closes
-- (src/store/circuits.rs). A new table: it locks nothing that exists.
CREATE TABLE outbox_replica_circuits (
    worker_id  text        PRIMARY KEY CHECK (length(worker_id) BETWEEN 1 AND 200),
    open_since timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now()
);
