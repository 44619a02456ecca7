//! Statement templates: SQL text as written in a `.sql` file, with explicit markers where
//! the text depends on the installation. `{{schema}}` stands before each of outboxd's
//! tables and functions and becomes its schema (`"mail".`), or nothing; outboxd's own
//! statements also include shared predicates by name (`{{pending}}`). Nothing else in the
//! text is read: a name is put in a schema because the file says so, never guessed.
//!
//! An application that queries outboxd's tables itself can write its statements the same
//! way and render them with [`render`].

use crate::schema::Schema;

/// Why a template could not be rendered: a fault in the text, found when it is first
/// rendered (outboxd renders every statement at start).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateError {
    #[error("unknown marker {{{{{0}}}}} in a statement template")]
    UnknownMarker(String),
    #[error("a marker opened with {{{{ is not closed with }}}}: {0:?}")]
    Unclosed(String),
    #[error("markers nested more than {MAX_DEPTH} deep, from {0:?}")]
    TooDeep(String),
}

/// How deep included text may include more: far above any real use, so that a fragment
/// that includes itself is an error, not a hang.
const MAX_DEPTH: usize = 8;

/// `template` with `{{schema}}` made `schema`'s prefix (or nothing), and no other marker.
///
/// ```
/// let schema: outboxd_producer::Schema = "mail".parse().unwrap();
/// let sql = outboxd_producer::template::render("SELECT count(*) FROM {{schema}}outbox_messages", Some(&schema));
/// assert_eq!(sql.unwrap(), "SELECT count(*) FROM \"mail\".outbox_messages");
/// ```
pub fn render(template: &str, schema: Option<&Schema>) -> Result<String, TemplateError> {
    render_with(template, schema, &|_, _| None)
}

/// [`render`], with `include` giving the text of every other marker: a name, and the
/// argument written in parentheses after it (`{{address_key(e.a)}}`), if any. The text it
/// gives is rendered in turn.
pub fn render_with(
    template: &str,
    schema: Option<&Schema>,
    include: &dyn Fn(&str, Option<&str>) -> Option<String>,
) -> Result<String, TemplateError> {
    render_at(template, schema, include, 0)
}

fn render_at(
    template: &str,
    schema: Option<&Schema>,
    include: &dyn Fn(&str, Option<&str>) -> Option<String>,
    depth: usize,
) -> Result<String, TemplateError> {
    if depth > MAX_DEPTH {
        return Err(TemplateError::TooDeep(template.chars().take(60).collect()));
    }
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(TemplateError::Unclosed(
                rest[start..].chars().take(60).collect(),
            ));
        };
        let marker = after[..end].trim();
        let (name, argument) = match marker.split_once('(') {
            Some((name, argument)) => (name.trim(), argument.strip_suffix(')')),
            None => (marker, None),
        };
        if name == "schema" && argument.is_none() {
            if let Some(schema) = schema {
                out.push_str(&schema.quoted());
                out.push('.');
            }
        } else {
            let text = include(name, argument)
                .ok_or_else(|| TemplateError::UnknownMarker(marker.to_owned()))?;
            out.push_str(&render_at(&text, schema, include, depth + 1)?);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The statement of a `.sql` file, without its header: the comment lines it starts with,
/// which say what the statement is for, its parameters and the index it relies on, and
/// which the server need not read each time.
pub fn body(file: &str) -> &str {
    let mut rest = file;
    while rest.starts_with("--") || rest.starts_with('\n') {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    rest.trim_end()
}

#[cfg(test)]
mod tests {
    use super::{TemplateError, body, render, render_with};
    use crate::Schema;

    fn mail() -> Schema {
        "mail".parse().expect("a valid schema name")
    }

    #[test]
    fn the_schema_marker_becomes_the_schema_or_nothing() {
        let template =
            "UPDATE {{schema}}outbox_messages SET x = {{schema}}outbox_on_the_calendar(x)";
        assert_eq!(
            render(template, Some(&mail())).unwrap(),
            "UPDATE \"mail\".outbox_messages SET x = \"mail\".outbox_on_the_calendar(x)"
        );
        assert_eq!(
            render(template, None).unwrap(),
            "UPDATE outbox_messages SET x = outbox_on_the_calendar(x)"
        );
    }

    #[test]
    fn a_name_without_a_marker_is_left_where_it_is() {
        let template = "SELECT 'outbox_messages', \"outbox_messages\" FROM outbox_messages";
        assert_eq!(render(template, Some(&mail())).unwrap(), template);
    }

    #[test]
    fn included_text_is_rendered_with_its_argument() {
        let include = |name: &str, argument: Option<&str>| match (name, argument) {
            ("pending", None) => Some("dispatched_at IS NULL".to_owned()),
            ("key", Some(argument)) => Some(format!("lower({argument}) {{{{pending}}}}")),
            _ => None,
        };
        assert_eq!(
            render_with("WHERE {{key(e.a)}}", None, &include).unwrap(),
            "WHERE lower(e.a) dispatched_at IS NULL"
        );
    }

    #[test]
    fn an_unknown_or_unclosed_marker_or_an_endless_include_is_refused() {
        assert_eq!(
            render("SELECT {{pending}}", None),
            Err(TemplateError::UnknownMarker("pending".to_owned()))
        );
        assert!(matches!(
            render("SELECT {{schema", None),
            Err(TemplateError::Unclosed(_))
        ));
        let itself = |_: &str, _: Option<&str>| Some("{{again}}".to_owned());
        assert!(matches!(
            render_with("{{again}}", None, &itself),
            Err(TemplateError::TooDeep(_))
        ));
    }

    #[test]
    fn the_body_leaves_the_header_out() {
        assert_eq!(body("-- what\n-- $1 id\n\nSELECT 1\n"), "SELECT 1");
    }
}
