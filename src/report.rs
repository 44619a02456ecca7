//! Plain-text tables for the command line.

use crate::store::admin::DeadLetter;
use chrono::{DateTime, Utc};

use crate::store::circuits::OpenCircuit;
use crate::store::messages::{MessageDetail, MessageState};
use crate::store::pauses::Pause;
use crate::store::stats::Stats;
use crate::store::suppressions::Suppression;
use crate::text::{cut_with_ellipsis, printable};

/// Columns padded to their widest cell; the last column is left ragged. What producers
/// and providers wrote (kinds, recipients, errors, details) reaches the operator's terminal
/// with its control and reordering characters escaped.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| printable(cell).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<&str> = cells.collect();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// One line of at most `max` characters, for a table cell.
fn clip(text: &str, max: usize) -> String {
    cut_with_ellipsis(&text.replace(['\r', '\n'], " "), max).into_owned()
}

/// A page of dead letters as a table; a page as long as `limit` ends with where the next
/// one starts (it may be empty: the list may end exactly there).
pub fn dead_letter_table(page: &[DeadLetter], limit: i64) -> String {
    if page.is_empty() {
        return "no dead letters\n".to_owned();
    }
    let rows: Vec<Vec<String>> = page
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                d.kind.clone(),
                d.error_class.clone(),
                d.attempts.to_string(),
                d.dead_lettered_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                clip(&d.recipients.join(","), 40),
                clip(d.last_error.as_deref().unwrap_or(""), 80),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "KIND",
            "CLASS",
            "ATTEMPTS",
            "DEAD-LETTERED (UTC)",
            "RECIPIENTS",
            "ERROR",
        ],
        &rows,
    );
    if let Some(last) = crate::store::next_after(page, limit, |d| d.id) {
        out.push_str(&format!(
            "({} shown; older: --after {last})\n",
            page.len()
        ));
    }
    out
}

/// A row of the stats table: the kind (or "total"), then its counts.
fn counts_row(name: &str, counts: impl Iterator<Item = i64>) -> Vec<String> {
    std::iter::once(name.to_owned())
        .chain(counts.map(|count| count.to_string()))
        .collect()
}

pub fn stats_table(stats: &Stats) -> String {
    let mut rows: Vec<Vec<String>> = stats
        .kinds
        .iter()
        .map(|(kind, k)| counts_row(kind, k.counts()))
        .collect();
    rows.push(counts_row("total", stats.counts()));
    let mut out = table(
        &[
            "KIND",
            "PENDING",
            "DUE",
            "IN-FLIGHT",
            "DEAD LETTERS",
            "SENT LAST HOUR",
            "EXPIRED LAST HOUR",
            "SUPPRESSED LAST HOUR",
            "LOGGED ONLY LAST HOUR",
        ],
        &rows,
    );
    out.push_str(&format!(
        "oldest pending message: due {:.0}s ago\n",
        stats.oldest_pending_age_seconds
    ));
    for pause in &stats.paused {
        out.push_str(&printable(&format!(
            "paused: {} since {} by {}: {}\n",
            pause.kind,
            seconds(pause.paused_at),
            pause.paused_by,
            pause.reason
        )));
    }
    for circuit in &stats.circuits_open {
        out.push_str(&printable(&format!(
            "circuit open: {} since {}: its relay does not answer, it claims nothing until it does\n",
            circuit.worker_id,
            seconds(circuit.open_since)
        )));
    }
    out
}

/// The suppression list as a table; the next page's `--after` when it is full.
pub fn suppression_table(page: &[Suppression]) -> String {
    let rows: Vec<Vec<String>> = page
        .iter()
        .map(|s| {
            vec![
                s.address.clone(),
                s.scope.0.as_str().to_owned(),
                s.reason.0.as_str().to_owned(),
                s.source.clone(),
                s.created_at.format("%Y-%m-%d %H:%M").to_string(),
                s.suppressed_until.map_or_else(
                    || "-".to_owned(),
                    |u| u.format("%Y-%m-%d %H:%M").to_string(),
                ),
                clip(s.detail.as_deref().unwrap_or(""), 50),
            ]
        })
        .collect();
    table(
        &["ADDRESS", "SCOPE", "REASON", "SOURCE", "SINCE", "UNTIL", "DETAIL"],
        &rows,
    )
}

/// A message's heading line, then its timeline as a table: when, what, who, the relay's
/// reply or what else was said, how long the send took.
/// Why a pending message has not gone yet, when it has not: its kind is paused (since
/// when, by whom, why), a replica holds it now, or its next attempt is still to come.
pub fn waiting(
    message: &MessageDetail,
    pauses: &[Pause],
    circuits: &[OpenCircuit],
    now: DateTime<Utc>,
) -> Option<String> {
    if message.state != MessageState::Pending {
        return None;
    }
    if let Some(pause) = pauses.iter().find(|p| p.kind == message.kind) {
        return Some(format!(
            "waiting: kind {} paused since {} by {}: {} (outboxd resume --kind {})",
            pause.kind,
            seconds(pause.paused_at),
            pause.paused_by,
            pause.reason,
            pause.kind
        ));
    }
    if let Some(by) = &message.locked_by {
        return Some(format!(
            "in flight: {by} holds it (sending it, or, if that replica died, until its lease ends)"
        ));
    }
    if let Some(circuit) = circuits.first().filter(|_| message.next_attempt_at <= now) {
        return Some(format!(
            "waiting: the SMTP circuit of {} is open since {} (its relay does not answer){}",
            circuit.worker_id,
            seconds(circuit.open_since),
            match circuits.len() {
                1 => String::new(),
                n => format!(", and {} other replicas'", n - 1),
            }
        ));
    }
    let next = message.next_attempt_at;
    Some(if next > now {
        format!(
            "waiting: next attempt at {} (in {})",
            seconds(next),
            crate::text::duration((next - now).to_std().unwrap_or_default())
        )
    } else {
        "waiting: due now, to be claimed at the next drain".to_owned()
    })
}

/// One message's timeline as a table under a line that names it.
pub fn timeline(message: &MessageDetail) -> String {
    let rows: Vec<Vec<String>> = message
        .events
        .iter()
        .map(|event| {
            let said = event.said();
            vec![
                event
                    .at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                event.event.clone(),
                event.actor.clone().unwrap_or_default(),
                event
                    .duration_ms
                    .map(|ms| format!("{ms} ms"))
                    .unwrap_or_default(),
                clip(&said, 160),
            ]
        })
        .collect();
    format!(
        "{}\n{}\n",
        printable(&format!(
            "message {} ({}) to {}: {}{}",
            message.id,
            message.kind,
            message.recipients.join(", "),
            message.state,
            if message.tags.is_empty() {
                String::new()
            } else {
                format!(" [tags: {}]", message.tags.join(", "))
            }
        )),
        table(&["AT", "EVENT", "BY", "TOOK", "REPLY OR DETAIL"], &rows)
    )
}

/// `time` to the second, as RFC 3339 in UTC.
fn seconds(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::stats::KindStats;

    #[test]
    fn the_stats_table_has_a_row_per_kind_then_the_totals() {
        let kind = |n| KindStats {
            pending: n,
            due: n + 1,
            in_flight: n + 2,
            dead_letters: n + 3,
            sent_last_hour: n + 4,
            expired_last_hour: n + 5,
            suppressed_last_hour: n + 6,
            logged_only_last_hour: n + 7,
        };
        let stats = Stats {
            pending: 30,
            due: 31,
            in_flight: 32,
            dead_letters: 33,
            oldest_pending_age_seconds: 7.4,
            sent_last_hour: 34,
            expired_last_hour: 35,
            suppressed_last_hour: 36,
            logged_only_last_hour: 37,
            kinds: [("a".to_owned(), kind(10)), ("b".to_owned(), kind(20))].into(),
            paused: Vec::new(),
            circuits_open: Vec::new(),
        };
        assert_eq!(
            stats_table(&stats),
            "KIND   PENDING  DUE  IN-FLIGHT  DEAD LETTERS  SENT LAST HOUR  EXPIRED LAST HOUR  SUPPRESSED LAST HOUR  LOGGED ONLY LAST HOUR\n\
             a      10       11   12         13            14              15                 16                    17\n\
             b      20       21   22         23            24              25                 26                    27\n\
             total  30       31   32         33            34              35                 36                    37\n\
             oldest pending message: due 7s ago\n"
        );
    }
}
