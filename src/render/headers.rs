//! The headers outboxd adds beyond addresses, subject and body: `X-Outbox-Id`, those a
//! kind declares (`headers.txt`),
//! and, for a bulk kind when one-click unsubscribe is on, RFC 8058's two in place of any
//! declared `List-Unsubscribe` and `List-Unsubscribe-Post`: outboxd's link first, then the
//! declared header's `mailto:` URIs (its other URIs would not honour the one-click promise).

use std::collections::BTreeSet;
use std::sync::Arc;

use lettre::message::MessageBuilder;
use lettre::message::header::{Header, HeaderName, HeaderValue};
use serde_json::Value;

use super::{RenderError, Renderer, addresses, extras};
use crate::lane::Lane;
use crate::suppression::{Address, Scope};
use crate::unsubscribe::OneClick;

/// The `X-Outbox-Id` header: the row an email came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XOutboxId(pub i64);

impl Header for XOutboxId {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("X-Outbox-Id")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(s.trim().parse()?))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.to_string())
    }
}

/// One-click unsubscribe links, for the bulk kinds.
pub(super) struct OneClickLinks {
    pub links: Arc<OneClick>,
    pub bulk: BTreeSet<String>,
}

const LIST_UNSUBSCRIBE: &str = "List-Unsubscribe";
const LIST_UNSUBSCRIBE_POST: &str = "List-Unsubscribe-Post";

impl Renderer {
    /// `builder` with the kind's declared headers, rendered, and the one-click ones.
    pub(super) fn added_headers(
        &self,
        mut builder: MessageBuilder,
        id: i64,
        kind: &str,
        payload: &Value,
        context: &minijinja::Value,
    ) -> Result<MessageBuilder, RenderError> {
        let one_click = self.one_click.as_ref().filter(|o| o.bulk.contains(kind));
        let mut mailto = Vec::new();
        for header in self.declared.get(kind).into_iter().flatten() {
            let rendered = self.render_template(&header.template, context)?;
            let Some(value) = extras::header_value(header, &rendered)? else {
                continue;
            };
            if one_click.is_some() {
                if header.name.eq_ignore_ascii_case(LIST_UNSUBSCRIBE) {
                    mailto.extend(mailto_uris(&rendered));
                    continue;
                }
                if header.name.eq_ignore_ascii_case(LIST_UNSUBSCRIBE_POST) {
                    continue;
                }
            }
            builder = builder.raw_header(value);
        }
        let Some(one_click) = one_click else {
            return Ok(builder);
        };
        // The link names the first `to` address: bulk mail goes one recipient a message.
        let Some(recipient) = addresses::first_to(payload)? else {
            return Ok(builder);
        };
        let url = one_click
            .links
            .url_for(&Address::of(&recipient.email), Scope::Lane(Lane::Bulk), id)
            .map_err(RenderError::Build)?;
        let uris: Vec<String> = std::iter::once(format!("<{url}>")).chain(mailto).collect();
        // Folded between URIs, written as it is: lettre would encode a word that holds the
        // fold's line break, and a receiver would find no URI in it.
        Ok(builder
            .raw_header(HeaderValue::dangerous_new_pre_encoded(
                HeaderName::new_from_ascii_str(LIST_UNSUBSCRIBE),
                uris.join(", "),
                uris.join(",\r\n "),
            ))
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str(LIST_UNSUBSCRIBE_POST),
                "List-Unsubscribe=One-Click".to_owned(),
            )))
    }
}

/// The `<mailto:...>` URIs of a rendered `List-Unsubscribe` value, each whole between its
/// angle brackets (a `mailto:` may hold commas: `mailto:a@x.example,b@x.example`).
fn mailto_uris(value: &str) -> Vec<String> {
    let mut uris = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find('<') {
        let Some(end) = rest[start..].find('>') else {
            break;
        };
        let uri = &rest[start..=start + end];
        // ASCII only: the header is written as it is, never encoded.
        if uri.len() > 8 && uri.is_ascii() && uri[1..8].eq_ignore_ascii_case("mailto:") {
            uris.push(uri.to_owned());
        }
        rest = &rest[start + end + 1..];
    }
    uris
}

#[cfg(test)]
mod tests {
    use super::mailto_uris;

    #[test]
    fn only_the_mailto_uris_of_a_declared_header_are_kept() {
        assert_eq!(
            mailto_uris("<https://x.example/u>, <mailto:unsub@x.example?subject=u>"),
            vec!["<mailto:unsub@x.example?subject=u>"]
        );
        assert_eq!(mailto_uris("<MAILTO:a@b.example>"), vec!["<MAILTO:a@b.example>"]);
        assert_eq!(
            mailto_uris("<mailto:a@b.example,c@b.example>, <https://x>"),
            vec!["<mailto:a@b.example,c@b.example>"]
        );
        assert!(mailto_uris("mailto:a@b.example").is_empty());
    }
}
