-- Room on each page for a row's later versions, and the key of the recipient lookup's
-- B-tree index (next migration).
--
-- A row is written three times: by the producer's INSERT, by the claim (its lease) and by
-- the outcome. Pages filled to 100% left no room for the later versions, so each update
-- moved its row to another page: PostgreSQL then writes a row-lock record before the
-- update (to release the page while it finds another), the whole new row rather than the
-- bytes that changed, and a full-page image of one more page after a checkpoint. That was
-- 2.9 row-lock records a message where the claim takes one, and 612 B of update records.
-- With half of each new page left free, the versions stay on their page (bench/run.py
-- dbcost, 20 000 messages: 1.18 row-lock records a message, update records 275 B; the
-- drain's WAL 1 650 -> 1 197 B a message, the PostgreSQL CPU unchanged). The cost is room:
-- a page of sent rows holds half as many as before, until retention deletes them.
--
-- `fillfactor` applies to pages written from now on; nothing is rewritten. Setting it takes
-- a SHARE UPDATE EXCLUSIVE lock, which blocks no read or write (only vacuum and other
-- schema changes), and the lock timeout makes the migration give up after 2 s rather than
-- wait behind a vacuum or a schema change; a transaction that only reads or writes the
-- table does not hold it up. Checked on a table of 2 million sent rows with a session
-- inserting 200 rows a second: see migration 19.
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages SET (fillfactor = 50);

-- The recipient of a payload that names exactly one (`to` a string, and no `cc` or `bcc`:
-- most messages) in the lookup's form, exactly as `outbox_recipient_keys` writes it: the
-- part between `<` and `>`, else the whole text, trimmed, its ASCII letters lower-cased
-- (`lower` under the "C" collation changes A to Z only, as `translate` over them did, at a
-- twentieth of the cost). A plain expression, which PostgreSQL inlines: evaluated for the
-- index at each outcome that ends such a row, it costs under a microsecond where
-- `outbox_recipient_keys`, a function with a subquery, costs ten. Which payloads have one
-- recipient is written out in the indexes' predicates (next migrations) rather than in a
-- function: a partial index's predicate is prepared at every insert into the table, a
-- producer's too, and a function there would need EXECUTE from every producer's role.
CREATE FUNCTION outbox_single_recipient_key(payload jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT lower(btrim(CASE WHEN strpos(payload ->> 'to', '<') > 0
                            THEN coalesce(substring(payload ->> 'to'
                                                    FROM '<([^<>]*)>[[:space:]]*$'),
                                          payload ->> 'to')
                            ELSE payload ->> 'to' END) COLLATE "C") COLLATE "default"
    $$;
