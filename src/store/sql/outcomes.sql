-- A claim's outcomes, written where its token still holds, in three statements that share
-- their parts: as they come (`record_outcomes`), skipping rows another transaction has
-- locked (`record_outcomes_skipping_locked`), and waiting for those locks as long as they
-- last (`record_outcomes_waiting`). docs/adr/0002-writing-outcomes.md says why.
-- Parameters of all three:
-- $1 claim_token (uuid): the claim's token; a row another claimer took over is not written.
-- $2 ids (bigint[]), $3 actions (text[]), $4 errors (text[]), $5 delays (float8[] seconds),
-- $6 error classes (text[]), $8 bounced recipients (text[]), $9 whether to suppress each
--    (bool[]), $10 replies (text[]), $11 how long each send took (int4[] ms): one element a
--    outcome, in the same order.
-- $7 channel (text): the insert trigger's channel, told when a release makes a row due now.
-- $12 worker_id (text): the replica, kept as a send's `sent_by` and each event's actor.
-- $13 relays (text[]): the relay that took each sent message (`host:port`), one element an
--    outcome, null for the others.

-- fragment: outcome_values
-- The outcomes as rows `o`, limited to as many as there are: that changes nothing but the
-- plan PostgreSQL keeps (the ADR's *Plans*).
(SELECT * FROM unnest($2::bigint[], $3::text[], $4::text[], $5::float8[], $6::text[],
                      $8::text[], $9::bool[], $10::text[], $11::int4[], $13::text[])
           AS u(id, action, error, delay_secs, error_class, bounced, suppress, reply, took_ms,
                relay)
 LIMIT cardinality($2::bigint[])) AS o

-- fragment: outcome_set
-- What each outcome writes on its row. `attempts` stops at the integer's end: a producer may
-- write any count, and an overflow would fail the outcomes of the whole batch, again at
-- every try. `throttled_releases` counts from zero: a negative count written by a producer
-- would buy its row that many more releases without an attempt.
attempts = m.attempts + CASE WHEN o.action IN ('retry' /* word: action.retry */, 'dead' /* word: action.dead */)
                             AND m.attempts < 2147483647 THEN 1 ELSE 0 END,
throttled_releases = greatest(m.throttled_releases, 0)
    + CASE WHEN o.action = 'release' /* word: action.release */
                AND o.error_class = 'throttled' /* word: class.throttled */ THEN 1 ELSE 0 END,
last_error = coalesce(o.error, m.last_error),
error_class = coalesce(o.error_class, m.error_class),
dispatched_at = CASE WHEN o.action = 'sent' /* word: action.sent */ THEN now() END,
dead_lettered_at = CASE WHEN o.action IN ({{ended_unsent}}, 'dead' /* word: action.dead */)
                             OR {{cancelled_in_flight}} THEN now() END,
discarded_at = CASE WHEN o.action IN ({{ended_unsent}}) OR {{cancelled_in_flight}} THEN now()
                    ELSE m.discarded_at END,
discarded_by = CASE WHEN o.action IN ({{ended_unsent}}) OR {{cancelled_in_flight}}
                    THEN coalesce(m.cancelled_by, 'outboxd' /* word: actor.automatic */)
                    ELSE m.discarded_by END,
end_reason = CASE WHEN o.action IN ({{ended_unsent}}) THEN o.action
                  WHEN {{cancelled_in_flight}} THEN 'cancelled' /* word: action.cancelled */
                  ELSE m.end_reason END,
feedback = CASE WHEN o.bounced IS NOT NULL THEN 'hard_bounce' /* word: mark.hard_bounce */
                ELSE m.feedback END,
feedback_at = CASE WHEN o.bounced IS NOT NULL THEN now() ELSE m.feedback_at END,
smtp_reply = CASE WHEN o.action = 'sent' /* word: action.sent */ THEN o.reply ELSE m.smtp_reply END,
sent_by = CASE WHEN o.action = 'sent' /* word: action.sent */ THEN $12 ELSE m.sent_by END,
send_ms = CASE WHEN o.action = 'sent' /* word: action.sent */ THEN o.took_ms ELSE m.send_ms END,
relay = CASE WHEN o.action = 'sent' /* word: action.sent */ THEN o.relay ELSE m.relay END,
next_attempt_at = CASE WHEN o.action IN ('retry' /* word: action.retry */, 'release' /* word: action.release */)
                       THEN now() + make_interval(secs => o.delay_secs)
                       ELSE m.next_attempt_at END,
payload = CASE WHEN {{outcome_ends}} AND {{has_secrets(m)}} THEN {{masked_payload(m)}}
               ELSE m.payload END,
secrets_scrubbed_at = CASE WHEN {{outcome_ends}} AND {{has_secrets(m)}} THEN now()
                           ELSE m.secrets_scrubbed_at END,
locked_until = NULL, locked_by = NULL, claim_token = NULL

-- fragment: outcome_ends
-- Whether the outcome `o` ends its message `m`: sent, dead, ended unsent, or withdrawn
-- while claimed. Its secret fields are scrubbed then.
(o.action IN ('sent' /* word: action.sent */, 'dead' /* word: action.dead */, {{ended_unsent}})
 OR {{cancelled_in_flight}})

-- fragment: ended_unsent
-- The actions that end a message unsent, not for a failure: also its `end_reason`.
'expired' /* word: action.expired */, 'suppressed' /* word: action.suppressed */,
'logged_only' /* word: action.logged_only */, 'cancelled' /* word: action.cancelled */

-- fragment: cancelled_in_flight
-- The producer withdrew the message while this claim held it (`outbox_cancel`): a send
-- that failed or was given back ends it as cancelled, never to be tried again.
(m.cancel_requested_at IS NOT NULL
 AND o.action IN ('retry' /* word: action.retry */, 'release' /* word: action.release */))

-- fragment: outcome_returning
RETURNING m.id, o.action, o.bounced, o.suppress, o.error, o.error_class, o.took_ms, o.reply,
          m.end_reason = 'cancelled' /* word: action.cancelled */
              AND o.action <> 'cancelled' /* word: action.cancelled */ AS cancelled_in_flight,
          m.cancelled_by

-- fragment: outcome_effects
-- What follows from the rows `updated`, in the same statement: every outcome but a send is
-- an event of its message's timeline; a release makes its row due now, which may be below
-- another dispatcher's claim floor, so the trigger's channel is told, as for a new row; a
-- recipient the server said does not exist is suppressed, so the list and the outcome
-- cannot disagree; and, with callbacks on (migration 31), each message's end is kept for
-- the application (`message.sent` with the relay's reply, `message.bounced` for a recipient
-- the server said does not exist, ...).
events AS (
    INSERT INTO {{schema}}outbox_message_events
        (message_id, event, actor, error_class, detail, duration_ms)
    SELECT id, action, $12, error_class, error, took_ms FROM updated
    WHERE action <> 'sent' /* word: action.sent */
    UNION ALL
    SELECT id, 'cancelled' /* word: action.cancelled */, cancelled_by, NULL, NULL, NULL
    FROM updated WHERE cancelled_in_flight
), notified AS (
    SELECT pg_notify($7, floor(extract(epoch FROM now()) * 1000)::bigint::text)
    FROM updated WHERE action = 'release' /* word: action.release */ LIMIT 1
), suppressed AS (
    INSERT INTO {{schema}}outbox_suppressions (address, reason, source, detail, message_id)
    SELECT DISTINCT ON (bounced) bounced, 'hard_bounce' /* word: reason.hard_bounce */,
           'smtp' /* word: source.smtp */, left(error, 1000 /* word: limit.detail_chars */), id
    FROM updated WHERE bounced IS NOT NULL AND suppress
    ON CONFLICT (address) DO UPDATE SET
        reason = excluded.reason, source = excluded.source, detail = excluded.detail,
        message_id = excluded.message_id, created_at = now(), created_by = NULL,
        suppressed_until = NULL
    WHERE {{replaced_for_good}}
), callbacks AS (
    INSERT INTO {{schema}}outbox_callbacks (message_id, event, detail)
    SELECT id,
           CASE WHEN cancelled_in_flight THEN 'message.cancelled' /* word: callback.cancelled */
                WHEN action = 'sent' /* word: action.sent */ THEN 'message.sent' /* word: callback.sent */
                WHEN action = 'dead' /* word: action.dead */ AND bounced IS NOT NULL
                    THEN 'message.bounced' /* word: callback.bounced */
                WHEN action = 'dead' /* word: action.dead */ THEN 'message.dead_lettered' /* word: callback.dead_lettered */
                WHEN action = 'suppressed' /* word: action.suppressed */ THEN 'message.suppressed' /* word: callback.suppressed */
                WHEN action = 'expired' /* word: action.expired */ THEN 'message.expired' /* word: callback.expired */
                ELSE 'message.cancelled' /* word: callback.cancelled */ END,
           CASE WHEN action = 'sent' /* word: action.sent */ THEN reply
                WHEN cancelled_in_flight THEN cancelled_by ELSE error END
    FROM updated
    WHERE {{callbacks_on}}
      AND (cancelled_in_flight
           OR action IN ('sent' /* word: action.sent */, 'dead' /* word: action.dead */,
                         'suppressed' /* word: action.suppressed */,
                         'expired' /* word: action.expired */,
                         'cancelled' /* word: action.cancelled */))
)

-- name: record_outcomes
-- Outcomes as they come: a row lock is rare, so the statement waits a moment for one
-- (`lock_timeout`, set for the statement's transaction before its first row) rather than
-- lock every row first. When it did not time out, no row was locked, and those it did not
-- write are no longer this claim's. Parameters: the file's.
-- Index: outbox_messages_pkey, one lookup an outcome; outbox_suppressions_pkey.
WITH updated AS (
    UPDATE {{schema}}outbox_messages AS m
    SET {{outcome_set}}
    FROM {{outcome_values}}
    WHERE m.id = o.id AND m.claim_token = $1
      AND (SELECT set_config('lock_timeout', '1s', true)) IS NOT NULL
    {{outcome_returning}}
), {{outcome_effects}}
SELECT id, true FROM updated WHERE (SELECT count(*) FROM notified) >= 0

-- name: record_outcomes_skipping_locked
-- Outcomes where a row lock was met: each row is locked first, skipping those another
-- transaction holds (in the mode an `UPDATE` that keeps the key takes, so that a foreign
-- key's `KEY SHARE` does not count), which it returns as not written. Locking every row
-- costs PostgreSQL about an eighth more in a drain, so it is not the usual statement. No
-- `lock_timeout`: a lock on a suppression row the statement updates is waited out, as any
-- other lock on a table outboxd writes to. Parameters: the file's.
-- Index: outbox_messages_pkey; outbox_suppressions_pkey.
WITH mine AS MATERIALIZED (
    SELECT id FROM {{schema}}outbox_messages WHERE id = ANY($2) AND claim_token = $1
    FOR NO KEY UPDATE SKIP LOCKED
), updated AS (
    UPDATE {{schema}}outbox_messages AS m
    SET {{outcome_set}}
    FROM mine JOIN {{outcome_values}} ON o.id = mine.id
    WHERE m.id = o.id AND m.claim_token = $1
    {{outcome_returning}}
), {{outcome_effects}}
SELECT id, true FROM updated WHERE (SELECT count(*) FROM notified) >= 0
UNION ALL
SELECT id, false FROM {{schema}}outbox_messages
WHERE id = ANY($2) AND claim_token = $1 AND id NOT IN (SELECT id FROM mine)

-- name: record_outcomes_waiting
-- Outcomes whose rows were locked, written by a connection that waits for the locks as long
-- as they last: the moment a lock goes, the row is this write's, before another replica's
-- claim (which skips locked rows) can take it once its lease has run out. Parameters: the
-- file's.
-- Index: outbox_messages_pkey; outbox_suppressions_pkey.
WITH updated AS (
    UPDATE {{schema}}outbox_messages AS m
    SET {{outcome_set}}
    FROM {{outcome_values}}
    WHERE m.id = o.id AND m.claim_token = $1
    {{outcome_returning}}
), {{outcome_effects}}
SELECT id, true FROM updated WHERE (SELECT count(*) FROM notified) >= 0
