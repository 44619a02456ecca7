-- no-transaction
-- The oldest-pending gauge's index, again, with one more condition in its predicate. The
-- index it replaces had the same predicate as the due index, so the planner could serve
-- a claim from it: a whole scan of every pending row's entry, sorted, instead of the due
-- index from the claim floor. Under a transaction held open elsewhere that walked every
-- message sent since it began (seen in the benchmark's longtx scenario). The sampler's
-- `greatest(...) <= now()` implies the new condition; a claim's conditions do not, so a
-- claim can only use the due index. Built CONCURRENTLY; the old index goes in the next
-- migration, so the gauge has an index all along.
CREATE INDEX CONCURRENTLY outbox_messages_pending_since_idx
    ON outbox_messages ((greatest(created_at, not_before)))
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL
      AND greatest(created_at, not_before) IS NOT NULL;
