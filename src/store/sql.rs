//! SQL fragments and stored words that more than one statement uses, each defined once.
//! They are macros so that `concat!` composes them into each statement's text at compile
//! time: a statement stays one `&'static str`, which sqlx prepares once per connection,
//! and a predicate stays a literal in it. PostgreSQL matches partial indexes at plan time,
//! so the pending predicate must be text, never a bound parameter: that would mean a scan
//! of a table that keeps millions of dispatched rows. `bench/run.py` expands these macros
//! to read the claim exactly as outboxd sends it.

/// A row still to send: the pending partial indexes' predicate.
macro_rules! pending {
    () => {
        "dispatched_at IS NULL AND dead_lettered_at IS NULL"
    };
}

/// A row that has ended: sent or dead-lettered. The recipient lookup's indexes' predicate
/// (migrations 19 and 20), with which of them holds the row.
macro_rules! ended {
    () => {
        "(dispatched_at IS NOT NULL OR dead_lettered_at IS NOT NULL)"
    };
}

/// A payload with one recipient: `to` a string, and no `cc` or `bcc`. The recipient
/// lookup's B-tree index holds the ended rows that match (their key is
/// `outbox_single_recipient_key`, migration 18), its GIN index the others (migrations 19
/// and 20, whose predicates this repeats as text: the planner matches them so).
macro_rules! single_recipient {
    () => {
        "coalesce(jsonb_typeof(payload -> 'to') = 'string', false) \
         AND NOT payload ?| ARRAY['cc', 'bcc']"
    };
}

/// A dead letter an operator has not discarded.
macro_rules! dead_letter {
    () => {
        "dead_lettered_at IS NOT NULL AND discarded_at IS NULL"
    };
}

/// A suppression list entry in force now: permanent, or temporary and not yet lapsed.
/// `$table` qualifies the column (`"outbox_suppressions."`) where a statement needs it.
macro_rules! active_suppression {
    () => {
        active_suppression!("")
    };
    ($table:literal) => {
        concat!(
            "(",
            $table,
            "suppressed_until IS NULL OR ",
            $table,
            "suppressed_until > now())"
        )
    };
}

/// A temporary suppression list entry that has lapsed: no longer in force.
macro_rules! lapsed_suppression {
    ($table:literal) => {
        concat!("(", $table, "suppressed_until <= now())")
    };
}

/// For an `UPDATE outbox_messages`' SET: the row's times moved into the years the table
/// allows (`outbox_on_the_calendar`, migration 12), since its CHECKs, added `NOT VALID`,
/// refuse any update of a row written before them that keeps a time off the calendar.
/// `next_attempt_at` is left to each statement, which may set it anyway.
macro_rules! times_on_the_calendar {
    () => {
        "created_at = outbox_on_the_calendar(created_at), \
         not_before = outbox_on_the_calendar(not_before), \
         expires_at = outbox_on_the_calendar(expires_at)"
    };
}

/// Of an `ON CONFLICT (address) DO UPDATE` on the suppression list by a report that
/// suppresses for good (a hard bounce, a complaint, an unsubscribe): the existing entries
/// it replaces, those that end (an operator's temporary entry, lapsed or not). Before, a
/// complaint during an operator's temporary entry was answered "recorded" and dropped,
/// and the complainer was mailed again when the entry ended.
macro_rules! replaced_for_good {
    () => {
        "outbox_suppressions.suppressed_until IS NOT NULL"
    };
}

/// The addresses of a payload's `to`, `cc` and `bcc` (each a string or an array of
/// strings), in that order, as a `recipients` text array; anything else is left out.
macro_rules! recipients_column {
    () => {
        "ARRAY(SELECT r.address #>> '{}' \
               FROM unnest(ARRAY[payload->'to', payload->'cc', payload->'bcc']) \
                    WITH ORDINALITY AS f(field, i), \
                    jsonb_array_elements(CASE jsonb_typeof(f.field) WHEN 'array' THEN f.field \
                                         ELSE jsonb_build_array(f.field) END) \
                    WITH ORDINALITY AS r(address, j) \
               WHERE jsonb_typeof(r.address) = 'string' ORDER BY f.i, r.j) AS recipients"
    };
}

/// An address as the suppression list keys it (`suppression::address_key`), from the text
/// `$address` of an envelope entry: the part between `<` and `>`, else the whole text,
/// trimmed, its ASCII letters lower-cased. `lower()` under the "C" collation changes A to
/// Z only; under another, it folds KELVIN SIGN into `k` and would take one mailbox for
/// another. `outbox_single_recipient_key` (migration 18) keys the recipient lookup's index
/// the same way.
macro_rules! address_key {
    ($address:literal) => {
        concat!(
            "lower(btrim(CASE WHEN strpos(",
            $address,
            ", '<') > 0 \
                         THEN coalesce(substring(",
            $address,
            " FROM '<([^<>]*)>[[:space:]]*$'), ",
            $address,
            ") ELSE ",
            $address,
            " END) COLLATE \"C\") COLLATE \"default\""
        )
    };
}

/// The audit log's `action` for a recipient lookup: written by the lookup, left out of the
/// admin page's list of recent actions.
macro_rules! audit_lookup {
    () => {
        "lookup"
    };
}
