-- no-transaction
-- The recipient lookup's index for the other ended messages: those whose payload has `cc`
-- or `bcc`, several addresses in `to`, or none a string. The GIN index of migration 17,
-- restricted to them, so that the rest no longer evaluate `outbox_recipient_keys`. Built
-- CONCURRENTLY, as the previous one; if it fails, drop it (DROP INDEX CONCURRENTLY
-- outbox_messages_many_recipients_idx) and migrate again.
CREATE INDEX CONCURRENTLY outbox_messages_many_recipients_idx
    ON outbox_messages USING gin (outbox_recipient_keys(payload)) WITH (fastupdate = off)
    WHERE (dispatched_at IS NOT NULL OR dead_lettered_at IS NOT NULL)
      AND NOT (coalesce(jsonb_typeof(payload -> 'to') = 'string', false)
               AND NOT payload ?| ARRAY['cc', 'bcc']);
