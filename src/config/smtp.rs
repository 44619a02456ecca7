//! Options for the relays: the main one (`OUTBOXD_SMTP_URL`), the fallbacks tried after it
//! (`OUTBOXD_SMTP_FALLBACK_URLS`), the bulk lane's own (`OUTBOXD_BULK_SMTP_URL`), and how to
//! reach them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use secrecy::SecretString;

use crate::mailer::SmtpSettings;
use crate::message::Lane;
use crate::text::{debug_showing_only, redact_url};

#[derive(Args, Clone)]
pub struct SmtpArgs {
    /// SMTP server, in lettre's URL form: smtp://user:pass@host:587?tls=required, smtps://host;
    /// or ses://REGION for the SES API v2 (credentials from the standard AWS chain).
    /// Unset: messages are only logged and marked dispatched (development only).
    #[arg(long, env = "OUTBOXD_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,

    /// Relays tried in order after OUTBOXD_SMTP_URL, comma-separated URLs of the same form: a
    /// message moves on only when it failed before its data went (so no relay has it).
    #[arg(long, env = "OUTBOXD_SMTP_FALLBACK_URLS", value_delimiter = ',', hide_env_values = true)]
    pub smtp_fallback_urls: Vec<String>,

    /// The bulk lane's own relay, of the same form: bulk kinds send through it (and its
    /// fallbacks), with connections and a circuit of their own. Unset: both lanes share
    /// OUTBOXD_SMTP_URL.
    #[arg(long, env = "OUTBOXD_BULK_SMTP_URL", hide_env_values = true)]
    pub bulk_smtp_url: Option<String>,

    /// Relays tried in order after OUTBOXD_BULK_SMTP_URL, comma-separated.
    #[arg(long, env = "OUTBOXD_BULK_SMTP_FALLBACK_URLS", value_delimiter = ',', hide_env_values = true)]
    pub bulk_smtp_fallback_urls: Vec<String>,

    /// The SES API's endpoint for the ses://REGION relays, instead of AWS's
    /// (https://email.REGION.amazonaws.com): a VPC endpoint, or an emulator in tests.
    #[arg(long, env = "OUTBOXD_SES_ENDPOINT_URL")]
    pub ses_endpoint_url: Option<String>,

    /// PEM file of CA certificates to trust, besides the system's, for the SMTP servers' TLS
    /// certificates: a relay whose certificate a private CA signed.
    #[arg(long, env = "OUTBOXD_SMTP_CA_FILE")]
    pub smtp_ca_file: Option<PathBuf>,

    /// Send SMTP credentials over a connection without TLS to a server that is not on this
    /// machine (refused otherwise): only for a relay on a network you trust.
    #[arg(long, env = "OUTBOXD_SMTP_ALLOW_PLAINTEXT_AUTH")]
    pub smtp_allow_plaintext_auth: bool,
}

debug_showing_only!(SmtpArgs as args {
    smtp_url = args.smtp_url.as_deref().map(redact_url),
    smtp_fallback_urls = args.smtp_fallback_urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
    bulk_smtp_url = args.bulk_smtp_url.as_deref().map(redact_url),
    bulk_smtp_fallback_urls = args.bulk_smtp_fallback_urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
    smtp_ca_file,
    ses_endpoint_url,
});

impl SmtpArgs {
    /// `None` without `--smtp-url`: messages are only logged.
    pub fn settings(&self, timeout: Duration, pool_size: u32) -> anyhow::Result<Option<SmtpSettings>> {
        let fallbacks = listed(&self.smtp_fallback_urls);
        let bulk_url = self.bulk_smtp_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
        let bulk_fallbacks = listed(&self.bulk_smtp_fallback_urls);
        if bulk_url.is_none() && !bulk_fallbacks.is_empty() {
            bail!("OUTBOXD_BULK_SMTP_FALLBACK_URLS is set but OUTBOXD_BULK_SMTP_URL is not: fallbacks follow a main relay");
        }
        let bulk: Vec<&str> = bulk_url.into_iter().chain(bulk_fallbacks).collect();
        let url = match self.smtp_url.as_deref().map(str::trim) {
            None | Some("") => {
                if self.smtp_ca_file.is_some() {
                    bail!("--smtp-ca-file / OUTBOXD_SMTP_CA_FILE is set but OUTBOXD_SMTP_URL is not");
                }
                if !fallbacks.is_empty() {
                    bail!("OUTBOXD_SMTP_FALLBACK_URLS is set but OUTBOXD_SMTP_URL is not: fallbacks follow a main relay");
                }
                if !bulk.is_empty() {
                    bail!("OUTBOXD_BULK_SMTP_URL is set but OUTBOXD_SMTP_URL is not: the transactional lane needs a relay too");
                }
                return Ok(None);
            }
            Some(url) => url,
        };
        let ca_certificates = match &self.smtp_ca_file {
            Some(path) => Some(std::fs::read(path).with_context(|| {
                format!("cannot read --smtp-ca-file / OUTBOXD_SMTP_CA_FILE {}", path.display())
            })?),
            None => None,
        };
        let secrets = |urls: &[&str]| urls.iter().map(|u| SecretString::from((*u).to_owned())).collect();
        let settings = SmtpSettings {
            url: SecretString::from(url.to_owned()),
            fallback_urls: secrets(&fallbacks),
            bulk_urls: secrets(&bulk),
            timeout,
            pool_size,
            ca_certificates,
            allow_plaintext_auth: self.smtp_allow_plaintext_auth,
            ses_endpoint: self.ses_endpoint_url.as_deref().map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned),
        };
        settings.validate().map_err(|bad| {
            let setting = match (bad.lane, bad.place) {
                (Lane::Transactional, 0) => format!("--smtp-url / OUTBOXD_SMTP_URL {}", redact_url(url)),
                (Lane::Transactional, n) => format!("--smtp-fallback-urls / OUTBOXD_SMTP_FALLBACK_URLS (fallback {n})"),
                (Lane::Bulk, 0) => "--bulk-smtp-url / OUTBOXD_BULK_SMTP_URL".to_owned(),
                (Lane::Bulk, n) => format!("--bulk-smtp-fallback-urls / OUTBOXD_BULK_SMTP_FALLBACK_URLS (fallback {n})"),
            };
            anyhow::anyhow!("invalid {setting}: {}", bad.problem)
        })?;
        Ok(Some(settings))
    }
}

/// The URLs of a comma-separated list, blanks left out.
fn listed(urls: &[String]) -> Vec<&str> {
    urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()).collect()
}
