//! Text made fit for a column, a table cell or a log line: cut to a length on a character
//! boundary, and URLs with their passwords hidden.

use std::borrow::Cow;

/// The first `max_chars` characters of `text`, cut on a character boundary.
pub fn cut(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn passwords_never_survive_redaction() {
        let shown = redact_url("postgres://app:s3cret@db:5432/app");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app:***@db"), "{shown}");
        assert_eq!(redact_url("not a url s3cret"), "<unparseable URL>");
    }
}
