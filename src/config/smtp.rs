//! Options for the relays: the main one (`OUTBOXD_SMTP_URL`), the fallbacks tried after it
//! (`OUTBOXD_SMTP_FALLBACK_URLS`), and how to reach them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use secrecy::SecretString;

use crate::mailer::SmtpSettings;
use crate::text::{debug_showing_only, redact_url};

#[derive(Args, Clone)]
pub struct SmtpArgs {
    /// SMTP server, in lettre's URL form: smtp://user:pass@host:587?tls=required, smtps://host.
    /// Unset: messages are only logged and marked dispatched (development only).
    #[arg(long, env = "OUTBOXD_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,

    /// Relays tried in order after OUTBOXD_SMTP_URL, comma-separated URLs of the same form: a
    /// message moves on only when it failed before its data went (so no relay has it).
    #[arg(long, env = "OUTBOXD_SMTP_FALLBACK_URLS", value_delimiter = ',', hide_env_values = true)]
    pub smtp_fallback_urls: Vec<String>,

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
    smtp_ca_file,
});

impl SmtpArgs {
    /// `None` without `--smtp-url`: messages are only logged.
    pub fn settings(&self, timeout: Duration, pool_size: u32) -> anyhow::Result<Option<SmtpSettings>> {
        let fallbacks: Vec<&str> = self
            .smtp_fallback_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .collect();
        let url = match self.smtp_url.as_deref().map(str::trim) {
            None | Some("") => {
                if self.smtp_ca_file.is_some() {
                    bail!("--smtp-ca-file / OUTBOXD_SMTP_CA_FILE is set but OUTBOXD_SMTP_URL is not");
                }
                if !fallbacks.is_empty() {
                    bail!("OUTBOXD_SMTP_FALLBACK_URLS is set but OUTBOXD_SMTP_URL is not: fallbacks follow a main relay");
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
        let settings = SmtpSettings {
            url: SecretString::from(url.to_owned()),
            fallback_urls: fallbacks.iter().map(|u| SecretString::from((*u).to_owned())).collect(),
            timeout,
            pool_size,
            ca_certificates,
            allow_plaintext_auth: self.smtp_allow_plaintext_auth,
        };
        settings.validate().map_err(|e| {
            if e.starts_with("fallback ") {
                anyhow::anyhow!("invalid --smtp-fallback-urls / OUTBOXD_SMTP_FALLBACK_URLS: {e}")
            } else {
                anyhow::anyhow!("invalid --smtp-url / OUTBOXD_SMTP_URL {}: {e}", redact_url(url))
            }
        })?;
        Ok(Some(settings))
    }
}
