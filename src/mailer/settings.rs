//! The relays' settings, validated before anything starts: each lane's relays in the order
//! they are tried, and how every relay is reached.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::ses::SesTarget;
use super::target::Target;
use crate::message::Lane;
use crate::text::redact_url;

/// SMTP settings, validated before anything starts.
#[derive(Clone)]
pub struct SmtpSettings {
    /// lettre's URL form: `smtp://user:pass@host:587?tls=required`, `smtps://host`.
    pub url: SecretString,
    /// Relays tried in order after `url`, for messages that could not be handed to it
    /// (`OUTBOXD_SMTP_FALLBACK_URLS`).
    pub fallback_urls: Vec<SecretString>,
    /// The bulk lane's own relays, in the order they are tried (`OUTBOXD_BULK_SMTP_URL`,
    /// then `OUTBOXD_BULK_SMTP_FALLBACK_URLS`); empty: the bulk lane sends through `url`
    /// and its fallbacks.
    pub bulk_urls: Vec<SecretString>,
    /// Bounds the connect and each whole SMTP transaction.
    pub timeout: Duration,
    /// Connections kept open, and sends in flight at once, per relay.
    pub pool_size: u32,
    /// PEM certificates to trust for the server's TLS certificate (a private CA).
    pub ca_certificates: Option<Vec<u8>>,
    /// Send credentials over a connection without TLS to a server that is not on this
    /// machine (refused otherwise).
    pub allow_plaintext_auth: bool,
    /// Where the `ses://` relays' API is, instead of AWS's (`OUTBOXD_SES_ENDPOINT_URL`).
    pub ses_endpoint: Option<String>,
}

/// How one relay is reached: SMTP, or SES's API.
pub enum RelayTarget {
    Smtp(Target),
    Ses(SesTarget),
}

impl std::fmt::Debug for SmtpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpSettings")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("fallbacks", &self.fallback_urls.len())
            .field("bulk_relays", &self.bulk_urls.len())
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .field("ca_certificates", &self.ca_certificates.is_some())
            .field("allow_plaintext_auth", &self.allow_plaintext_auth)
            .field("ses_endpoint", &self.ses_endpoint)
            .finish()
    }
}

/// One bad relay URL: which setting, and where in it (never the URL, which may hold a
/// password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct BadRelay {
    /// The relays' lane: the transactional list is `OUTBOXD_SMTP_URL` and its fallbacks.
    pub lane: Lane,
    /// 0 for the list's first relay, 1 for its first fallback, ...
    pub place: usize,
    pub problem: String,
}

impl SmtpSettings {
    /// Checks the URLs without connecting. One `OUTBOXD_SES_ENDPOINT_URL` serves one
    /// region: `ses://` relays of several regions beside it are refused.
    pub fn validate(&self) -> Result<(), BadRelay> {
        let mut regions: Vec<String> = Vec::new();
        for lane in Lane::ALL {
            for (place, target) in self.targets(lane)?.iter().enumerate() {
                let RelayTarget::Ses(ses) = target else { continue };
                if self.ses_endpoint.is_some() && regions.iter().any(|r| *r != ses.region()) {
                    return Err(BadRelay {
                        lane,
                        place,
                        problem: "OUTBOXD_SES_ENDPOINT_URL serves one region, and the ses:// relays name several".to_owned(),
                    });
                }
                regions.push(ses.region().to_owned());
            }
        }
        Ok(())
    }

    /// A lane's relays' targets, in the order they are tried; none for a lane without
    /// relays of its own.
    pub(super) fn targets(&self, lane: Lane) -> Result<Vec<RelayTarget>, BadRelay> {
        let urls: Vec<&SecretString> = match lane {
            Lane::Transactional => std::iter::once(&self.url)
                .chain(&self.fallback_urls)
                .collect(),
            Lane::Bulk => self.bulk_urls.iter().collect(),
        };
        urls.into_iter()
            .enumerate()
            .map(|(place, url)| {
                self.target(url.expose_secret()).map_err(|problem| BadRelay {
                    lane,
                    place,
                    problem,
                })
            })
            .collect()
    }

    fn target(&self, url: &str) -> Result<RelayTarget, String> {
        if url.get(..6).is_some_and(|scheme| scheme.eq_ignore_ascii_case("ses://")) {
            let parsed = url::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
            return SesTarget::parse(&parsed, self.ses_endpoint.as_deref()).map(RelayTarget::Ses);
        }
        Target::parse_url(url, self).map(RelayTarget::Smtp)
    }
}
