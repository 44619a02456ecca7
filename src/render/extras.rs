//! What a kind may add to its emails beyond subject and body: headers it declares in
//! `headers.txt` (such as `List-Unsubscribe`), rendered from the payload, and the files a
//! payload attaches. Both reach the email only after the same refusal of line breaks and
//! control characters as every other header.

use base64::Engine as _;
use lettre::message::header::ContentTransferEncoding;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Body, SinglePart};
use serde_json::Value;

use super::{RenderError, has_control};

/// Headers a kind may not declare: outboxd writes them itself, or they belong to the
/// transport; and every `Content-*` header, which belongs to the MIME structure.
const RESERVED: &[&str] = &[
    "bcc",
    "cc",
    "date",
    "dkim-signature",
    "from",
    "message-id",
    "mime-version",
    "received",
    "reply-to",
    "return-path",
    "sender",
    "subject",
    "to",
    "x-outbox-id",
    "x-pm-metadata-outbox_id",
];

/// The longest value a declared header may render to.
const MAX_HEADER_CHARS: usize = 2000;
/// The longest line of a header (RFC 5322 2.1.1), its name and `: ` included: an ASCII
/// value is not folded where it has no space, so a longer one would break the line limit.
const MAX_HEADER_LINE_OCTETS: usize = 998;
/// The longest attachment filename.
const MAX_FILENAME_CHARS: usize = 255;

/// One header a kind declares: its name, and the template of its value.
#[derive(Debug, Clone)]
pub(super) struct DeclaredHeader {
    pub name: String,
    /// The template's name in the environment.
    pub template: String,
    /// How many `<` its template writes: a `List-*` header rendered with more holds a URI
    /// that a payload value added (`x>, <https://elsewhere`).
    pub angle_brackets: usize,
}

/// How many `<` a header's template writes itself, outside its `{{ }}`, `{% %}` and
/// `{# #}` (where a `<` is a comparison, and writes nothing).
fn literal_angle_brackets(template: &str) -> usize {
    let mut count = 0;
    let mut rest = template;
    while let Some(at) = rest.find(['<', '{']) {
        let (found, after) = rest[at..].split_at(1);
        let closing = match (found, after.chars().next()) {
            ("{", Some('{')) => Some("}}"),
            ("{", Some('%')) => Some("%}"),
            ("{", Some('#')) => Some("#}"),
            _ => None,
        };
        match closing {
            Some(closing) => match after[1..].find(closing) {
                Some(end) => rest = &after[1 + end + closing.len()..],
                None => break,
            },
            None => {
                if found == "<" {
                    count += 1;
                }
                rest = after;
            }
        }
    }
    count
}

/// Reads `<kind>/headers.txt`: one `Name: value template` per line; blank lines and lines
/// starting with `#` are skipped. Returns each header with the template source of its
/// value, named for the environment.
pub(super) fn parse_headers_file(
    kind: &str,
    source: &str,
) -> Result<Vec<(DeclaredHeader, String)>, String> {
    let mut headers: Vec<(DeclaredHeader, String)> = Vec::new();
    for (number, line) in source.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |reason: String| format!("{kind}/headers.txt line {}: {reason}", number + 1);
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| at("expected Name: value".to_owned()))?;
        let name = name.trim();
        let valid_name =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !valid_name {
            return Err(at(format!("{name:?} is not a header name")));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) || lower.starts_with("content-") {
            return Err(at(format!(
                "{name} is written by outboxd and cannot be declared"
            )));
        }
        if headers
            .iter()
            .any(|(h, _)| h.name.eq_ignore_ascii_case(name))
        {
            return Err(at(format!("{name} is declared twice")));
        }
        let header = DeclaredHeader {
            name: name.to_owned(),
            template: format!("{kind}/headers.txt#{name}"),
            angle_brackets: literal_angle_brackets(value),
        };
        headers.push((header, value.trim().to_owned()));
    }
    Ok(headers)
}

/// A declared header's rendered value as a header, or `None` when it rendered empty (so a
/// template can leave a header out: `{% if unsubscribe_url %}...{% endif %}`).
pub(super) fn header_value(
    declared: &DeclaredHeader,
    rendered: &str,
) -> Result<Option<HeaderValue>, RenderError> {
    let name = declared.name.as_str();
    let value = rendered.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let refused = |reason: String| RenderError::Declared {
        what: format!("header {name}"),
        reason,
        class: "render",
    };
    if value.is_ascii() && name.len() + 2 + value.len() > MAX_HEADER_LINE_OCTETS {
        return Err(refused(format!(
            "renders a line longer than {MAX_HEADER_LINE_OCTETS} octets"
        )));
    }
    if name.to_ascii_lowercase().starts_with("list-")
        && value.matches('<').count() > declared.angle_brackets
    {
        return Err(refused(
            "holds more URIs than its template writes: a payload value added one".to_owned(),
        ));
    }
    if has_control(value) {
        return Err(RenderError::Declared {
            what: format!("header {name}"),
            reason: "contains a line break or another control character".to_owned(),
            class: "header_injection",
        });
    }
    // List-* headers hold URIs in angle brackets (RFC 2369): encoding them (RFC 2047) would
    // break them.
    if name.to_ascii_lowercase().starts_with("list-") && !value.is_ascii() {
        return Err(RenderError::Declared {
            what: format!("header {name}"),
            reason: "must be ASCII (percent-encode the URI)".to_owned(),
            class: "render",
        });
    }
    if value.chars().count() > MAX_HEADER_CHARS {
        return Err(RenderError::Declared {
            what: format!("header {name}"),
            reason: format!("is longer than {MAX_HEADER_CHARS} characters"),
            class: "render",
        });
    }
    let header =
        HeaderName::new_from_ascii(name.to_owned()).map_err(|e| RenderError::Declared {
            what: format!("header {name}"),
            reason: e.to_string(),
            class: "render",
        })?;
    Ok(Some(HeaderValue::new(header, value.to_owned())))
}

/// The payload's `attachments` as MIME parts: a list of `{filename, content_type,
/// content_base64}`, their decoded sizes together at most `max_bytes`.
pub(super) fn attachments(
    payload: &Value,
    max_bytes: usize,
) -> Result<Vec<SinglePart>, RenderError> {
    let invalid = |index: Option<usize>, reason: String| RenderError::Declared {
        what: index.map_or_else(|| "attachments".to_owned(), |i| format!("attachments[{i}]")),
        reason,
        class: "attachment",
    };
    let items = match payload.get("attachments") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid(None, "must be a list".to_owned())),
    };
    // base64 is 4 characters for 3 bytes: refuse before decoding anything.
    let estimated: usize = items
        .iter()
        .filter_map(|item| item["content_base64"].as_str())
        .map(|b64| b64.len() / 4 * 3)
        .sum();
    if estimated > max_bytes.saturating_add(3 * items.len()) {
        return Err(RenderError::AttachmentsTooLarge {
            bytes: estimated,
            max: max_bytes,
        });
    }
    let mut total = 0;
    let mut parts = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let (part, bytes) = attachment(i, item)?;
        total += bytes;
        if total > max_bytes {
            return Err(RenderError::AttachmentsTooLarge {
                bytes: total,
                max: max_bytes,
            });
        }
        parts.push(part);
    }
    Ok(parts)
}

/// A type and a subtype, nothing more (RFC 6838's restricted names): parameters
/// (`; charset=`, `; name=`) would let a payload contradict the part outboxd builds.
fn is_bare_mime_type(text: &str) -> bool {
    let is_name = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    text.split_once('/')
        .is_some_and(|(kind, subtype)| is_name(kind) && is_name(subtype))
}

/// One attachment as a MIME part, with its decoded size.
fn attachment(i: usize, item: &Value) -> Result<(SinglePart, usize), RenderError> {
    let invalid = |reason: String| RenderError::Declared {
        what: format!("attachments[{i}]"),
        reason,
        class: "attachment",
    };
    let injection = |field: &str| RenderError::Declared {
        what: format!("attachments[{i}].{field}"),
        reason: "contains a line break, a control or a bidirectional character".to_owned(),
        class: "header_injection",
    };
    let field = |name: &str| {
        item.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{name} must be a string")))
    };
    let filename = field("filename")?;
    if filename.is_empty() || filename.chars().count() > MAX_FILENAME_CHARS {
        return Err(invalid(format!(
            "filename must be 1 to {MAX_FILENAME_CHARS} characters"
        )));
    }
    if filename.chars().any(crate::text::is_unsafe_to_show) {
        return Err(injection("filename"));
    }
    let content_type = field("content_type")?;
    if content_type.chars().any(char::is_control) {
        return Err(injection("content_type"));
    }
    if !is_bare_mime_type(content_type) {
        return Err(invalid(
            "content_type must be a MIME type without parameters (type/subtype)".to_owned(),
        ));
    }
    // A part of its own, never a MIME structure or a whole email inside the payload's.
    let essence = content_type.to_ascii_lowercase();
    if essence.starts_with("multipart/") || essence.starts_with("message/") {
        return Err(invalid(format!(
            "content_type {essence:?}: multipart and message types are not attachments"
        )));
    }
    let content_type = ContentType::parse(content_type)
        .map_err(|_| invalid(format!("{content_type:?} is not a MIME type")))?;
    // MIME encoders wrap their base64 in lines: the line breaks are not data.
    let encoded: String = field("content_base64")?
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let content = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| invalid(format!("content_base64 is not base64: {e}")))?;
    let bytes = content.len();
    // Always base64: data sent as it is (lettre's choice for ASCII) would carry bare line
    // feeds, which SMTP forbids and which break a DKIM body hash once a verifier or a relay
    // normalizes them.
    let body = Body::new_with_encoding(content, ContentTransferEncoding::Base64)
        .map_err(|_| invalid("cannot be encoded".to_owned()))?;
    Ok((
        Attachment::new(filename.to_owned()).body(body, content_type),
        bytes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_angle_brackets_a_template_writes_count() {
        assert_eq!(literal_angle_brackets("<{{ url }}>"), 1);
        assert_eq!(literal_angle_brackets("<{{ a }}>, <mailto:{{ b }}>"), 2);
        assert_eq!(
            literal_angle_brackets("{% if n < 3 %}<{{ url }}>{% endif %}{# a < b #}"),
            1
        );
    }
    use serde_json::json;

    #[test]
    fn declared_headers_may_not_take_outboxds_own_or_repeat() {
        let parsed = parse_headers_file(
            "news",
            "# comment\nList-Unsubscribe: <{{ url }}>\n\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\n",
        )
        .unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].1, "<{{ url }}>");
        for bad in [
            "Bcc: x",
            "X-A: 1\nx-a: 2",
            "No colon here",
            "Bad Name: x",
            "Content-ID: x",
        ] {
            assert!(parse_headers_file("news", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn attachments_are_bounded_and_their_names_cannot_break_a_line() {
        let file = |name: &str, b64: &str| {
            json!({"attachments": [{"filename": name, "content_type": "application/pdf",
                                    "content_base64": b64}]})
        };
        assert_eq!(
            attachments(&file("a.pdf", "JVBERi0="), 100).unwrap().len(),
            1
        );
        let refused = attachments(&file("a.pdf\r\nBcc: x@evil.test", "JVBERi0="), 100).unwrap_err();
        assert_eq!(refused.error_class(), "header_injection");
        let big = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 300]);
        let refused = attachments(&file("a.bin", &big), 100).unwrap_err();
        assert_eq!(refused.error_class(), "attachment_too_large");
        assert_eq!(
            attachments(&file("a.pdf", "not base64!"), 100)
                .unwrap_err()
                .error_class(),
            "attachment"
        );
        assert!(attachments(&json!({"attachments": "x"}), 100).is_err());
        assert_eq!(
            attachments(&file("a.pdf", "JVBE\r\nRi0="), 100)
                .unwrap()
                .len(),
            1
        );
        let nested = json!({"attachments": [{"filename": "a.eml", "content_type": "message/rfc822",
                                             "content_base64": "JVBERi0="}]});
        assert_eq!(
            attachments(&nested, 100).unwrap_err().error_class(),
            "attachment"
        );
    }
}
