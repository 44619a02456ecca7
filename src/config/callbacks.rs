//! Options for the delivery callbacks to the application: where they go, the secret they
//! are signed with, and how long one is tried.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use secrecy::ExposeSecret as _;

use super::values::{WEEK, parse_duration_up_to};
use crate::callbacks::CallbackSettings;
use crate::text::debug_showing_only;
use crate::webhook_signature::WebhookSecret;

#[derive(Args, Clone)]
pub struct CallbackArgs {
    /// Where each message's terminal events are POSTed, signed per the Standard Webhooks
    /// specification (http:// or https://). Needs OUTBOXD_CALLBACK_SECRET. Unset: none.
    #[arg(long, env = "OUTBOXD_CALLBACK_URL")]
    pub callback_url: Option<String>,

    /// The secret callbacks are signed with: whsec_ followed by the base64 of 24 bytes or
    /// more, as the Standard Webhooks libraries read it.
    #[arg(long, env = "OUTBOXD_CALLBACK_SECRET", hide_env_values = true)]
    pub callback_secret: Option<String>,

    /// A file holding OUTBOXD_CALLBACK_SECRET (a Kubernetes secret's key).
    #[arg(long, env = "OUTBOXD_CALLBACK_SECRET_FILE")]
    pub callback_secret_file: Option<PathBuf>,

    /// How long a callback is tried (with backoff, at most 10 minutes apart) before it is
    /// kept as failed; at most a week.
    #[arg(long, env = "OUTBOXD_CALLBACK_MAX_AGE", default_value = "24h", value_parser = parse_duration_up_to::<WEEK>)]
    pub callback_max_age: Duration,
}

debug_showing_only!(CallbackArgs as args {
    callback_url,
    callback_secret = args.callback_secret.as_ref().map(|_| "***"),
    callback_secret_file,
    callback_max_age,
});

impl CallbackArgs {
    /// The settings, or `None` when no callback is sent.
    pub fn settings(&self) -> anyhow::Result<Option<Arc<CallbackSettings>>> {
        let secret = super::secret_given(
            self.callback_secret.as_deref(),
            self.callback_secret_file.as_deref(),
            "OUTBOXD_CALLBACK_SECRET",
        )?;
        let url = self.callback_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
        let (url, secret) = match (url, secret) {
            (None, None) => return Ok(None),
            (None, Some(_)) => bail!("OUTBOXD_CALLBACK_SECRET is set but OUTBOXD_CALLBACK_URL is not: callbacks need a URL"),
            (Some(_), None) => bail!("OUTBOXD_CALLBACK_URL is set but OUTBOXD_CALLBACK_SECRET (or _FILE) is not: callbacks are signed with it"),
            (Some(url), Some(secret)) => (url, secret),
        };
        let url = url::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("invalid --callback-url / OUTBOXD_CALLBACK_URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            bail!("invalid --callback-url / OUTBOXD_CALLBACK_URL: expected an http:// or https:// URL with a host");
        }
        if !url.username().is_empty() || url.password().is_some() {
            bail!("invalid --callback-url / OUTBOXD_CALLBACK_URL: credentials in the URL would be sent unsigned; the signature authenticates outboxd");
        }
        let secret = WebhookSecret::parse(secret.expose_secret())
            .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_CALLBACK_SECRET: {e}"))?;
        Ok(Some(Arc::new(CallbackSettings {
            url,
            secret,
            max_age: self.callback_max_age,
        })))
    }
}
