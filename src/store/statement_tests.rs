//! The statements' files hold what `statement` says they hold.

use std::collections::BTreeSet;

use super::{BlockKind, FILES, Sql, blocks, render_all};
use crate::message::{AUTOMATIC_ACTOR, actions};
use crate::suppression::{FeedbackSource, SuppressionReason, marks};

/// The Rust definition of each stored word the files mark (`'sent' /* word: action.sent */`),
/// or limit (`1000 /* word: limit.detail_chars */`).
fn word(name: &str) -> Option<String> {
    if name == "limit.detail_chars" {
        return Some(crate::suppression::MAX_DETAIL_CHARS.to_string());
    }
    Some(match name {
        "action.sent" => actions::SENT,
        "action.retry" => actions::RETRY,
        "action.dead" => actions::DEAD,
        "action.release" => actions::RELEASE,
        "action.expired" => actions::EXPIRED,
        "action.suppressed" => actions::SUPPRESSED,
        "action.logged_only" => actions::LOGGED_ONLY,
        "action.cancelled" => actions::CANCELLED,
        "class.throttled" => actions::THROTTLED,
        "actor.automatic" => AUTOMATIC_ACTOR,
        "mark.hard_bounce" => marks::HARD_BOUNCE,
        "mark.soft_bounce" => marks::SOFT_BOUNCE,
        "mark.complaint" => marks::COMPLAINT,
        "reason.hard_bounce" => SuppressionReason::HardBounce.as_str(),
        "scope.all" => crate::suppression::Scope::All.as_str(),
        "source.smtp" => FeedbackSource::Smtp.as_str(),
        "audit.lookup" => super::super::messages::AUDIT_LOOKUP,
        "audit.resume" => super::super::pauses::AUDIT_RESUME,
        "tier.urgent" => super::super::claim::URGENT,
        "tier.regular" => super::super::claim::REGULAR,
        "tier.bulk" => super::super::claim::BULK,
        "lane.transactional" => crate::message::Lane::Transactional.as_str(),
        "lane.bulk" => crate::message::Lane::Bulk.as_str(),
        "event.enqueued" => super::super::timeline::ENQUEUED,
        "event.cancel_requested" => super::super::cancel::CANCEL_REQUESTED,
        "callback.sent" => super::super::callbacks::events::SENT,
        "callback.dead_lettered" => super::super::callbacks::events::DEAD_LETTERED,
        "callback.bounced" => super::super::callbacks::events::BOUNCED,
        "callback.complained" => super::super::callbacks::events::COMPLAINED,
        "callback.suppressed" => super::super::callbacks::events::SUPPRESSED,
        "callback.expired" => super::super::callbacks::events::EXPIRED,
        "callback.cancelled" => super::super::callbacks::events::CANCELLED,
        _ => return None,
    }
    .to_owned())
}

/// outboxd's tables and functions: each a statement names must carry `{{schema}}`.
const OBJECTS: &[&str] = &[
    "outbox_messages",
    "outbox_suppressions",
    "outbox_lane_suppressions",
    "outbox_send_rate",
    "outbox_schema_migrations",
    "outbox_webhook_receipts",
    "outbox_admin_audit",
    "outbox_kind_pauses",
    "outbox_message_events",
    "outbox_message_tags",
    "outbox_installation",
    "outbox_replica_circuits",
    "outbox_recipient_keys",
    "outbox_single_recipient_key",
    "outbox_on_the_calendar",
    "outbox_cancel",
    "outbox_cancel_id",
    "outbox_callbacks",
    "outbox_kind_policies",
    "outbox_masked",
    "outbox_secret_fields_of",
    "outbox_erasure_mark",
];

fn mail() -> outboxd_producer::Schema {
    "mail".parse().expect("a schema name")
}

fn parameters_in(text: &str) -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let digits: String = rest[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(n) = digits.parse() {
            found.insert(n);
        }
        rest = &rest[at + 1..];
    }
    found
}

/// A file's text before its first block: what it says of all its statements.
fn preamble(text: &str) -> &str {
    let first = ["\n-- name: ", "\n-- fragment: "]
        .iter()
        .filter_map(|start| text.find(start))
        .min()
        .unwrap_or(text.len());
    &text[..first]
}

#[test]
fn every_statement_renders_in_a_schema_and_without_one() {
    for schema in [None, Some(mail())] {
        let texts = render_all(schema.as_ref()).expect("every statement renders");
        assert_eq!(texts.len(), Sql::ALL.len());
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(Sql::ALL[i] as usize, i, "Sql::ALL is in the enum's order");
            assert!(!text.contains("{{"), "{:?} keeps a marker", Sql::ALL[i]);
        }
    }
}

#[test]
fn each_statement_has_a_header_naming_its_parameters_and_its_index() {
    let texts = render_all(None).expect("renders");
    let all = blocks();
    for sql in Sql::ALL {
        let name = sql.name();
        let block = all
            .iter()
            .find(|b| b.kind == BlockKind::Statement && b.name == name)
            .expect("a block");
        let preamble = FILES
            .iter()
            .find(|(file, _)| *file == block.file)
            .map(|(_, text)| preamble(text))
            .unwrap_or_default();
        let header = block.header.join("\n");
        assert!(
            block.header.iter().any(|line| line.starts_with("Index:")),
            "{name}: no `Index:` line"
        );
        let used = parameters_in(&texts[*sql as usize]);
        let declared: BTreeSet<u32> = parameters_in(&header)
            .union(&parameters_in(preamble))
            .copied()
            .collect();
        for n in &used {
            assert!(declared.contains(n), "{name}: ${n} is not in its header");
        }
        if used.is_empty() {
            assert!(
                header.contains("No parameters."),
                "{name}: say `No parameters.`"
            );
        }
        for n in parameters_in(&header) {
            assert!(
                used.contains(&n),
                "{name}: its header names ${n}, which it does not use"
            );
        }
    }
}

#[test]
fn each_stored_word_is_the_rust_definition_it_names() {
    let mut seen = 0;
    for (file, text) in FILES {
        let mut rest: &str = text;
        while let Some(at) = rest.find("/* word: ") {
            let name = rest[at + 9..].split(" */").next().unwrap_or_default();
            let before = rest[..at].trim_end();
            let number = &before[before.trim_end_matches(|c: char| c.is_ascii_digit()).len()..];
            let literal = before
                .strip_suffix('\'')
                .and_then(|b| b.rfind('\'').map(|open| &b[open + 1..]))
                .or(Some(number).filter(|n| !n.is_empty()))
                .unwrap_or_else(|| panic!("{file}: word {name} follows no literal"));
            let expected = word(name).unwrap_or_else(|| panic!("{file}: unknown word {name}"));
            assert_eq!(literal, expected, "{file}: word {name}");
            seen += 1;
            rest = &rest[at + 9..];
        }
    }
    assert!(seen > 20, "the files mark their words ({seen} found)");
}

#[test]
fn every_object_a_statement_names_is_in_the_schema() {
    let texts = render_all(Some(&mail())).expect("renders");
    let all = blocks();
    for sql in Sql::ALL {
        let block = all.iter().find(|b| b.name == sql.name()).expect("a block");
        if block.file == "migrations" {
            // Run with the schema as the connection's search_path (`migrations::migrate`).
            continue;
        }
        let text = &texts[*sql as usize];
        for object in OBJECTS {
            for (at, _) in text.match_indices(object) {
                let after = text[at + object.len()..].chars().next();
                let before = &text[..at];
                let is_name =
                    !matches!(after, Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '.');
                if is_name {
                    assert!(
                        before.ends_with("\"mail\"."),
                        "{}: {object} without {{{{schema}}}}",
                        sql.name()
                    );
                }
            }
        }
    }
}
