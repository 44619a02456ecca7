//! The admin surface's tokens (`OUTBOXD_ADMIN_TOKEN`, `OUTBOXD_ADMIN_READ_TOKEN`, each with
//! `_FILE` and `_NAME`), its address and the host names it answers to. How tokens are
//! rotated: docs/src/admin.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use secrecy::SecretString;

use crate::http::auth::{AdminAuth, AdminHosts};
use crate::http::tokens::{Access, TokenSet};

#[derive(Clone, Default, Args)]
pub struct AdminArgs {
    /// Turns on the admin page (/admin) and API (/api/v1), and may do everything there: as
    /// a Bearer token for the API, as the HTTP Basic password for the page. Several tokens
    /// (comma-separated) are each accepted, so a new one can be rolled out before the old
    /// one is removed.
    #[arg(long, env = "OUTBOXD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// A file holding OUTBOXD_ADMIN_TOKEN (one token a line): read again when it changes,
    /// so that a token is rotated without a restart.
    #[arg(long, env = "OUTBOXD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// The admin token's name in the audit trail, which keeps NAME#FINGERPRINT (the first
    /// 8 hex digits of the token's SHA-256) for each change.
    #[arg(long, env = "OUTBOXD_ADMIN_TOKEN_NAME", default_value = "admin", value_parser = parse_token_name)]
    pub admin_token_name: String,

    /// A token that may only read: list, look up, see timelines and stats; never change
    /// anything (403), never see the payload of an ended message. Turns the admin surface
    /// on by itself. Several may be given, as for OUTBOXD_ADMIN_TOKEN.
    #[arg(long, env = "OUTBOXD_ADMIN_READ_TOKEN", hide_env_values = true)]
    pub admin_read_token: Option<String>,

    /// A file holding OUTBOXD_ADMIN_READ_TOKEN, read again when it changes.
    #[arg(long, env = "OUTBOXD_ADMIN_READ_TOKEN_FILE")]
    pub admin_read_token_file: Option<PathBuf>,

    /// The read-only token's name in the audit trail (its lookups are audited).
    #[arg(long, env = "OUTBOXD_ADMIN_READ_TOKEN_NAME", default_value = "read-only", value_parser = parse_token_name)]
    pub admin_read_token_name: String,

    /// Serve the admin page and API on this address instead of OUTBOXD_LISTEN
    /// (e.g. 127.0.0.1:9899 to keep them off the address Prometheus scrapes).
    #[arg(long, env = "OUTBOXD_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,

    /// Host names the admin page and API answer to, besides IP addresses and localhost
    /// (comma-separated, e.g. admin.example.com; * for any): a request naming another
    /// host gets 421, so that a page reached through DNS rebinding cannot use them.
    #[arg(long, env = "OUTBOXD_ADMIN_HOSTS", default_value = "", value_parser = AdminHosts::parse)]
    pub admin_hosts: AdminHosts,
}

impl AdminArgs {
    /// The tokens, read and checked; `None`: the admin surface is off.
    pub fn auth(&self, listen: SocketAddr) -> anyhow::Result<Option<Arc<AdminAuth>>> {
        let admin = token_set(
            self.admin_token.as_deref(),
            self.admin_token_file.clone(),
            &self.admin_token_name,
            Access::Admin,
            "OUTBOXD_ADMIN_TOKEN",
        )?;
        let read = token_set(
            self.admin_read_token.as_deref(),
            self.admin_read_token_file.clone(),
            &self.admin_read_token_name,
            Access::ReadOnly,
            "OUTBOXD_ADMIN_READ_TOKEN",
        )?;
        if let (Some(admin), Some(read)) = (&admin, &read)
            && admin.shares_a_token_with(read)
        {
            bail!("OUTBOXD_ADMIN_TOKEN and OUTBOXD_ADMIN_READ_TOKEN hold the same token: a token must say whether its holder may change things");
        }
        if admin.is_some() && read.is_some() && self.admin_token_name == self.admin_read_token_name {
            bail!("OUTBOXD_ADMIN_TOKEN_NAME and OUTBOXD_ADMIN_READ_TOKEN_NAME are both {:?}: the audit trail could not tell them apart", self.admin_token_name);
        }
        let on = admin.is_some() || read.is_some();
        if self.admin_listen.is_some() && !on {
            bail!(
                "--admin-listen / OUTBOXD_ADMIN_LISTEN is set but neither OUTBOXD_ADMIN_TOKEN nor OUTBOXD_ADMIN_READ_TOKEN is: the admin surface is off without a token"
            );
        }
        if self.admin_listen.is_some() && self.admin_listen == Some(listen) {
            bail!("--admin-listen / OUTBOXD_ADMIN_LISTEN must differ from --listen / OUTBOXD_LISTEN");
        }
        Ok(on.then(|| Arc::new(AdminAuth::new(admin, read))))
    }
}

/// A set of tokens from a variable or its file, not both; `None` when neither.
fn token_set(
    value: Option<&str>,
    file: Option<PathBuf>,
    name: &str,
    access: Access,
    variable: &str,
) -> anyhow::Result<Option<TokenSet>> {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    let set = match (value, file) {
        (Some(_), Some(_)) => bail!("both {variable} and {variable}_FILE are set: give one"),
        (Some(value), None) => {
            let value = SecretString::from(value.to_owned());
            TokenSet::from_value(&value, name, access, variable)
        }
        (None, Some(path)) => TokenSet::from_file(path, name, access, variable),
        (None, None) => return Ok(None),
    };
    set.map(Some).map_err(anyhow::Error::msg)
}

/// A token's name: 1 to 64 of A-Z a-z 0-9 _ - . (it names changes in the audit trail).
fn parse_token_name(text: &str) -> Result<String, String> {
    let valid = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?}: a token's name is 1 to 64 of A-Z a-z 0-9 _ - ."))
    }
}
