//! Options for bounces that come back later: the return paths' domain, the listener that
//! takes the DSNs sent there, and the secret the return paths are signed with.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use secrecy::ExposeSecret as _;

use crate::bounces::BounceSettings;
use crate::message::MIN_BOUNCE_SECRET_CHARS;
use crate::text::debug_showing_only;

#[derive(Args, Clone)]
pub struct BounceArgs {
    /// The domain of each email's own signed return path (bounces+ID.SIG@DOMAIN): its MX,
    /// or the relay's transport, must lead to OUTBOXD_BOUNCE_LISTEN. Use a subdomain of
    /// the From domains, so that SPF aligns. Needs OUTBOXD_BOUNCE_SECRET.
    #[arg(long, env = "OUTBOXD_BOUNCE_DOMAIN")]
    pub bounce_domain: Option<String>,

    /// Where outboxd takes the DSNs sent to the return paths, over SMTP (e.g. 0.0.0.0:2525).
    /// Unset: another replica or process takes them.
    #[arg(long, env = "OUTBOXD_BOUNCE_LISTEN")]
    pub bounce_listen: Option<SocketAddr>,

    /// The secret return paths are signed with, 32 characters at least; several,
    /// comma-separated, to rotate: the first signs, each is accepted.
    #[arg(long, env = "OUTBOXD_BOUNCE_SECRET", hide_env_values = true)]
    pub bounce_secret: Option<String>,

    /// A file holding OUTBOXD_BOUNCE_SECRET (a Kubernetes secret's key).
    #[arg(long, env = "OUTBOXD_BOUNCE_SECRET_FILE")]
    pub bounce_secret_file: Option<PathBuf>,
}

debug_showing_only!(BounceArgs as args {
    bounce_domain,
    bounce_listen,
    bounce_secret = args.bounce_secret.as_ref().map(|_| "***"),
    bounce_secret_file,
});

impl BounceArgs {
    /// The settings, or `None` when bounces are not taken back.
    pub fn settings(&self) -> anyhow::Result<Option<BounceSettings>> {
        let secret = super::secret_given(
            self.bounce_secret.as_deref(),
            self.bounce_secret_file.as_deref(),
            "OUTBOXD_BOUNCE_SECRET",
        )?;
        let domain = self.bounce_domain.as_deref().map(str::trim).filter(|d| !d.is_empty());
        let (domain, secrets) = match (domain, secret) {
            (None, None) if self.bounce_listen.is_none() => return Ok(None),
            (None, _) => bail!(
                "OUTBOXD_BOUNCE_LISTEN or OUTBOXD_BOUNCE_SECRET is set but OUTBOXD_BOUNCE_DOMAIN is not: bounces need the return paths' domain"
            ),
            (Some(_), None) => bail!(
                "OUTBOXD_BOUNCE_DOMAIN is set but OUTBOXD_BOUNCE_SECRET (or _FILE) is not: the return paths are signed with it"
            ),
            (Some(domain), Some(secrets)) => (domain, secrets),
        };
        let domain = super::values::domain_name(domain)
            .map_err(|e| anyhow::anyhow!("invalid --bounce-domain / OUTBOXD_BOUNCE_DOMAIN {e}"))?;
        if !domain.contains('.') {
            bail!("invalid --bounce-domain / OUTBOXD_BOUNCE_DOMAIN {domain:?}: not a domain with a dot");
        }
        let short = secrets
            .expose_secret()
            .split(',')
            .any(|s| s.trim().chars().count() < MIN_BOUNCE_SECRET_CHARS);
        if short {
            bail!("invalid OUTBOXD_BOUNCE_SECRET: each secret must be {MIN_BOUNCE_SECRET_CHARS} characters at least");
        }
        Ok(Some(BounceSettings {
            domain: domain.to_ascii_lowercase(),
            listen: self.bounce_listen,
            secrets,
        }))
    }
}
