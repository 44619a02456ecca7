-- Paused kinds (`outbox_kind_pauses`): pause, resume and list, each change audited. The
-- claim reads the table itself, so every replica obeys a pause at its next claim and a
-- pause outlives any restart.

-- name: pause_kind
-- Pauses a kind for an operator, or replaces the reason of a pause already on (keeping
-- when it began; an automatic pause becomes the operator's). Returns the pause as stored.
-- $1 kind (text), $2 reason (text), $3 paused_by (text)
-- Index: outbox_kind_pauses_pkey.
INSERT INTO {{schema}}outbox_kind_pauses (kind, reason, paused_by) VALUES ($1, $2, $3)
ON CONFLICT (kind) DO UPDATE
    SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by, automatic = false
RETURNING kind, reason, paused_by, paused_at, automatic

-- name: resume_kind
-- $1 kind (text)
-- Index: outbox_kind_pauses_pkey.
DELETE FROM {{schema}}outbox_kind_pauses WHERE kind = $1

-- name: list_pauses
-- Every paused kind, by kind.
-- No parameters.
-- Index: outbox_kind_pauses_pkey.
SELECT kind, reason, paused_by, paused_at, automatic FROM {{schema}}outbox_kind_pauses
ORDER BY kind

-- name: pause_kind_automatically
-- outboxd's own pause, unless the kind is paused already (by an operator, or by another
-- replica a moment before).
-- $1 kind (text), $2 reason (text), $3 paused_by (text: outboxd's actor)
-- Index: outbox_kind_pauses_pkey.
INSERT INTO {{schema}}outbox_kind_pauses (kind, reason, paused_by, automatic)
VALUES ($1, $2, $3, true) ON CONFLICT (kind) DO NOTHING

-- name: resumed_since
-- Whether an operator resumed the kind after a time, from a fresh snapshot: an automatic
-- pause is rolled back if so.
-- $1 kind (text), $2 since (timestamptz)
-- Index: none; the audit trail is read whole (it is short, and this runs only on a breach).
SELECT EXISTS (SELECT FROM {{schema}}outbox_admin_audit
               WHERE action = 'resume' /* word: audit.resume */ AND target = $1 AND at > $2)

-- name: recent_sends
-- A kind's latest $2 sends of the last day since it was last resumed (a resume re-arms the
-- check), and how many distinct recipient addresses (`outbox_recipient_keys`) among them
-- bounced hard (reported by a provider, or answered at once by the relay, discarded since
-- or not) or complained. The dead letters' and the discarded rows' parts keep an
-- operator's discard of the bounced dead letters from hiding them.
-- $1 kind (text), $2 window (bigint)
-- Index: outbox_messages_dispatched_idx, from now back; outbox_messages_dead_letter_idx;
-- outbox_messages_discarded_idx.
WITH armed AS (
    SELECT greatest(now() - interval '1 day', coalesce(max(at), '-infinity')) AS since
    FROM {{schema}}outbox_admin_audit
    WHERE action = 'resume' /* word: audit.resume */ AND target = $1
), latest AS (
    (SELECT feedback, dispatched_at AS at,
            CASE WHEN feedback IS NOT NULL THEN {{schema}}outbox_recipient_keys(payload) END AS recipients
     FROM {{schema}}outbox_messages
     WHERE dispatched_at IS NOT NULL AND dispatched_at > (SELECT since FROM armed)
       AND kind = $1
     ORDER BY dispatched_at DESC LIMIT $2)
    UNION ALL
    (SELECT feedback, dead_lettered_at,
            CASE WHEN feedback IS NOT NULL THEN {{schema}}outbox_recipient_keys(payload) END AS recipients
     FROM {{schema}}outbox_messages
     WHERE {{dead_letter}} AND dead_lettered_at > (SELECT since FROM armed)
       AND feedback = 'hard_bounce' /* word: mark.hard_bounce */ AND kind = $1)
    UNION ALL
    (SELECT feedback, dead_lettered_at,
            CASE WHEN feedback IS NOT NULL THEN {{schema}}outbox_recipient_keys(payload) END AS recipients
     FROM {{schema}}outbox_messages
     WHERE discarded_at IS NOT NULL AND discarded_at > (SELECT since FROM armed)
       AND dead_lettered_at > (SELECT since FROM armed)
       AND feedback = 'hard_bounce' /* word: mark.hard_bounce */ AND kind = $1)
    ORDER BY at DESC LIMIT $2
)
SELECT count(*) AS sends,
       (SELECT count(DISTINCT k) FROM latest AS l, unnest(l.recipients) AS k
        WHERE l.feedback = 'hard_bounce' /* word: mark.hard_bounce */) AS bounced_recipients,
       (SELECT count(DISTINCT k) FROM latest AS l, unnest(l.recipients) AS k
        WHERE l.feedback = 'complaint' /* word: mark.complaint */) AS complainers,
       (SELECT since FROM armed) AS since
FROM latest
