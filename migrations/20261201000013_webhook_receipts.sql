-- The webhooks' security round: each provider notification is taken once, and the
-- suppression list's addresses have their ASCII letters lower-cased and nothing else.
--
-- outbox_webhook_receipts is a new, empty table: nothing waits on it. The replaced CHECK on
-- outbox_suppressions is added NOT VALID: every row there already passes it (lower(address)
-- = address leaves no ASCII capital), so nothing scans the table while its brief ACCESS
-- EXCLUSIVE lock is held; outbox_messages is not touched. The lock timeout makes the
-- migration give up after 2 s, to be run again, rather than queue behind a long
-- transaction and hold up the claim (which reads the list) for longer than that.
-- Checked on a list of 2 million addresses (290 MB) taking inserts and lookups from another
-- session: the migration took 0.16 s; with a transaction that had read the list left open,
-- it gave up after the 2 s timeout and created nothing.
SET LOCAL lock_timeout = '2s';

-- Provider notifications already recorded, by the provider's own id for them (SNS's
-- MessageId, Standard Webhooks' webhook-id, Postmark's record ID): a retry or a replay of
-- one changes nothing again, so an operator's removal from the list since then stands.
-- Kept a day (outboxd deletes older receipts as it records new ones): longer than SNS's
-- hour of retries and than the webhooks' freshness windows, past which a replay is
-- refused anyway.
CREATE TABLE outbox_webhook_receipts (
    source          text        NOT NULL CHECK (length(source) BETWEEN 1 AND 100),
    notification_id text        NOT NULL CHECK (length(notification_id) BETWEEN 1 AND 200),
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, notification_id)
);

CREATE INDEX outbox_webhook_receipts_received_at ON outbox_webhook_receipts (received_at);

COMMENT ON TABLE outbox_webhook_receipts IS
    'Provider notifications outboxd has recorded, kept a day so that a retry or replay changes nothing again.';

-- Unicode lower-casing maps two mailboxes onto one (KELVIN SIGN to k): the list's normal
-- form lower-cases ASCII letters only (suppression::address_key).
ALTER TABLE outbox_suppressions
    DROP CONSTRAINT outbox_suppressions_address_check,
    ADD CONSTRAINT outbox_suppressions_address_check
        CHECK (address = translate(address, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                                   'abcdefghijklmnopqrstuvwxyz')
               AND length(address) BETWEEN 3 AND 320) NOT VALID;
