-- The producer's W3C trace context, so that the send span links to the request that
-- caused the email. `outboxd::enqueue` fills it from the current span; other producers
-- may write it themselves (.NET: Activity.Current?.Id).
ALTER TABLE outbox_messages ADD COLUMN traceparent text
    CHECK (traceparent IS NULL OR length(traceparent) <= 128);

-- outbox_oldest_pending_age_seconds reads the first entry of this index: O(1) per sample,
-- however many rows the table keeps.
CREATE INDEX outbox_messages_pending_due_since_idx
    ON outbox_messages ((greatest(created_at, not_before)))
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL;
