//! The DKIM keys: the main domain's (`OUTBOXD_DKIM_DOMAIN` and its options) and those of
//! more From domains (`OUTBOXD_DKIM_KEYS`), each read and checked before anything starts.

use std::collections::BTreeSet;

use anyhow::{Context as _, bail};

use super::DeliverabilityArgs;
use super::deliverability::read_key_file;
use crate::render::{DkimAlgorithm, DkimKey};

/// The DKIM key in the file at `path` (the option `option`), checked by `check`; a warning
/// when every user of the machine may read it.
fn dkim_key(
    path: &std::path::Path,
    option: &str,
    check: impl FnOnce(String) -> Result<DkimKey, String>,
) -> anyhow::Result<DkimKey> {
    let (pem, mode) =
        read_key_file(path).with_context(|| format!("cannot read {option} {}", path.display()))?;
    let key = check(pem)
        .map_err(|e| anyhow::anyhow!("invalid DKIM settings ({option} {}): {e}", path.display()))?;
    // Not refused: Kubernetes mounts a Secret 0644 unless told otherwise.
    if mode & 0o004 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "the DKIM private key file is readable by every user of this machine: make it 0600 or 0400 (in Kubernetes, defaultMode: 0400)"
        );
    }
    Ok(key)
}

impl DeliverabilityArgs {
    /// Every DKIM key: the main domain's, then those of `OUTBOXD_DKIM_KEYS`. Each domain
    /// has an RSA key (an Ed25519 signature goes beside one), and no selector is given
    /// twice.
    pub fn dkim(&self) -> anyhow::Result<Vec<DkimKey>> {
        let mut keys = self.main_dkim_keys()?;
        if keys.is_empty() && self.dkim_keys.iter().any(|e| !e.trim().is_empty()) {
            bail!(
                "OUTBOXD_DKIM_KEYS needs OUTBOXD_DKIM_DOMAIN (and its selector and key): they are the keys of more domains beside the main one, which signs OUTBOXD_FROM's mail"
            );
        }
        for entry in self.dkim_keys.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            keys.push(more_key(entry)?);
        }
        let mut records = BTreeSet::new();
        for key in &keys {
            if !records.insert(key.record()) {
                bail!("invalid OUTBOXD_DKIM_KEYS: {} is given twice", key.record());
            }
            let has_rsa = keys.iter().any(|k| {
                k.domain() == key.domain() && k.algorithm() == DkimAlgorithm::RsaSha256
            });
            if !has_rsa {
                bail!(
                    "invalid OUTBOXD_DKIM_KEYS: {} has an Ed25519 key and no RSA key; an Ed25519 signature goes beside an RSA one (Gmail checks only RSA)",
                    key.domain()
                );
            }
        }
        Ok(keys)
    }

    /// The main domain's keys: none, the RSA key when all three options are set, and the
    /// Ed25519 key beside it when both of its options are; an error when only some are,
    /// or a key cannot be used.
    fn main_dkim_keys(&self) -> anyhow::Result<Vec<DkimKey>> {
        let ed25519 = (
            &self.dkim_ed25519_selector,
            &self.dkim_ed25519_private_key_file,
        );
        let rsa = match (
            &self.dkim_domain,
            &self.dkim_selector,
            &self.dkim_private_key_file,
        ) {
            (None, None, None) if matches!(ed25519, (None, None)) => return Ok(Vec::new()),
            (Some(domain), Some(selector), Some(path)) => (domain, selector, path),
            _ => bail!(
                "DKIM needs all of OUTBOXD_DKIM_DOMAIN, OUTBOXD_DKIM_SELECTOR and OUTBOXD_DKIM_PRIVATE_KEY_FILE (an Ed25519 signature goes beside an RSA one)"
            ),
        };
        let (domain, selector, path) = rsa;
        let mut keys = vec![dkim_key(
            path,
            "--dkim-private-key-file / OUTBOXD_DKIM_PRIVATE_KEY_FILE",
            |pem| DkimKey::new(domain, selector, pem),
        )?];
        match ed25519 {
            (None, None) => {}
            (Some(selector), Some(path)) => {
                keys.push(dkim_key(
                    path,
                    "--dkim-ed25519-private-key-file / OUTBOXD_DKIM_ED25519_PRIVATE_KEY_FILE",
                    |pem| DkimKey::ed25519(domain, selector, pem),
                )?);
            }
            _ => bail!(
                "an Ed25519 DKIM signature needs both OUTBOXD_DKIM_ED25519_SELECTOR and OUTBOXD_DKIM_ED25519_PRIVATE_KEY_FILE"
            ),
        }
        Ok(keys)
    }

}

/// One entry of `OUTBOXD_DKIM_KEYS`: `DOMAIN:SELECTOR:KEY_FILE`, its algorithm read from
/// the PEM's label.
fn more_key(entry: &str) -> anyhow::Result<DkimKey> {
    let mut parts = entry.splitn(3, ':');
    let (Some(domain), Some(selector), Some(path)) = (parts.next(), parts.next(), parts.next())
    else {
        bail!("invalid OUTBOXD_DKIM_KEYS: {entry:?} is not DOMAIN:SELECTOR:KEY_FILE");
    };
    let (domain, selector) = (domain.trim(), selector.trim());
    let path = std::path::Path::new(path.trim());
    dkim_key(path, "OUTBOXD_DKIM_KEYS", |pem| {
        if pem.contains("-----BEGIN RSA PRIVATE KEY-----") {
            DkimKey::new(domain, selector, pem)
        } else {
            DkimKey::ed25519(domain, selector, pem).map_err(|e| {
                format!(
                    "{e}; an RSA key must be PKCS#1 PEM (-----BEGIN RSA PRIVATE KEY-----): convert a PKCS#8 one with `openssl rsa -in key.pem -traditional`"
                )
            })
        }
    })
}
