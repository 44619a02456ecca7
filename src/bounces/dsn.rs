//! A delivery status notification (RFC 3464) read from the bytes a mail server sent: a
//! `multipart/report; report-type=delivery-status` whose `message/delivery-status` part
//! holds a block of fields about the message, then one block per recipient (`Final-Recipient`,
//! `Action`, `Status`, `Diagnostic-Code`). Anything else (an auto-reply, a vacation notice, a
//! human's answer, a report of another type) is not a DSN, and says nothing of an address.

use base64::Engine as _;

/// What a DSN says of one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientStatus {
    /// `Original-Recipient`'s address (as the message named it) when given, else
    /// `Final-Recipient`'s, its `rfc822;` type taken off.
    pub recipient: String,
    /// `failed`, `delayed`, `delivered`, `relayed` or `expanded`, lower-cased.
    pub action: String,
    /// The RFC 3463 status (`5.1.1`).
    pub status: String,
    /// `Diagnostic-Code`, its type taken off (`550 5.1.1 <x@y>: user unknown`), if given.
    pub diagnostic: Option<String>,
}

impl RecipientStatus {
    /// A failure for good (`failed` with a 5.x.x status): of the mailbox, or of the
    /// sender, the content, the size ([`Self::says_mailbox_unknown`] tells which).
    pub fn is_hard(&self) -> bool {
        self.action == "failed" && self.status.starts_with('5')
    }

    /// A failure for good that says the mailbox does not exist, by the same rule as a
    /// relay's own refusal (`Reply::says_mailbox_unknown`: 5.1.1, 5.1.10, ...): only that
    /// suppresses the address. A 5.7.x about the sender's reputation or DMARC, a 5.3.4 about
    /// the size, a 5.4.x about routing say nothing of the mailbox.
    pub fn says_mailbox_unknown(&self) -> bool {
        let said = format!("{} {}", self.status, self.diagnostic.as_deref().unwrap_or(""));
        self.is_hard() && crate::mailer::Reply::new(550, &said).says_mailbox_unknown()
    }

    /// A transient trouble (`delayed`, or a 4.x.x status): no bounce for good.
    pub fn is_soft(&self) -> bool {
        (self.action == "failed" && self.status.starts_with('4')) || self.action == "delayed"
    }
}

/// Why the bytes are not a DSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotADsn {
    #[error("not a multipart/report of delivery status (an auto-reply, or a human's answer)")]
    NotAReport,
    #[error("a delivery-status report without a recipient block")]
    NoRecipient,
}

/// The recipients' statuses a DSN reports.
pub fn read(raw: &[u8]) -> Result<Vec<RecipientStatus>, NotADsn> {
    let text = String::from_utf8_lossy(raw);
    let (headers, body) = split_head(&text);
    let content_type = field(&headers, "content-type").ok_or(NotADsn::NotAReport)?;
    let (mime, params) = content_type_of(&content_type);
    let report_type = params
        .iter()
        .find(|(k, _)| k == "report-type")
        .map(|(_, v)| v.to_ascii_lowercase());
    if mime != "multipart/report" || report_type.as_deref() != Some("delivery-status") {
        return Err(NotADsn::NotAReport);
    }
    let boundary = params
        .iter()
        .find(|(k, _)| k == "boundary")
        .map(|(_, v)| v.clone())
        .ok_or(NotADsn::NotAReport)?;
    let status = parts(body, &boundary)
        .into_iter()
        .find_map(|part| {
            let (headers, body) = split_head(part);
            let (mime, _) = content_type_of(&field(&headers, "content-type")?);
            matches!(mime.as_str(), "message/delivery-status" | "message/global-delivery-status")
                .then(|| decoded(&headers, body))
        })
        .ok_or(NotADsn::NotAReport)?;
    let recipients: Vec<RecipientStatus> = blocks(&status)
        .iter()
        .skip(1)
        .filter_map(|block| recipient_status(block))
        .collect();
    if recipients.is_empty() {
        return Err(NotADsn::NoRecipient);
    }
    Ok(recipients)
}

/// The header lines (unfolded) and the body after the first blank line.
fn split_head(text: &str) -> (Vec<(String, String)>, &str) {
    // A part that starts with a blank line has no header.
    if let Some(body) = text.strip_prefix("\r\n").or_else(|| text.strip_prefix('\n')) {
        return (Vec::new(), body);
    }
    let end = [text.find("\r\n\r\n").map(|at| (at, 4)), text.find("\n\n").map(|at| (at, 2))]
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at);
    let (head, body) = match end {
        Some((at, len)) => (&text[..at], &text[at + len..]),
        None => (text, ""),
    };
    (fields(head), body)
}

/// `Name: value` lines, continuation lines joined, names lower-cased.
fn fields(block: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        let line = line.trim_end_matches('\r');
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((name, value)) = line.split_once(':') {
            fields.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    fields
}

fn field(fields: &[(String, String)], name: &str) -> Option<String> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

/// A `Content-Type`'s type (lower-cased) and parameters (names lower-cased, quotes off).
fn content_type_of(value: &str) -> (String, Vec<(String, String)>) {
    let mut pieces = value.split(';');
    let mime = pieces.next().unwrap_or("").trim().to_ascii_lowercase();
    let params = pieces
        .filter_map(|piece| piece.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_owned()))
        .collect();
    (mime, params)
}

/// The parts between `--boundary` lines, up to `--boundary--`.
fn parts<'a>(body: &'a str, boundary: &str) -> Vec<&'a str> {
    let (open, close) = (format!("--{boundary}"), format!("--{boundary}--"));
    let mut parts = Vec::new();
    let mut start: Option<usize> = None;
    let mut at = 0;
    for line in body.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare == open || bare == close {
            if let Some(from) = start {
                parts.push(&body[from..at]);
            }
            if bare == close {
                return parts;
            }
            start = Some(at + line.len());
        }
        at += line.len();
    }
    parts
}

/// A part's body, decoded when its transfer encoding is base64.
fn decoded(headers: &[(String, String)], body: &str) -> String {
    let base64 = field(headers, "content-transfer-encoding")
        .is_some_and(|e| e.eq_ignore_ascii_case("base64"));
    if !base64 {
        return body.to_owned();
    }
    let compact: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The report's blocks of fields, separated by blank lines.
fn blocks(status: &str) -> Vec<Vec<(String, String)>> {
    let mut blocks = Vec::new();
    let mut current = String::new();
    for line in status.lines() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                blocks.push(fields(&current));
                current.clear();
            }
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    if !current.is_empty() {
        blocks.push(fields(&current));
    }
    blocks
}

fn recipient_status(block: &[(String, String)]) -> Option<RecipientStatus> {
    let untyped = |value: String| match value.split_once(';') {
        Some((_, rest)) => rest.trim().to_owned(),
        None => value.trim().to_owned(),
    };
    // The address as the message named it, when the report keeps it (a forward, an alias),
    // else the one that failed.
    let named = field(block, "original-recipient").or_else(|| field(block, "final-recipient"))?;
    let recipient = untyped(named).trim_matches(['<', '>']).to_owned();
    // `failed (bad destination mailbox)`: the word only.
    let action = field(block, "action")?
        .split_whitespace()
        .next()?
        .to_ascii_lowercase();
    // "5.1.1 (unknown user)": the code only.
    let status = field(block, "status")?
        .split_whitespace()
        .next()?
        .to_owned();
    let valid = status.split('.').count() == 3 && status.split('.').all(|p| p.parse::<u16>().is_ok());
    if !valid || recipient.is_empty() {
        return None;
    }
    Some(RecipientStatus {
        recipient,
        action,
        status,
        diagnostic: field(block, "diagnostic-code").map(untyped),
    })
}

#[cfg(test)]
#[path = "dsn_tests.rs"]
mod tests;
