-- Erasure by recipient (`outboxd erase`, `POST /api/v1/erase`): an address's pending
-- messages cancelled, the payloads of its messages removed (their recipient lists kept,
-- the address replaced by its one-way mark, `outbox_erasure_mark`, migration 32), and every
-- text of outboxd's tables that holds the address (a relay's reply, an error, a timeline's
-- detail, a callback, an audit entry, an idempotency key) rewritten with the mark. Each
-- statement changes a bounded batch, so that no lock is held long and delivery goes on.
-- Parameters shared by the statements that rewrite text: the address's key (the claim's
-- form) and its mark, and `pattern`: a regular expression matching the key as written
-- anywhere (its punctuation escaped; matched without regard to case).

-- fragment: erased_recipients
-- The recipients field named by the argument (`to`, `cc` or `bcc`: a string or an array)
-- of the message `m`, each element whose key is $1 replaced by the mark $2.
CASE jsonb_typeof(m.payload -> '{{argument}}')
    WHEN 'string' THEN
        CASE WHEN {{address_key((m.payload ->> '{{argument}}'))}} = $1 THEN to_jsonb($2::text)
             ELSE m.payload -> '{{argument}}' END
    WHEN 'array' THEN
        (SELECT jsonb_agg(CASE WHEN jsonb_typeof(x.e) = 'string'
                                    AND {{address_key((x.e #>> '{}'))}} = $1
                               THEN to_jsonb($2::text) ELSE x.e END ORDER BY x.i)
         FROM jsonb_array_elements(m.payload -> '{{argument}}') WITH ORDINALITY AS x(e, i))
END

-- fragment: erased_payload
-- What is kept of the payload of the message `m` to the key $1: its recipient lists, the
-- address marked.
jsonb_strip_nulls(jsonb_build_object('to', {{erased_recipients(to)}},
                                     'cc', {{erased_recipients(cc)}},
                                     'bcc', {{erased_recipients(bcc)}}))

-- fragment: unmarked
-- The text named by the argument with every writing of the address ($3, a pattern)
-- replaced by its mark ($2).
regexp_replace({{argument}}, $3, $2, 'gi')

-- fragment: unmarked_key
-- An idempotency key that holds the address, replaced whole by its own mark (unique as the
-- key was, and within the key's 200 characters); any other key as it is.
CASE WHEN {{argument}} ~* $3 THEN {{schema}}outbox_erasure_mark({{argument}}) ELSE {{argument}} END

-- fragment: unmarked_history
-- The timelines and callbacks of the messages `changed`, the address marked in them.
history AS (
    UPDATE {{schema}}outbox_message_events AS e
    SET detail = {{unmarked(e.detail)}}, actor = {{unmarked(e.actor)}}
    WHERE e.message_id IN (SELECT id FROM changed) AND (e.detail ~* $3 OR e.actor ~* $3)
), history_callbacks AS (
    UPDATE {{schema}}outbox_callbacks AS c
    SET detail = {{unmarked(c.detail)}}, last_error = {{unmarked(c.last_error)}}
    WHERE c.message_id IN (SELECT id FROM changed) AND (c.detail ~* $3 OR c.last_error ~* $3)
)

-- name: erasure_mark
-- An address's one-way mark.
-- $1 key (text)
-- Index: none; reads the installation's one row.
SELECT {{schema}}outbox_erasure_mark($1)

-- name: erase_pending
-- Walks the next $4 pending messages in due order after the keyset ($5, $6) and cancels
-- those to the address, erasing their payloads; those a replica holds are marked, as a
-- cancel marks them, and erased once they end (the caller's second pass). Returns the
-- walk's last key and counts.
-- $1 key (text), $2 mark (text), $3 pattern (text), $4 limit (bigint): the most rows
-- walked, $5 after due (timestamptz, null from the start), $6 after id (bigint), $7 who
-- (text)
-- Index: outbox_messages_due_idx (pending), walked from the keyset on.
WITH walked AS MATERIALIZED (
    SELECT m.id, m.next_attempt_at FROM {{schema}}outbox_messages AS m
    WHERE {{pending}}
      AND ($5::timestamptz IS NULL OR (m.next_attempt_at, m.id) > ($5, $6))
    ORDER BY m.next_attempt_at, m.id
    LIMIT $4
), doomed AS MATERIALIZED (
    SELECT m.id, m.claim_token IS NOT NULL AND m.locked_until > now() AS in_flight
    FROM {{schema}}outbox_messages AS m JOIN walked AS w ON w.id = m.id
    WHERE {{pending}} AND $1 = ANY({{schema}}outbox_recipient_keys(m.payload))
    FOR NO KEY UPDATE OF m
), changed AS (
    UPDATE {{schema}}outbox_messages AS m
    SET cancel_requested_at = now(), cancelled_by = $7,
        dead_lettered_at = CASE WHEN d.in_flight THEN NULL ELSE now() END,
        end_reason = CASE WHEN d.in_flight THEN NULL ELSE 'cancelled' /* word: action.cancelled */ END,
        discarded_at = CASE WHEN d.in_flight THEN NULL ELSE now() END,
        discarded_by = CASE WHEN d.in_flight THEN NULL ELSE $7 END,
        payload = CASE WHEN d.in_flight THEN m.payload ELSE {{erased_payload}} END,
        payload_removed_at = CASE WHEN d.in_flight THEN NULL ELSE now() END,
        last_error = {{unmarked(m.last_error)}},
        idempotency_key = {{unmarked_key(m.idempotency_key)}},
        locked_until = CASE WHEN d.in_flight THEN m.locked_until END,
        locked_by = CASE WHEN d.in_flight THEN m.locked_by END,
        claim_token = CASE WHEN d.in_flight THEN m.claim_token END
    FROM doomed AS d
    WHERE m.id = d.id
    RETURNING m.id, d.in_flight
), {{cancel_effects($7)}}, {{unmarked_history}}
SELECT (SELECT next_attempt_at FROM walked ORDER BY next_attempt_at DESC, id DESC LIMIT 1) AS last_due,
       (SELECT id FROM walked ORDER BY next_attempt_at DESC, id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM walked) AS walked,
       (SELECT count(*) FROM changed WHERE NOT in_flight) AS cancelled,
       (SELECT count(*) FROM changed WHERE in_flight) AS in_flight

-- name: erase_ended
-- Erases the next $4 ended messages to the address: their payloads reduced to their
-- recipient lists with the address marked, and the address marked in every text of their
-- rows, their timelines and their callbacks. An erased message no longer matches the
-- address, so the next batch finds the rest. Returns how many it changed.
-- $1 key (text), $2 mark (text), $3 pattern (text), $4 limit (bigint)
-- Index: outbox_messages_single_recipient_idx and outbox_messages_many_recipients_idx
-- (whose predicates `ended` and `single_recipient` repeat), as the recipient lookup;
-- outbox_message_events_message_idx; outbox_callbacks_message_idx.
WITH found AS MATERIALIZED (
    SELECT id FROM {{schema}}outbox_messages
    WHERE {{ended}} AND {{single_recipient}}
      AND {{schema}}outbox_single_recipient_key(payload) = $1
    UNION ALL
    SELECT id FROM {{schema}}outbox_messages
    WHERE {{ended}} AND NOT ({{single_recipient}})
      AND {{schema}}outbox_recipient_keys(payload) && ARRAY[$1]
), doomed AS MATERIALIZED (
    SELECT m.id FROM {{schema}}outbox_messages AS m
    WHERE m.id IN (SELECT id FROM found ORDER BY id LIMIT $4)
    FOR NO KEY UPDATE OF m
), changed AS (
    UPDATE {{schema}}outbox_messages AS m
    SET payload = {{erased_payload}}, payload_removed_at = now(),
        last_error = {{unmarked(m.last_error)}},
        smtp_reply = {{unmarked(m.smtp_reply)}},
        idempotency_key = {{unmarked_key(m.idempotency_key)}}
    FROM doomed AS d WHERE m.id = d.id
    RETURNING m.id
), {{unmarked_history}}
SELECT count(*) FROM changed

-- name: audit_ids
-- The range of the audit trail's ids, for a walk over it.
-- No parameters.
-- Index: outbox_admin_audit_pkey.
SELECT coalesce(min(id), 0) AS first, coalesce(max(id), 0) AS last FROM {{schema}}outbox_admin_audit

-- name: erase_audit
-- Marks the address in the audit trail's entries with ids from $4 to $5 (a lookup of it,
-- a suppression of it, an operator named by it). Returns how many it changed.
-- $1 key (text, unused but for the shared parameters), $2 mark (text), $3 pattern (text),
-- $4 from id (bigint), $5 to id (bigint)
-- Index: outbox_admin_audit_pkey, the range.
UPDATE {{schema}}outbox_admin_audit
SET target = {{unmarked(target)}}, detail = {{unmarked(detail)}}, actor = {{unmarked(actor)}}
WHERE id BETWEEN $4 AND $5 AND $1::text IS NOT NULL
  AND (target ~* $3 OR detail ~* $3 OR actor ~* $3)

-- name: erase_pauses
-- Marks the address in the kinds' pauses (an operator's reason, who paused).
-- $1 key (text, unused but for the shared parameters), $2 mark (text), $3 pattern (text)
-- Index: none; a row per paused kind.
UPDATE {{schema}}outbox_kind_pauses
SET reason = left({{unmarked(reason)}}, 500), paused_by = {{unmarked(paused_by)}}
WHERE $1::text IS NOT NULL AND (reason ~* $3 OR paused_by ~* $3)

-- name: mark_suppressions
-- Replaces the address's entries of the suppression list by entries of its mark, which the
-- claim honours from then on (`listed_entries`), and says so to every replica's claim. An
-- entry of the mark already there (an earlier erasure) is replaced when it would end and
-- the moved one does not: an opt-out is never weakened.
-- Returns how many entries it moved.
-- $1 key (text), $2 mark (text), $3 pattern (text)
-- Index: outbox_suppressions_pkey; outbox_lane_suppressions_pkey.
WITH everywhere AS (
    DELETE FROM {{schema}}outbox_suppressions WHERE address = $1
    RETURNING reason, source, detail, message_id, created_at, created_by, suppressed_until
), everywhere_marked AS (
    INSERT INTO {{schema}}outbox_suppressions
        (address, reason, source, detail, message_id, created_at, created_by, suppressed_until)
    SELECT $2, reason, source, left({{unmarked(detail)}}, 1000), message_id, created_at,
           {{unmarked(created_by)}}, suppressed_until
    FROM everywhere
    ON CONFLICT (address) DO UPDATE
    SET reason = excluded.reason, source = excluded.source, detail = excluded.detail,
        message_id = excluded.message_id, created_at = excluded.created_at,
        created_by = excluded.created_by, suppressed_until = excluded.suppressed_until
    WHERE {{replaced_for_good}} OR excluded.suppressed_until IS NULL
), lanes AS (
    DELETE FROM {{schema}}outbox_lane_suppressions WHERE address = $1
    RETURNING lane, reason, source, detail, message_id, created_at, created_by, suppressed_until
), lanes_marked AS (
    INSERT INTO {{schema}}outbox_lane_suppressions
        (address, lane, reason, source, detail, message_id, created_at, created_by, suppressed_until)
    SELECT $2, lane, reason, source, left({{unmarked(detail)}}, 1000), message_id, created_at,
           {{unmarked(created_by)}}, suppressed_until
    FROM lanes
    ON CONFLICT (address, lane) DO UPDATE
    SET reason = excluded.reason, source = excluded.source, detail = excluded.detail,
        message_id = excluded.message_id, created_at = excluded.created_at,
        created_by = excluded.created_by, suppressed_until = excluded.suppressed_until
    WHERE outbox_lane_suppressions.suppressed_until IS NOT NULL
       OR excluded.suppressed_until IS NULL
), flagged AS (
    UPDATE {{schema}}outbox_installation SET marked_suppressions = true
    WHERE NOT marked_suppressions
      AND (EXISTS (SELECT FROM everywhere) OR EXISTS (SELECT FROM lanes))
)
SELECT (SELECT count(*) FROM everywhere) + (SELECT count(*) FROM lanes)
