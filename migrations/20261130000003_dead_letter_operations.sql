-- Dead-letter operations and retention.

-- A short, stable name for the last failure (smtp_550, smtp_451, unreachable, render,
-- address, unknown_kind, header_injection), so dead letters can be grouped.
ALTER TABLE outbox_messages ADD COLUMN error_class text;

-- An operator gave up on a dead letter: the row is kept, out of the dead-letter view and
-- gauge, and pruned with the sent rows after the retention period.
ALTER TABLE outbox_messages ADD COLUMN discarded_at timestamptz;
ALTER TABLE outbox_messages ADD COLUMN discarded_by text;

-- The dead-letter view, newest first (keyset pagination on id), without discarded rows.
DROP INDEX outbox_messages_dead_letter_idx;
CREATE INDEX outbox_messages_dead_letter_idx
    ON outbox_messages (id DESC)
    WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL;

-- The pruner deletes in small batches, oldest first, reading only what it deletes.
CREATE INDEX outbox_messages_dispatched_idx
    ON outbox_messages (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX outbox_messages_discarded_idx
    ON outbox_messages (discarded_at)
    WHERE discarded_at IS NOT NULL;

-- Every admin action: who, when, what, how many rows.
CREATE TABLE outbox_admin_audit (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    action text        NOT NULL,
    target text        NOT NULL,
    rows   integer     NOT NULL
);
