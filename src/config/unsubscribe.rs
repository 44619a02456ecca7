//! Options for one-click unsubscribe (RFC 8058): where the internet reaches outboxd, and
//! the secret its links are sealed with. Both, or neither.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use secrecy::SecretString;

use crate::text::debug_showing_only;
use crate::unsubscribe::OneClick;

#[derive(Args, Clone)]
pub struct UnsubscribeArgs {
    /// The base URL at which the internet reaches the listener serving the webhooks and
    /// /unsubscribe (e.g. https://mail.acme.example); with OUTBOXD_UNSUBSCRIBE_SECRET, bulk
    /// emails carry a one-click unsubscribe link (RFC 8058). HTTPS, except for a loopback host.
    #[arg(long, env = "OUTBOXD_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// The secret unsubscribe links are sealed with, 32 characters at least; several,
    /// comma-separated, to rotate: the first makes new links, each opens links.
    #[arg(long, env = "OUTBOXD_UNSUBSCRIBE_SECRET", hide_env_values = true)]
    pub unsubscribe_secret: Option<String>,

    /// A file holding OUTBOXD_UNSUBSCRIBE_SECRET (a Kubernetes secret's key).
    #[arg(long, env = "OUTBOXD_UNSUBSCRIBE_SECRET_FILE")]
    pub unsubscribe_secret_file: Option<PathBuf>,
}

debug_showing_only!(UnsubscribeArgs as args {
    public_url,
    unsubscribe_secret = args.unsubscribe_secret.as_ref().map(|_| "***"),
    unsubscribe_secret_file,
});

impl UnsubscribeArgs {
    /// The links' settings, or `None` when one-click unsubscribe is off.
    pub fn one_click(&self) -> anyhow::Result<Option<OneClick>> {
        let secret = self.secret()?;
        let url = self.public_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
        let (url, secret) = match (url, secret) {
            (None, None) => return Ok(None),
            (Some(url), Some(secret)) => (url, secret),
            (Some(_), None) => bail!(
                "OUTBOXD_PUBLIC_URL is set but OUTBOXD_UNSUBSCRIBE_SECRET (or _FILE) is not: one-click unsubscribe needs both"
            ),
            (None, Some(_)) => bail!(
                "OUTBOXD_UNSUBSCRIBE_SECRET is set but OUTBOXD_PUBLIC_URL is not: one-click unsubscribe needs both"
            ),
        };
        OneClick::new(url, &secret)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_PUBLIC_URL or OUTBOXD_UNSUBSCRIBE_SECRET: {e}"))
    }

    fn secret(&self) -> anyhow::Result<Option<SecretString>> {
        super::secret_given(
            self.unsubscribe_secret.as_deref(),
            self.unsubscribe_secret_file.as_deref(),
            "OUTBOXD_UNSUBSCRIBE_SECRET",
        )
    }
}
