//! Withdrawing messages by filter: the filter of a bulk cancel, checked as it is built.
//! (What `outbox_cancel` answers is the producer crate's `CancelAnswer`.)

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{Kind, Tag};

/// Which pending messages a bulk action is about: at least one criterion, each checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "FilterRequest")]
pub struct PendingFilter {
    pub kind: Option<Kind>,
    pub tag: Option<Tag>,
    /// Created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// A recipient's domain, lower-case: `example.com` matches `ada@example.com`.
    pub recipient_domain: Option<String>,
}

/// A filter as a request gives it, before its checks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterRequest {
    pub kind: Option<String>,
    pub tag: Option<String>,
    pub created_before: Option<DateTime<Utc>>,
    pub created_after: Option<DateTime<Utc>>,
    pub recipient_domain: Option<String>,
}

impl TryFrom<FilterRequest> for PendingFilter {
    type Error = String;

    fn try_from(request: FilterRequest) -> Result<Self, String> {
        let kind = request
            .kind
            .map(|kind| Kind::parse(&kind).map_err(|e| e.to_string()))
            .transpose()?;
        let tag = request
            .tag
            .map(|tag| Tag::parse(&tag).map_err(|e| e.to_string()))
            .transpose()?;
        let recipient_domain = request
            .recipient_domain
            .map(|domain| parse_domain(&domain))
            .transpose()?;
        if let (Some(before), Some(after)) = (request.created_before, request.created_after)
            && before <= after
        {
            return Err(format!(
                "created_before ({before}) must be later than created_after ({after}): the filter matches nothing"
            ));
        }
        let filter = PendingFilter {
            kind,
            tag,
            created_before: request.created_before,
            created_after: request.created_after,
            recipient_domain,
        };
        if filter == PendingFilter::default() {
            return Err("name at least one of kind, tag, created_before, created_after, recipient_domain: a filter of nothing would cancel every pending message".into());
        }
        Ok(filter)
    }
}

impl PendingFilter {
    /// The filter as the audit trail keeps it.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(kind) = &self.kind {
            parts.push(format!("kind={kind}"));
        }
        if let Some(tag) = &self.tag {
            parts.push(format!("tag={}", tag.as_str()));
        }
        if let Some(before) = self.created_before {
            parts.push(format!("created_before={}", before.to_rfc3339()));
        }
        if let Some(after) = self.created_after {
            parts.push(format!("created_after={}", after.to_rfc3339()));
        }
        if let Some(domain) = &self.recipient_domain {
            parts.push(format!("recipient_domain={domain}"));
        }
        parts.join(" ")
    }
}

/// A domain name as an envelope address ends: letters, digits, hyphens and dots, in labels
/// of 1 to 63 characters; lower-cased.
fn parse_domain(text: &str) -> Result<String, String> {
    let domain = text.trim().trim_start_matches('@').to_ascii_lowercase();
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err(format!(
            "recipient_domain {text:?} is not a domain name (letters, digits, hyphens and dots)"
        ));
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(json: &str) -> Result<PendingFilter, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn a_filter_of_nothing_or_that_cannot_be_meant_is_refused() {
        for (bad, says) in [
            ("{}", "name at least one"),
            (r#"{"kind": "Bad Kind"}"#, "kind"),
            (r#"{"recipient_domain": "exa%mple.com"}"#, "not a domain name"),
            (r#"{"recipient_domain": "a..b"}"#, "not a domain name"),
            (r#"{"tag": ""}"#, "tag"),
            (r#"{"kinds": "x"}"#, "unknown field"),
            (
                r#"{"created_before": "2026-01-01T00:00:00Z", "created_after": "2026-02-01T00:00:00Z"}"#,
                "matches nothing",
            ),
        ] {
            let error = filter(bad).expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn a_domain_is_kept_lower_case_without_its_at() {
        let f = filter(r#"{"recipient_domain": "@Example.COM", "kind": "newsletter"}"#).unwrap();
        assert_eq!(f.recipient_domain.as_deref(), Some("example.com"));
        assert_eq!(f.describe(), "kind=newsletter recipient_domain=example.com");
    }
}
