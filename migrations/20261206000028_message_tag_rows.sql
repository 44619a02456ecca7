-- no-transaction
-- The index that finds messages by tag: GIN over `tags`, for the rows that have any (a
-- message without tags costs no index entry, and no work at its insert). Read by
-- `messages_by_tag` and the dead-letter list's tag filter (`tags @> ARRAY[$1]`).
--
-- Built CONCURRENTLY, so writes go on while it builds; if it fails part-way it is left
-- INVALID and `outboxd migrate` stops: drop it (DROP INDEX CONCURRENTLY
-- outbox_messages_tags_idx) and migrate again. It waits for transactions older than itself
-- to end, without blocking anyone meanwhile. On an existing table every row has NULL tags,
-- so it reads the table once and writes an empty index.
CREATE INDEX CONCURRENTLY outbox_messages_tags_idx
    ON outbox_messages USING gin (tags)
    WHERE tags IS NOT NULL;
