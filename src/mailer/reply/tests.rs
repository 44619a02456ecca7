//! Replies read as a relay sends them: codes, statuses, echoed addresses.

use super::{Reply, Status};

fn reply(code: u16, lines: &str) -> Reply {
    Reply::new(code, lines)
}

#[test]
fn the_status_is_read_after_the_code_only_in_the_reply_s_class() {
    let gmail = reply(
        550,
        "5.1.1 The email account that you tried to reach does not exist.",
    );
    assert_eq!(
        gmail.status,
        Some(Status {
            class: 5,
            subject: 1,
            detail: 1
        })
    );
    assert_eq!(
        gmail.text,
        "The email account that you tried to reach does not exist."
    );
    assert_eq!(
        gmail.to_string(),
        "550 5.1.1 The email account that you tried to reach does not exist."
    );
    // RFC 2034: a 4.x.x status after a 5xx code is not the reply's status.
    assert_eq!(reply(550, "4.1.1 odd").status, None);
    for not_a_status in ["5.1", "5.1.1.1", "6.1.1", "5.a.1", "5.1.1000", "5..1"] {
        assert_eq!(
            reply(550, &format!("{not_a_status} text")).status,
            None,
            "{not_a_status}"
        );
    }
    assert_eq!(
        Reply::own("no reply within 30s").to_string(),
        "no reply within 30s"
    );
}

/// A reply in its wire form, read by lettre's parser and joined as lettre joins the lines
/// of a refusal (its error's source): a status repeated on each line is kept once.
fn from_wire(wire: &str) -> Reply {
    let raw = format!("{wire}\r\n");
    let response: lettre::transport::smtp::response::Response =
        raw.parse().unwrap_or_else(|e| panic!("{wire:?}: {e}"));
    let code: u16 = response.code().to_string().parse().unwrap();
    let lines: Vec<&str> = response.message().collect();
    let repeated = lines[0]
        .split_whitespace()
        .next()
        .filter(|w| Status::parse(w).is_some());
    let joined: Vec<&str> = lines
        .iter()
        .enumerate()
        .map(|(i, line)| match repeated {
            Some(status) if i > 0 => line.strip_prefix(status).map_or(*line, str::trim_start),
            _ => line,
        })
        .collect();
    Reply::new(code, &joined.join(" "))
}

#[derive(serde::Deserialize)]
struct Documented {
    reply: String,
    source: String,
    reads: String,
}

fn documented() -> Vec<(String, Documented)> {
    #[derive(serde::Deserialize)]
    struct File {
        replies: std::collections::BTreeMap<String, Documented>,
    }
    let file: File =
        serde_json::from_str(include_str!("../../../tests/support/provider_replies.json"))
            .expect("tests/support/provider_replies.json");
    file.replies.into_iter().collect()
}

#[test]
fn the_replies_of_gmail_microsoft_yahoo_ses_postfix_and_exim_are_read_as_they_mean() {
    let replies = documented();
    assert!(replies.len() >= 40, "{} replies", replies.len());
    for (name, documented) in replies {
        let reply = from_wire(&documented.reply);
        let read = match (reply.says_mailbox_unknown(), reply.is_throttling()) {
            (true, false) => "unknown",
            (false, true) => "throttling",
            (false, false) => "neither",
            (true, true) => panic!("{name}: read as both"),
        };
        assert_eq!(
            read, documented.reads,
            "{name} ({}): {reply}",
            documented.source
        );
    }
}

#[test]
fn an_address_the_server_echoes_is_never_read_as_its_words() {
    // The probe's reply: a sign-up as rate@ a domain that does not resolve.
    let echoed = reply(
        450,
        "4.1.2 <rate@nxdomain.example>: Recipient address rejected: Domain not found",
    );
    assert!(!echoed.is_throttling());
    // Without a status only words are read, and an address is none of them.
    for (code, text) in [
        (451, "<rate.limit@example.com> try again later"),
        (451, "throttled@example.com: try again later"),
        (450, "<too.many.connections@example.com> deferred"),
    ] {
        assert!(!reply(code, text).is_throttling(), "{code} {text}");
    }
    for (code, text) in [
        (550, "<no.such.user@example.com> refused by policy"),
        (550, "unknown@example.com refused"),
    ] {
        assert!(!reply(code, text).says_mailbox_unknown(), "{code} {text}");
    }
    // The same words outside an address are read.
    assert!(reply(451, "rate limit exceeded, try later").is_throttling());
    assert!(reply(550, "<ann@example.com>: user unknown").says_mailbox_unknown());
}

#[test]
fn only_a_reply_in_its_class_suppresses_or_throttles() {
    // A 4xx saying the mailbox is unknown is temporary (Postfix's unverified address).
    assert!(!reply(450, "4.1.1 <a@example.com>: unknown").says_mailbox_unknown());
    // A 5xx with a rate status is final, never a pace to cut.
    assert!(!reply(550, "5.7.1 rate of spam too high").is_throttling());
    assert!(!reply(554, "4.7.0 throttled").is_throttling());
    assert!(!Reply::own("no reply within 30s during the transaction").is_throttling());
    assert!(!Reply::own("user unknown").says_mailbox_unknown());
}
