//! Text made fit for a column, a table cell, a terminal or a log line: cut to a length on a
//! character boundary, control characters escaped, URLs with their passwords hidden, and
//! `Debug` that leaves secrets out.

use std::borrow::Cow;

/// A duration as a person reads it in a log line: `850ms`, `3.1s`, `2m 5s`, `1h 2m`,
/// `2d 3h`; not `3s 127ms 604us 961ns`.
pub fn duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => {
            let tenths = (d.as_millis() + 50) / 100;
            if tenths.is_multiple_of(10) {
                format!("{}s", tenths / 10)
            } else {
                format!("{}.{}s", tenths / 10, tenths % 10)
            }
        }
        60..3600 => two_units(secs / 60, "m", secs % 60, "s"),
        3600..86400 => two_units(secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => two_units(secs / 86400, "d", secs % 86400 / 3600, "h"),
    }
}

fn two_units(big: u64, big_unit: &str, small: u64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit} {small}{small_unit}")
    }
}

/// The first `max_chars` characters of `text`, cut on a character boundary.
pub fn cut(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// What a server said, made storable in a `text` column: its first `max_chars` characters,
/// with NUL (which PostgreSQL refuses in text, failing the whole outcome statement with it)
/// replaced by U+FFFD.
pub fn storable(said: &str, max_chars: usize) -> String {
    cut(said, max_chars).replace('\0', "\u{FFFD}")
}

/// Like [`cut`], with `…` added where something was cut, so a reader knows there is more.
pub fn cut_with_ellipsis(text: &str, max_chars: usize) -> Cow<'_, str> {
    let kept = cut(text, max_chars);
    if kept.len() == text.len() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("{kept}…"))
    }
}

/// Whether a character can change how a terminal or a line of text shows what follows:
/// control characters (newlines, escape sequences) and the bidirectional controls that
/// reorder text (RIGHT-TO-LEFT OVERRIDE makes `exe.txt` of `txt.exe`).
pub fn is_unsafe_to_show(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every character [`is_unsafe_to_show`] written as a `\u{..}` escape, for
/// a terminal or a text log: what a producer or a caller wrote cannot forge a log line,
/// colour an operator's terminal, or reorder what it shows.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_to_show) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if is_unsafe_to_show(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// Like [`printable`], keeping line breaks and tabs: a body shown on a terminal.
pub fn printable_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            line.split('\t')
                .map(|part| printable(part.strip_suffix('\r').unwrap_or(part)).into_owned())
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A URL fit for logs: the password, if any, replaced by `***`; anything unparseable
/// replaced whole, since it may hold a password where a parser cannot see it.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() && url.set_password(Some("***")).is_err() {
                return "<unparseable URL>".to_owned();
            }
            url.to_string()
        }
        Err(_) => "<unparseable URL>".to_owned(),
    }
}

/// Implements `Debug` for a struct showing only the fields named, and `..` for the rest:
/// for types that hold a password or a key, which a derived `Debug` would print into any
/// log line that shows them. `Type as it { field, other = expression of it }` shows
/// `field` as it is and `other` as the expression (its redacted form).
macro_rules! debug_showing_only {
    ($type:ident as $it:ident { $($field:ident $(= $shown:expr)?),* $(,)? }) => {
        impl ::std::fmt::Debug for $type {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let $it = self;
                f.debug_struct(stringify!($type))
                    $(.field(
                        stringify!($field),
                        &$crate::text::debug_showing_only!(@shown $it.$field $(= $shown)?),
                    ))*
                    .finish_non_exhaustive()
            }
        }
    };
    (@shown $it:ident.$field:ident) => { $it.$field };
    (@shown $it:ident.$field:ident = $shown:expr) => { $shown };
}
pub(crate) use debug_showing_only;

/// What a panic carried, when it was a message.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// `text` with the local part of every email address in it replaced by `***`, for logs:
/// errors often quote the recipient (`550 5.1.1 <ada@example.com>: unknown user`), and
/// logs must not carry personal data. The domain stays: it tells which provider refused.
pub fn mask_addresses(text: &str) -> Cow<'_, str> {
    let is_local = |c: char| c.is_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c);
    let is_domain = |c: char| c.is_alphanumeric() || c == '.' || c == '-';
    let mut masked = String::new();
    let mut copied = 0;
    for (at, _) in text.match_indices('@') {
        let before = &text[..at];
        let local_start = match before.strip_suffix('"') {
            // A quoted local part ("ada lovelace"@example.com): back to its opening quote.
            Some(quoted) => quoted.rfind('"').unwrap_or(at),
            None => before
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_local(*c))
                .last()
                .map_or(at, |(i, _)| i),
        };
        // A domain name, or an address literal such as [192.0.2.1].
        let has_domain = text[at + 1..]
            .chars()
            .next()
            .is_some_and(|c| is_domain(c) || c == '[');
        if local_start == at || !has_domain || local_start < copied {
            continue;
        }
        masked.push_str(&text[copied..local_start]);
        masked.push_str("***");
        copied = at;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    masked.push_str(&text[copied..]);
    Cow::Owned(masked)
}


/// Bytes as lower-case hexadecimal: signatures, digests, tokens.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_as_a_person_says_them() {
        use std::time::Duration;
        for (d, said) in [
            (Duration::from_millis(850), "850ms"),
            (Duration::from_nanos(3_127_604_961), "3.1s"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_secs(125), "2m 5s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(3720), "1h 2m"),
            (Duration::from_secs(2 * 86400 + 3 * 3600 + 5), "2d 3h"),
        ] {
            assert_eq!(duration(d), said);
        }
    }

    #[test]
    fn a_nul_from_a_server_is_not_stored() {
        assert_eq!(
            super::storable("250 ok\0queued", 500),
            "250 ok\u{FFFD}queued"
        );
        assert_eq!(super::storable("451 slow down", 3), "451");
    }

    use super::*;

    #[test]
    fn control_and_reordering_characters_are_escaped() {
        assert_eq!(printable("plain text"), "plain text");
        assert_eq!(printable("a\nb\x1b[31mc"), "a\\u{a}b\\u{1b}[31mc");
        assert_eq!(
            printable("invoice\u{202E}fdp.exe"),
            "invoice\\u{202e}fdp.exe"
        );
        assert_eq!(printable_lines("a\tb\r\n\x1b[2Jc"), "a\tb\n\\u{1b}[2Jc");
    }

    #[test]
    fn text_is_cut_at_characters_not_bytes() {
        let long = "é".repeat(600);
        assert_eq!(cut(&long, 500).chars().count(), 500);
        assert_eq!(cut("short", 500), "short");
    }

    #[test]
    fn an_ellipsis_marks_only_text_that_was_cut() {
        assert_eq!(cut_with_ellipsis("abcdef", 3), "abc…");
        assert_eq!(cut_with_ellipsis("abc", 3), "abc");
    }

    #[test]
    fn addresses_in_errors_keep_only_their_domain() {
        assert_eq!(
            mask_addresses("550 5.1.1 <ada.lovelace+x@example.com>: unknown; also bob@b.example"),
            "550 5.1.1 <***@example.com>: unknown; also ***@b.example"
        );
        assert_eq!(
            mask_addresses("a@x.example,b@y.example"),
            "***@x.example,***@y.example"
        );
        assert_eq!(
            mask_addresses(r#"<"ada lovelace"@example.com> and ada@[192.0.2.1]"#),
            "<***@example.com> and ***@[192.0.2.1]"
        );
        assert_eq!(mask_addresses("no address here"), "no address here");
        assert_eq!(mask_addresses("@ alone, and x@"), "@ alone, and x@");
    }

    struct Login {
        user: String,
        password: Option<String>,
        attempts: u32,
    }

    debug_showing_only!(Login as login {
        user,
        password = login.password.as_ref().map(|_| "***"),
    });

    #[test]
    fn debug_shows_only_the_fields_named_each_as_asked() {
        let login = Login {
            user: "ada".to_owned(),
            password: Some("s3cret".to_owned()),
            attempts: 3,
        };
        assert_eq!(
            format!("{login:?}"),
            r#"Login { user: "ada", password: Some("***"), .. }"#
        );
        assert_eq!(login.attempts, 3, "kept, and left out of Debug");
    }

    #[test]
    fn passwords_never_survive_redaction() {
        let shown = redact_url("postgres://app:s3cret@db:5432/app");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app:***@db"), "{shown}");
        assert_eq!(redact_url("not a url s3cret"), "<unparseable URL>");
    }
}
