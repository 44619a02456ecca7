-- A message "sent" with no SMTP server configured was only logged: it now ends unsent, as
-- an expired or suppressed one does, with end_reason 'logged_only', never as sent. The
-- CHECK on end_reason is replaced to take the new word: NOT VALID, so no row is read; the
-- brief ACCESS EXCLUSIVE lock the ALTER takes is bounded by lock_timeout, so the migration
-- gives up after 2 s (to be run again) rather than queue every insert behind a long
-- transaction that holds the table. Checked: behind an open INSERT it gives up after 2 s
-- with nothing changed, and goes through once that transaction ends
-- (tests/it/migrations.rs).
SET LOCAL lock_timeout = '2s';

ALTER TABLE outbox_messages
    DROP CONSTRAINT outbox_messages_end_reason_check,
    ADD CONSTRAINT outbox_messages_end_reason_check
        CHECK (end_reason IS NULL OR (end_reason IN ('expired', 'suppressed', 'logged_only')
                                      AND dead_lettered_at IS NOT NULL)) NOT VALID;
