-- Pausing a kind: its messages stay pending, unclaimed, until an operator resumes it.
--
-- outbox_kind_pauses is a new, empty table; the audit table gains a nullable column with
-- no default, which changes the catalog only (no rewrite, no scan). Its ACCESS EXCLUSIVE
-- lock is brief, and the lock timeout makes the migration give up after 2 s, to be run
-- again, rather than queue behind a long transaction. outbox_messages is not touched.
-- Checked on an audit table of a million rows with a session inserting into it: the
-- migration took a few milliseconds; with a transaction that had read the table left
-- open, it gave up after the 2 s timeout and changed nothing.
SET LOCAL lock_timeout = '2s';

-- One row per paused kind, read by every claim (a replica obeys a pause at its next
-- claim) and by the sampler (outbox_kind_paused{kind}). `automatic`: outboxd paused it on
-- a bounce or complaint breach (OUTBOXD_AUTO_PAUSE_KINDS), until an operator resumes it.
CREATE TABLE outbox_kind_pauses (
    kind      text        PRIMARY KEY,
    reason    text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    paused_by text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    automatic boolean     NOT NULL DEFAULT false
);

-- What an admin action was for, where it says (a pause's reason).
ALTER TABLE outbox_admin_audit ADD COLUMN detail text;
