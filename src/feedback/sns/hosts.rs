//! Where SNS's certificates and subscription confirmations may come from: the host
//! patterns of `OUTBOXD_SNS_CERTIFICATE_HOSTS`, whose `*` is an AWS region (the topic's own,
//! once a topic is known).

/// Where SNS's certificates and confirmations may come from: `host` (port 443) or
/// `host:port`, where one label of the host may be `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    labels: Vec<String>,
    port: u16,
}

/// Host patterns from a comma-separated list. A `*` label stands for one AWS region name
/// (`us-east-1`, `us-gov-west-1`, `cn-north-1`): a wildcard for any label would let
/// `sns.s3.amazonaws.com`, a bucket's website, serve a certificate.
pub fn parse_host_patterns(text: &str) -> Result<Vec<HostPattern>, String> {
    let patterns = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pattern| {
            let (host, port) = match pattern.rsplit_once(':') {
                Some((host, port)) => (
                    host,
                    port.parse()
                        .map_err(|_| format!("{pattern:?}: the port is not a number"))?,
                ),
                None => (pattern, 443),
            };
            let labels: Vec<String> = host.split('.').map(str::to_ascii_lowercase).collect();
            let valid_label = |label: &String| {
                label == "*"
                    || (!label.is_empty()
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            };
            let wildcards = labels.iter().filter(|l| *l == "*").count();
            if !labels.iter().all(valid_label) || wildcards > 1 || labels.len() < wildcards + 1 {
                return Err(format!(
                    "{pattern:?} is not a host pattern (a host name, one label of which may be *)"
                ));
            }
            Ok(HostPattern { labels, port })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if patterns.is_empty() {
        return Err("expected at least one host pattern".to_owned());
    }
    Ok(patterns)
}

/// An AWS region name: `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-northwest-1`.
fn is_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts[parts.len() - 1].bytes().all(|b| b.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

impl HostPattern {
    /// Whether `host:port` matches, its `*` label being a region; the topic's own, when one
    /// is given: SNS signs a topic's messages from its region's host, and a fetch from any
    /// other (`sns.zz-fake-1.amazonaws.com` is a region by its form) is a forgery's.
    pub(super) fn matches_in(&self, host: &str, port: u16, region: Option<&str>) -> bool {
        let host: Vec<&str> = host.split('.').collect();
        self.port == port
            && self.labels.len() == host.len()
            && self.labels.iter().zip(&host).all(|(pattern, label)| {
                if pattern == "*" {
                    is_region(label) && region.is_none_or(|region| region == *label)
                } else {
                    pattern.eq_ignore_ascii_case(label)
                }
            })
    }
}

/// The region of a topic ARN (`arn:aws:sns:REGION:ACCOUNT:NAME`).
pub(super) fn region_of(topic_arn: &str) -> Option<&str> {
    topic_arn
        .split(':')
        .nth(3)
        .filter(|region| is_region(region))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_CERTIFICATE_HOSTS: &str = super::super::DEFAULT_CERTIFICATE_HOSTS;

    #[test]
    fn only_sns_hosts_match() {
        let patterns = parse_host_patterns(DEFAULT_CERTIFICATE_HOSTS).unwrap();
        let ok = |host: &str, port| patterns.iter().any(|p| p.matches_in(host, port, None));
        assert!(ok("sns.us-east-1.amazonaws.com", 443));
        assert!(ok("sns.us-gov-west-1.amazonaws.com", 443));
        assert!(ok("sns.cn-north-1.amazonaws.com.cn", 443));
        assert!(!ok("sns.us-east-1.amazonaws.com", 8443));
        // S3 website endpoints of a bucket named `sns`.
        assert!(!ok("sns.s3.amazonaws.com", 443));
        assert!(!ok("sns.s3-us-west-2.amazonaws.com", 443));
        assert!(!ok("sns.evil.example.amazonaws.com", 443));
        assert!(!ok("sns.us-east-1.amazonaws.com.evil.test", 443));
        assert!(!ok("evil.test", 443));
        let local = parse_host_patterns("localhost:8443").unwrap();
        assert!(
            local[0].matches_in("localhost", 8443, None)
                && !local[0].matches_in("localhost", 443, None)
        );
        // A topic's messages come from its region's host only.
        let topic = Some("eu-west-1");
        assert!(
            patterns
                .iter()
                .any(|p| p.matches_in("sns.eu-west-1.amazonaws.com", 443, topic))
        );
        assert!(
            !patterns
                .iter()
                .any(|p| p.matches_in("sns.zz-fake-1.amazonaws.com", 443, topic))
        );
        assert_eq!(region_of("arn:aws:sns:eu-west-1:123456789012:t"), topic);
        for bad in ["a b", "*", "*.*.example.com", "host:port"] {
            assert!(parse_host_patterns(bad).is_err(), "{bad:?} accepted");
        }
    }
}
