-- no-transaction
-- The recipient lookup's index for ended messages with one recipient (most of them): a
-- B-tree over `outbox_single_recipient_key`, for the payloads whose `to` is a string and
-- that have no `cc` or `bcc` (src/store/sql.rs, `single_recipient!`, repeats the predicate
-- for the lookup, which must match it as text). It replaces, for those rows, the GIN index
-- of migration 17, which evaluated `outbox_recipient_keys` (ten microseconds: two thirds
-- of the outcome write's PostgreSQL time in a drain) and wrote 176 B of WAL a message,
-- half of it full-page images of its splits; a B-tree entry costs about 80 B. Messages
-- with any other envelope go into the next migration's GIN index.
--
-- Built CONCURRENTLY, so writes go on while it builds; if it fails part-way it is left
-- INVALID and `outboxd migrate` stops: drop it (DROP INDEX CONCURRENTLY
-- outbox_messages_single_recipient_idx) and migrate again. It waits for transactions older
-- than itself to end, without blocking anyone meanwhile.
--
-- Checked on a table of 2 million sent rows with a session inserting 200 rows a second:
-- migrations 18 to 22 took 30 s together while the inserts went on (p50 1.0 ms, p99
-- 7.2 ms, the slowest 62 ms). This index is 77 MB there, the GIN index it replaces 42 MB:
-- a B-tree keeps each address whole.
CREATE INDEX CONCURRENTLY outbox_messages_single_recipient_idx
    ON outbox_messages (outbox_single_recipient_key(payload))
    WHERE (dispatched_at IS NOT NULL OR dead_lettered_at IS NOT NULL)
      AND coalesce(jsonb_typeof(payload -> 'to') = 'string', false)
      AND NOT payload ?| ARRAY['cc', 'bcc'];
