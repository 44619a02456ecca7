-- The relay that took each sent message (`host:port`, never credentials), for its timeline:
-- with fallback relays (OUTBOXD_SMTP_FALLBACK_URLS) an operator asks which one had it, and
-- its queue id in `smtp_reply` is that relay's.
--
-- A nullable column with no default: written in the catalog only, no row is rewritten. The
-- brief ACCESS EXCLUSIVE lock the ALTER takes is bounded by lock_timeout: behind a long
-- transaction the migration gives up after 2 s, to be run again.
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages ADD COLUMN relay text;

COMMENT ON COLUMN outbox_messages.relay IS
    'The relay (host:port) that accepted the message; NULL before it is sent, or when sent before migration 29.';
