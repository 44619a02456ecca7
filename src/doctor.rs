//! `outboxd doctor`: checks a deployment and prints one line per check, each starting with
//! `ok`, `warn` or `fail` and saying what to do. It reads outboxd's options as `run` does,
//! and changes nothing.

use std::time::Duration;

use crate::config::RunConfig;
use crate::mailer::Mailer;
use crate::store;

mod database;

/// The oldest server version outboxd is tested on.
const OLDEST_TESTED: i32 = 150_000;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check's line.
#[derive(Debug, Clone)]
pub struct Finding {
    pub verdict: Verdict,
    pub check: &'static str,
    pub said: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        };
        // What the database or a server said (a role's name, a reply) may hold anything.
        write!(
            f,
            "{verdict} {}: {}",
            self.check,
            crate::text::printable(&self.said)
        )
    }
}

fn finding(verdict: Verdict, check: &'static str, said: impl Into<String>) -> Finding {
    Finding {
        verdict,
        check,
        said: said.into(),
    }
}

/// A store on a small pool that keeps no statement prepared (a pooler may be in the way).
async fn open_store(config: &RunConfig) -> anyhow::Result<store::Store> {
    let options = config.database.options();
    let pool = store::connect_pooled(options, 2)
        .await
        .map_err(|e| store::connect_error(e, options))?;
    let schema = config.database.schema();
    Ok(store::Store::new(pool, schema, store::Preparing::Never)?)
}

/// Every check, in order; those that need the database are skipped when it is unreachable.
pub async fn examine(config: &RunConfig, long_transaction: Duration) -> Vec<Finding> {
    let mut found = vec![finding(
        Verdict::Ok,
        "configuration",
        "every option is valid",
    )];
    found.extend(dkim(config));
    found.extend(senders(config));
    found.push(unsubscribe(config));
    found.push(smtp(config).await);
    match open_store(config).await {
        Ok(store) => {
            found.extend(database::checks(&store, config, long_transaction).await);
            store.close().await;
        }
        Err(e) => found.push(finding(
            Verdict::Fail,
            "database",
            format!("{e}; check DATABASE_URL, the network and the credentials"),
        )),
    }
    found
}

fn dkim(config: &RunConfig) -> impl Iterator<Item = Finding> + '_ {
    config.dkim.iter().map(|key| {
        let value = key
            .ed25519_record_value()
            .map_or_else(String::new, |value| format!(": {value}"));
        finding(
            Verdict::Ok,
            "dkim",
            format!(
                "the {} key reads; publish its public key at {} (TXT){value}",
                key.algorithm().tag(),
                key.record()
            ),
        )
    })
}

/// Each kind's sender and its DKIM alignment: a kind whose From's domain no key signs for
/// fails DMARC's alignment at the receiver (a kind's own `from` is refused at start then;
/// `OUTBOXD_FROM` is warned about).
fn senders(config: &RunConfig) -> impl Iterator<Item = Finding> + '_ {
    let signed: Vec<&str> = config.dkim.iter().map(|key| key.domain()).collect();
    config.kinds.iter().map(move |(kind, settings)| {
        let from = settings.from.as_ref().unwrap_or(&config.from);
        let domain = from.email.domain().to_lowercase();
        let (verdict, alignment) = if signed.is_empty() {
            (Verdict::Ok, "not signed (no DKIM key)".to_owned())
        } else if let Some(key) = config
            .dkim
            .iter()
            .filter(|key| key.aligns_with(&domain))
            .max_by_key(|key| key.domain().len())
        {
            let signer = format!("DKIM d={} s={}", key.domain(), key.selector());
            (Verdict::Ok, format!("{signer}, aligned"))
        } else {
            let keys = signed.join(", ");
            (Verdict::Warn, format!("DKIM signs for {keys}, not {domain}: not aligned"))
        };
        let settings = settings.describe().join("; ");
        finding(verdict, "kind", format!("{kind}: from {from}, {alignment}; {settings}"))
    })
}

/// Whether bulk mail carries a one-click unsubscribe link, which Gmail and Yahoo require.
fn unsubscribe(config: &RunConfig) -> Finding {
    let bulk = config.dispatch.lanes.bulk_kinds();
    match (&config.one_click, bulk.is_empty()) {
        (Some(links), _) => finding(
            Verdict::Ok,
            "unsubscribe",
            format!(
                "bulk kinds ({}) carry one-click links to {}/unsubscribe/...",
                bulk.join(", "),
                links.base()
            ),
        ),
        (None, true) => finding(Verdict::Ok, "unsubscribe", "no bulk kind, no link needed"),
        (None, false) => finding(
            Verdict::Warn,
            "unsubscribe",
            format!(
                "bulk kinds ({}) carry no one-click unsubscribe link, which Gmail and Yahoo require of bulk senders: set OUTBOXD_PUBLIC_URL and OUTBOXD_UNSUBSCRIBE_SECRET",
                bulk.join(", ")
            ),
        ),
    }
}

async fn smtp(config: &RunConfig) -> Finding {
    let mailer = match Mailer::new(config.smtp.clone()) {
        Ok(mailer) => mailer,
        Err(e) => {
            return finding(
                Verdict::Fail,
                "smtp",
                format!("invalid {} relay {}: {e}", e.lane.as_str(), e.place + 1),
            );
        }
    };
    if !mailer.is_enabled() {
        return finding(
            Verdict::Warn,
            "smtp",
            "no OUTBOXD_SMTP_URL: email would only be logged and marked dispatched",
        );
    }
    let probed = mailer.probe_each().await;
    mailer.shutdown().await;
    let failed: Vec<String> = probed
        .iter()
        .filter_map(|(lane, relay, answer)| {
            let e = answer.as_ref().err()?;
            let said = e.to_string();
            let masked = crate::text::mask_addresses(&said);
            Some(format!("{relay} ({} lane): {masked}", lane.as_str()))
        })
        .collect();
    match (failed.is_empty(), probed.len()) {
        (true, 1) => finding(
            Verdict::Ok,
            "smtp",
            "the server answers (connect, EHLO, and STARTTLS and AUTH as configured)",
        ),
        (true, n) => finding(
            Verdict::Ok,
            "smtp",
            format!("all {n} relays answer (connect, EHLO, and STARTTLS and AUTH as configured)"),
        ),
        (false, _) => finding(
            Verdict::Fail,
            "smtp",
            format!(
                "{}; check OUTBOXD_SMTP_URL (and OUTBOXD_SMTP_FALLBACK_URLS, OUTBOXD_BULK_SMTP_URL) and that the server is up",
                failed.join("; ")
            ),
        ),
    }
}
