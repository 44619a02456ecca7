-- Predicates, column lists and expressions that more than one statement includes
-- (`{{NAME}}`, or `{{NAME(argument)}}` where the fragment reads `{{argument}}`). A predicate
-- that a partial index's matches must stay text in the statement, never a bound parameter:
-- PostgreSQL matches partial indexes at plan time, and a parameter would mean a scan of a
-- table that keeps millions of dispatched rows.

-- fragment: pending
-- A row still to send: the pending partial indexes' predicate.
dispatched_at IS NULL AND dead_lettered_at IS NULL

-- fragment: ended
-- A row that has ended, sent or dead-lettered: the recipient lookup's indexes' predicate
-- (migrations 19 and 20), with which of them holds the row.
(dispatched_at IS NOT NULL OR dead_lettered_at IS NOT NULL)

-- fragment: single_recipient
-- A payload with one recipient: `to` a string, and no `cc` or `bcc`. The recipient lookup's
-- B-tree index holds the ended rows that match (keyed by `outbox_single_recipient_key`,
-- migration 18), its GIN index the others (migrations 19 and 20, whose predicates this
-- repeats as text: the planner matches them so).
coalesce(jsonb_typeof(payload -> 'to') = 'string', false) AND NOT payload ?| ARRAY['cc', 'bcc']

-- fragment: dead_letter
-- A dead letter an operator has not discarded.
dead_lettered_at IS NOT NULL AND discarded_at IS NULL

-- fragment: active_suppression
-- A suppression list entry in force now: permanent, or temporary and not yet lapsed.
-- `{{argument}}` qualifies the column where a statement needs it (`o.`), or is empty.
({{argument}}suppressed_until IS NULL OR {{argument}}suppressed_until > now())

-- fragment: times_on_the_calendar
-- For an `UPDATE outbox_messages`' SET: the row's times moved into the years the table
-- allows (`outbox_on_the_calendar`, migration 12), since its CHECKs, added `NOT VALID`,
-- refuse any update of a row written before them that keeps a time off the calendar.
-- `next_attempt_at` is left to each statement, which may set it anyway.
created_at = {{schema}}outbox_on_the_calendar(created_at),
not_before = {{schema}}outbox_on_the_calendar(not_before),
expires_at = {{schema}}outbox_on_the_calendar(expires_at)

-- fragment: suppression_entries
-- Every entry of the suppression list with its scope: those of `outbox_suppressions` apply
-- to every kind (`all`), those of `outbox_lane_suppressions` (migration 26) to one lane. A
-- `WHERE address ...` on it is pushed into both halves, each a lookup of its primary key.
SELECT address, 'all' /* word: scope.all */ AS scope, reason, source, detail, message_id,
       created_at, created_by, suppressed_until
FROM {{schema}}outbox_suppressions
UNION ALL
SELECT address, lane, reason, source, detail, message_id, created_at, created_by,
       suppressed_until
FROM {{schema}}outbox_lane_suppressions

-- fragment: listed_entries
-- The entries in force of the suppression list for the addresses the argument (a query
-- yielding addresses in the list's form) yields, each as `key` with its reason and scope:
-- those listed by the address, and, once an erasure kept an entry as its address's one-way
-- mark (`outbox_installation.marked_suppressions`, migration 32), those listed by the
-- address's mark. Until then the second half is a one-time filter that reads nothing.
SELECT e.address AS key, e.reason, e.scope FROM ({{suppression_entries}}) AS e
WHERE e.address IN ({{argument}}) AND {{active_suppression(e.)}}
UNION ALL
SELECT k.key, e.reason, e.scope
FROM (SELECT DISTINCT q.x AS key FROM ({{argument}}) AS q(x)) AS k
CROSS JOIN LATERAL (SELECT * FROM ({{suppression_entries}}) AS s
                    WHERE s.address = {{schema}}outbox_erasure_mark(k.key)) AS e
WHERE (SELECT i.marked_suppressions FROM {{schema}}outbox_installation AS i)
  AND {{active_suppression(e.)}}

-- fragment: replaced_for_good
-- Of an `ON CONFLICT (address) DO UPDATE` on the suppression list by a report that
-- suppresses for good (a hard bounce, a complaint, an unsubscribe): the existing entries it
-- replaces, those that end (an operator's temporary entry, lapsed or not). Before, a
-- complaint during an operator's temporary entry was answered "recorded" and dropped, and
-- the complainer was mailed again when the entry ended.
outbox_suppressions.suppressed_until IS NOT NULL

-- fragment: recipients_column
-- The addresses of a payload's `to`, `cc` and `bcc` (each a string or an array of
-- strings), in that order, as a `recipients` text array; anything else is left out.
ARRAY(SELECT r.address #>> '{}'
      FROM unnest(ARRAY[payload->'to', payload->'cc', payload->'bcc'])
           WITH ORDINALITY AS f(field, i),
           jsonb_array_elements(CASE jsonb_typeof(f.field) WHEN 'array' THEN f.field
                                ELSE jsonb_build_array(f.field) END)
           WITH ORDINALITY AS r(address, j)
      WHERE jsonb_typeof(r.address) = 'string' ORDER BY f.i, r.j) AS recipients

-- fragment: address_key
-- An address as the suppression list keys it (`suppression::address_key`), from the text
-- `{{argument}}` of an envelope entry: the part between `<` and `>`, else the whole text,
-- trimmed, its ASCII letters lower-cased. `lower()` under the "C" collation changes A to Z
-- only; under another, it folds KELVIN SIGN into `k` and would take one mailbox for
-- another. `outbox_single_recipient_key` (migration 18) keys the recipient lookup's index
-- the same way.
lower(btrim(CASE WHEN strpos({{argument}}, '<') > 0
                 THEN coalesce(substring({{argument}} FROM '<([^<>]*)>[[:space:]]*$'), {{argument}})
                 ELSE {{argument}} END) COLLATE "C") COLLATE "default"

-- fragment: message_columns
-- What an operator sees of a message, for a `FROM outbox_messages AS m` to follow. Its
-- times are read through `outbox_on_the_calendar` (migration 12): a producer may have
-- written any time, and one the driver cannot read back must not take an operator's view
-- of the row down. Its secret fields' values are masked (migration 32).
SELECT id, kind,
       (CASE WHEN {{has_secrets(m)}} THEN {{masked_payload(m)}} ELSE payload END)::text AS payload,
       CASE WHEN {{has_secrets(m)}} THEN {{schema}}outbox_secret_fields_of(kind, secret_fields)
            ELSE ARRAY[]::text[] END AS secret_fields,
       {{schema}}outbox_on_the_calendar(secrets_scrubbed_at) AS secrets_scrubbed_at,
       {{schema}}outbox_on_the_calendar(payload_removed_at) AS payload_removed_at,
       {{recipients_column}},
       CASE WHEN dispatched_at IS NOT NULL THEN 'dispatched'
            WHEN dead_lettered_at IS NULL THEN 'pending'
            WHEN end_reason IS NOT NULL THEN end_reason
            WHEN discarded_at IS NULL THEN 'dead_lettered'
            ELSE 'discarded' END AS state,
       attempts, last_error, error_class,
       {{schema}}outbox_on_the_calendar(created_at) AS created_at,
       {{schema}}outbox_on_the_calendar(not_before) AS not_before,
       {{schema}}outbox_on_the_calendar(next_attempt_at) AS next_attempt_at,
       {{schema}}outbox_on_the_calendar(dispatched_at) AS dispatched_at,
       {{schema}}outbox_on_the_calendar(dead_lettered_at) AS dead_lettered_at,
       {{schema}}outbox_on_the_calendar(discarded_at) AS discarded_at, discarded_by, locked_by,
       traceparent, priority, {{schema}}outbox_on_the_calendar(expires_at) AS expires_at,
       idempotency_key, end_reason, feedback,
       {{schema}}outbox_on_the_calendar(feedback_at) AS feedback_at, smtp_reply, sent_by, send_ms,
       coalesce(tags, ARRAY[]::text[]) AS tags, relay

-- fragment: regular_due
-- The transactional lane's due rows from its floor, in due order, locked and skipped as
-- every tier of the claim locks and skips, `{{argument}}` of them: the claim's `regular`
-- tier, and its head, which the `urgent` tier measures a priority row's turn against. One
-- text for both, so that the head is always a row the tier could take. The claim's $4, $7,
-- $8 and $10.
FROM {{schema}}outbox_messages
WHERE {{pending}}
  AND 'transactional' /* word: lane.transactional */ = ANY($10)
  AND next_attempt_at <= coalesce($4, now())
  AND next_attempt_at >= coalesce($7, '-infinity') AND priority = 0
  AND kind <> ALL($8) AND kind <> ALL((SELECT kinds FROM paused)::text[])
ORDER BY next_attempt_at, id
LIMIT {{argument}}
FOR NO KEY UPDATE SKIP LOCKED

-- fragment: has_secrets
-- Whether the message named by the argument has secret fields (migration 32): its own, or
-- its kind's. The subquery runs once a statement; each row then costs a hash lookup.
({{argument}}.secret_fields IS NOT NULL
 OR {{argument}}.kind IN (SELECT p.kind FROM {{schema}}outbox_kind_policies AS p
                          WHERE p.secret_fields <> '{}'))

-- fragment: masked_payload
-- The payload of the message named by the argument, each of its secret fields' values
-- "[secret]": what every reader shows, and what is kept once the message ends.
{{schema}}outbox_masked({{argument}}.payload,
                        {{schema}}outbox_secret_fields_of({{argument}}.kind, {{argument}}.secret_fields))
