//! The kinds' settings as the run uses them, and their senders checked: a kind's own `from`
//! and `reply_to` only within `OUTBOXD_FROM_DOMAINS` (default: `OUTBOXD_FROM`'s domain),
//! and, when signing is on, a `from` whose domain has a DKIM key (alignment).

use std::collections::BTreeSet;

use anyhow::bail;
use lettre::message::Mailbox;

use super::{KindBook, RunArgs, values};
use crate::render::DkimKey;

impl RunArgs {
    /// Each kind's settings: the kind files merged with the variables, senders checked.
    pub(super) fn kind_book(&self, from: &Mailbox, dkim: &[DkimKey]) -> anyhow::Result<KindBook> {
        self.check_lifetime_names()?;
        let book = KindBook::load(self.templates.as_deref(), &self.kinds)?;
        let allowed = self.sender_domains(from)?;
        let signed: BTreeSet<String> = dkim.iter().map(|key| key.domain().to_owned()).collect();
        for (kind, settings) in book.iter() {
            let file = settings.file.as_deref().unwrap_or("kind.toml");
            for (key, mailbox) in [("from", &settings.from), ("reply_to", &settings.reply_to)] {
                let Some(domain) = mailbox.as_ref().map(|m| m.email.domain().to_lowercase()) else {
                    continue;
                };
                if !allowed.contains(&domain) {
                    bail!(
                        "{kind}: {file} says {key} = an address at {domain}, which is not in \
                         OUTBOXD_FROM_DOMAINS ({}); add the domain there",
                        allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                    );
                }
                if key == "from" && !dkim.is_empty() && !dkim.iter().any(|key| key.aligns_with(&domain)) {
                    bail!(
                        "{kind}: {file} says from = an address at {domain}, but the DKIM key \
                         signs for {} only (nor a parent domain of it): its mail would fail \
                         DMARC alignment",
                        signed.iter().cloned().collect::<Vec<_>>().join(", ")
                    );
                }
            }
        }
        Ok(book)
    }

    /// Refuses a name in OUTBOXD_EXPIRE_AFTER that no kind can have.
    pub(super) fn check_lifetime_names(&self) -> anyhow::Result<()> {
        let names = self.kinds.expire_after.iter().flat_map(|e| e.kinds());
        for name in names {
            crate::message::Kind::parse(name).map_err(|e| {
                anyhow::anyhow!("invalid --expire-after / OUTBOXD_EXPIRE_AFTER: {e}")
            })?;
        }
        Ok(())
    }

    /// The domains a kind's sender may use, lower-case.
    fn sender_domains(&self, from: &Mailbox) -> anyhow::Result<BTreeSet<String>> {
        if self.from_domains.is_empty() {
            return Ok([from.email.domain().to_lowercase()].into());
        }
        self.from_domains
            .iter()
            .map(|domain| {
                values::domain_name(domain.trim())
                    .map(|domain| domain.to_lowercase())
                    .map_err(|e| anyhow::anyhow!("invalid --from-domains / OUTBOXD_FROM_DOMAINS {e}"))
            })
            .collect()
    }
}

