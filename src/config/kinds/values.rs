//! Each `kind.toml` value that needs more than its type: a lifetime, a payload retention,
//! secret fields, an address.

use std::time::Duration;

use anyhow::bail;
use lettre::message::Mailbox;

use crate::message::{MAX_SECRET_FIELDS, SecretField};

/// A lifetime as `OUTBOXD_EXPIRE_AFTER` takes one: more than 0s, at most a year.
pub(super) fn parse_lifetime(text: &str) -> anyhow::Result<Duration> {
    let lifetime = humantime::parse_duration(text.trim())
        .map_err(|e| anyhow::anyhow!("{text:?}: {e}"))?;
    if lifetime.is_zero() || lifetime > Duration::from_secs(366 * 86_400) {
        bail!("{text:?}: the lifetime must be more than 0s and at most a year");
    }
    Ok(lifetime)
}

/// The most a payload's retention may be: the longest `OUTBOXD_RETENTION` takes.
const MAX_PAYLOAD_RETENTION: Duration = Duration::from_secs(3660 * 86_400);

/// A payload retention: at least a minute (a scrub is for after a send, not during it).
pub(super) fn parse_payload_retention(text: &str) -> anyhow::Result<Duration> {
    let retention = humantime::parse_duration(text.trim())
        .map_err(|e| anyhow::anyhow!("{text:?}: {e}"))?;
    if retention < Duration::from_secs(60) || retention > MAX_PAYLOAD_RETENTION {
        bail!("{text:?}: a payload retention must be at least 1m and at most 3660d");
    }
    Ok(retention)
}

/// A kind's secret fields, each a path the table takes, none twice.
pub(super) fn secret_fields(
    fields: Option<Vec<String>>,
    at: impl Fn() -> String,
) -> anyhow::Result<Vec<SecretField>> {
    let mut kept: Vec<SecretField> = Vec::new();
    for field in fields.unwrap_or_default() {
        let field = SecretField::parse(field).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        if kept.contains(&field) {
            bail!("{} {field} twice", at());
        }
        kept.push(field);
    }
    if kept.len() > MAX_SECRET_FIELDS {
        bail!("{}: at most {MAX_SECRET_FIELDS} fields", at());
    }
    Ok(kept)
}

pub(super) fn mailbox(text: Option<&str>, at: impl Fn() -> String) -> anyhow::Result<Option<Mailbox>> {
    text.map(|text| {
        text.parse::<Mailbox>()
            .map_err(|e| anyhow::anyhow!("{} {text:?}, not an address: {e}", at()))
    })
    .transpose()
}

