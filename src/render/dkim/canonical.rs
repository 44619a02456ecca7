//! DKIM's relaxed canonicalization (RFC 6376 3.4.2 and 3.4.4) of a formatted email, and the
//! choice of the header fields a signature covers.

/// One header field of a message: its name, and the whole field as it stands (name, colon,
/// value and any folded lines), without the final CRLF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Field<'m> {
    pub name: &'m [u8],
    pub text: &'m [u8],
}

/// The header fields of `head` (a message up to, not including, its blank line), in order.
/// A line that starts with a space or a tab continues the field before it.
pub(super) fn fields(head: &[u8]) -> Vec<Field<'_>> {
    let mut fields: Vec<Field<'_>> = Vec::new();
    let mut start = 0;
    let mut at = 0;
    while at < head.len() {
        let end = find_crlf(&head[at..]).map_or(head.len(), |n| at + n);
        let next = (end + 2).min(head.len());
        let continues = head.get(next).is_some_and(|&b| b == b' ' || b == b'\t');
        if !continues {
            let text = &head[start..end];
            let name = text.split(|&b| b == b':').next().unwrap_or_default();
            fields.push(Field { name, text });
            start = next;
        }
        at = next;
    }
    fields
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

/// A header field in relaxed form: its name lower-cased, folding removed, each run of
/// spaces and tabs one space, none around the colon or at the end; with its CRLF.
pub(super) fn relaxed_header(field: &[u8]) -> Vec<u8> {
    let (name, value) = match field.iter().position(|&b| b == b':') {
        Some(colon) => (&field[..colon], &field[colon + 1..]),
        None => (field, &b""[..]),
    };
    let mut out: Vec<u8> = name
        .iter()
        .filter(|b| !b.is_ascii_whitespace())
        .map(u8::to_ascii_lowercase)
        .collect();
    out.push(b':');
    let mut space = false;
    let mut started = false;
    for &b in value {
        match b {
            b'\r' | b'\n' => {}
            b' ' | b'\t' => space = true,
            _ => {
                if space && started {
                    out.push(b' ');
                }
                space = false;
                started = true;
                out.push(b);
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A body in relaxed form: each run of spaces and tabs one space, none at a line's end, no
/// empty lines at the end, and a final CRLF unless the body is empty.
pub(super) fn relaxed_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut pending_blank = 0_usize;
    let mut lines = body.split(|&b| b == b'\n').peekable();
    while let Some(line) = lines.next() {
        // The text after the last CRLF is a line only if it holds something.
        if lines.peek().is_none() && line.is_empty() {
            break;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut canonical = Vec::with_capacity(line.len());
        let mut space = false;
        for &b in line {
            if b == b' ' || b == b'\t' {
                space = true;
            } else {
                if space {
                    canonical.push(b' ');
                }
                space = false;
                canonical.push(b);
            }
        }
        if canonical.is_empty() {
            pending_blank += 1;
            continue;
        }
        for _ in 0..pending_blank {
            out.extend_from_slice(b"\r\n");
        }
        pending_blank = 0;
        out.extend_from_slice(&canonical);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The `h=` list for these header names: each name once for every field of it the message
/// has, and once more. A verifier takes a name's fields from the bottom up, and a name
/// listed past the fields there are stands for a field that must not exist: a `Subject:`
/// prepended on the way then breaks the signature (oversigning, RFC 6376 8.15).
pub(super) fn signed_names<'n>(names: &[&'n str], fields: &[Field<'_>]) -> Vec<&'n str> {
    let mut list = Vec::new();
    for name in names {
        let present = fields
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case(name.as_bytes()))
            .count();
        list.extend(std::iter::repeat_n(*name, present + 1));
    }
    list
}

/// The signed fields in `h=` order, each name's fields taken from the bottom up, in relaxed
/// form: what the signature's hash covers before the `DKIM-Signature` field itself.
pub(super) fn signed_headers(list: &[&str], fields: &[Field<'_>]) -> Vec<u8> {
    let mut used = vec![false; fields.len()];
    let mut out = Vec::new();
    for name in list {
        let next = fields
            .iter()
            .enumerate()
            .rev()
            .find(|(i, f)| !used[*i] && f.name.eq_ignore_ascii_case(name.as_bytes()));
        if let Some((i, field)) = next {
            used[i] = true;
            out.extend_from_slice(&relaxed_header(field.text));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_unfolded_and_their_spaces_reduced() {
        assert_eq!(
            relaxed_header(b"Subject :  Hello\r\n \t World  "),
            b"subject:Hello World\r\n"
        );
        assert_eq!(
            relaxed_header(b"Subject: Re: a:  b"),
            b"subject:Re: a: b\r\n"
        );
        let head = b"From: a@example.com\r\nTo: b@example.com,\r\n c@example.com\r\nSubject: x";
        let found = fields(head);
        assert_eq!(found.len(), 3);
        assert_eq!(found[1].text, b"To: b@example.com,\r\n c@example.com");
        assert_eq!(found[2].name, b"Subject");
    }

    #[test]
    fn bodies_lose_trailing_space_and_empty_lines() {
        assert_eq!(
            relaxed_body(b"a  b \r\n\r\nc\t\r\n\r\n\r\n"),
            b"a b\r\n\r\nc\r\n"
        );
        assert_eq!(relaxed_body(b""), b"");
        assert_eq!(relaxed_body(b"\r\n\r\n"), b"");
        assert_eq!(relaxed_body(b"no newline"), b"no newline\r\n");
    }

    #[test]
    fn each_name_is_signed_once_more_than_it_occurs() {
        let found = fields(b"Subject: a\r\nFrom: x\r\nTo: y");
        assert_eq!(
            signed_names(&["From", "Subject", "Cc"], &found),
            ["From", "From", "Subject", "Subject", "Cc"]
        );
    }
}
