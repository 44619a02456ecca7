//! Each kind's settings: the `kind.toml` beside its templates (the built-in kinds carry
//! theirs), merged with the per-kind variables (`OUTBOXD_BULK_KINDS`,
//! `OUTBOXD_EXPIRE_AFTER`, `OUTBOXD_AUTO_PAUSE_KINDS`, `OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS`).
//! Neither wins: a setting given both ways must agree, and a contradiction is refused at
//! start, naming both places.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use lettre::message::Mailbox;
use clap::Args;
use serde::Deserialize;

use crate::dispatch::ExpireAfter;
use crate::message::{Kind, Lane, Lanes, SecretField, parse_kinds};
use crate::store::kind_policies::KindPolicy;
use files::{parse_file, read_kind_files};
use values::{mailbox, parse_lifetime, parse_payload_retention, secret_fields};
use crate::render::{BUILTIN_KIND_FILES, KIND_FILE, KindSender};

/// The largest `kind.toml` read.
const MAX_KIND_FILE_BYTES: u64 = 16 * 1024;

/// What a `kind.toml` may say: every key optional, any other refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KindFile {
    lane: Option<LaneKey>,
    essential: Option<bool>,
    from: Option<String>,
    reply_to: Option<String>,
    expire_after: Option<String>,
    auto_pause: Option<bool>,
    secret_fields: Option<Vec<String>>,
    payload_retention: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LaneKey {
    Transactional,
    Bulk,
}

/// A kind's settings in effect, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSettings {
    pub lane: Lane,
    /// Sent to an address suppressed for an unsubscribe or a complaint, in any lane (never
    /// to one that bounced): a password reset, a sign-in code.
    pub essential: bool,
    /// The kind's own sender, instead of `OUTBOXD_FROM`.
    pub from: Option<Mailbox>,
    /// Where replies go when the payload names no `reply_to`.
    pub reply_to: Option<Mailbox>,
    /// How long after its creation a message of the kind without its own `expires_at` may
    /// still be sent.
    pub expire_after: Option<Duration>,
    /// `Some(true)`: judged by the automatic pause; `Some(false)`: never paused by it.
    pub auto_pause: Option<bool>,
    /// Payload fields never shown and scrubbed when a message ends.
    pub secret_fields: Vec<SecretField>,
    /// How long after a message ends its payload is kept, when less than its row.
    pub payload_retention: Option<Duration>,
    /// The `kind.toml` read (`built-in` for the binary's), or none.
    pub file: Option<String>,
}

/// A kind no file nor variable names: transactional, not essential, nothing of its own.
impl Default for KindSettings {
    fn default() -> Self {
        Self {
            lane: Lane::Transactional,
            essential: false,
            from: None,
            reply_to: None,
            expire_after: None,
            auto_pause: None,
            secret_fields: Vec::new(),
            payload_retention: None,
            file: None,
        }
    }
}

impl KindSettings {
    /// The settings as `outboxd preview` and `doctor` show them, a line each.
    pub fn describe(&self) -> Vec<String> {
        let or = |mailbox: &Option<Mailbox>, default: &str| {
            mailbox
                .as_ref()
                .map_or_else(|| default.to_owned(), ToString::to_string)
        };
        let auto_pause = match self.auto_pause {
            Some(true) => "judged by the automatic pause",
            Some(false) => "never paused automatically",
            None => "not judged by the automatic pause",
        };
        vec![
            format!("lane: {}", self.lane.as_str()),
            format!("essential: {}", if self.essential { "yes" } else { "no" }),
            format!("from: {}", or(&self.from, "OUTBOXD_FROM")),
            format!("reply_to: {}", or(&self.reply_to, "the payload's, if any")),
            format!(
                "expire_after: {}",
                self.expire_after.map_or_else(
                    || "none".to_owned(),
                    |d| humantime::format_duration(d).to_string()
                )
            ),
            format!("auto_pause: {auto_pause}"),
            format!(
                "secret_fields: {}",
                if self.secret_fields.is_empty() {
                    "none".to_owned()
                } else {
                    self.secret_fields.iter().map(SecretField::as_str).collect::<Vec<_>>().join(", ")
                }
            ),
            format!(
                "payload_retention: {}",
                self.payload_retention.map_or_else(
                    || "as long as the row (OUTBOXD_RETENTION)".to_owned(),
                    |d| humantime::format_duration(d).to_string()
                )
            ),
            format!(
                "from the file: {}",
                self.file.as_deref().unwrap_or("none (defaults and variables)")
            ),
        ]
    }
}

/// The per-kind variables; each kind's `kind.toml` says the same things.
#[derive(Debug, Clone, Default, Args)]
pub struct KindArgs {
    /// Kinds of bulk work (a newsletter, a digest run): newsletter,digest. Their messages
    /// are claimed only after every other kind's due messages, so a bulk run never delays
    /// transactional mail; the alert rules do not page on a bulk run's age.
    #[arg(long, env = "OUTBOXD_BULK_KINDS", value_parser = Lanes::parse)]
    pub bulk_kinds: Option<Lanes>,

    /// Default lifetimes per kind, from when a message was created, for messages without
    /// their own expires_at: account_verification=24h,workspace_invite=7d. A message not
    /// sent in time ends as expired (not a dead letter).
    #[arg(long, env = "OUTBOXD_EXPIRE_AFTER", value_parser = ExpireAfter::parse)]
    pub expire_after: Option<ExpireAfter>,

    /// Kinds outboxd pauses by itself when their latest sends bounce hard or draw
    /// complaints past the thresholds below (newsletter,digest); an operator resumes them.
    #[arg(long, env = "OUTBOXD_AUTO_PAUSE_KINDS", value_parser = parse_kinds, default_value = "")]
    pub auto_pause_kinds: BTreeSet<Kind>,

    /// Kinds outboxd never pauses by itself, whatever their bounces and complaints: mail a
    /// user asks for and must get (sign-up verification, password resets, sign-in codes),
    /// where an outsider's complaints could otherwise stop it for everyone. A kind may not
    /// be in both lists.
    #[arg(long, env = "OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS", value_parser = parse_kinds, default_value = "account_verification")]
    pub auto_pause_exempt_kinds: BTreeSet<Kind>,
}

impl KindArgs {
    /// Refuses a kind that is both to be paused automatically and exempt from it.
    pub fn check_auto_pause_lists(&self) -> anyhow::Result<()> {
        if let Some(kind) = self
            .auto_pause_kinds
            .intersection(&self.auto_pause_exempt_kinds)
            .next()
        {
            bail!(
                "{kind} is in both OUTBOXD_AUTO_PAUSE_KINDS and OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS \
                 (whose default exempts account_verification: an outsider's complaints must not \
                 stop sign-ups for everyone); remove it from one"
            );
        }
        Ok(())
    }

    /// The kinds some variable names.
    fn named_kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        let bulk = self.bulk_kinds.iter().flat_map(Lanes::bulk);
        // A name no kind can have (its check at start refuses it) names no kind here.
        let lifetimes = self
            .expire_after
            .iter()
            .flat_map(ExpireAfter::kinds)
            .filter_map(|kind| Kind::parse(kind).ok());
        bulk.cloned()
            .chain(lifetimes)
            .chain(self.auto_pause_kinds.iter().cloned())
            .chain(self.auto_pause_exempt_kinds.iter().cloned())
    }
}

/// Every kind's settings: those of a `kind.toml` and those a variable names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindBook(BTreeMap<Kind, KindSettings>);

impl KindBook {
    /// Reads the built-in kinds' files and the templates directory's, and merges them with
    /// the variables; refuses a file that does not parse and a contradiction.
    pub fn load(templates: Option<&Path>, variables: &KindArgs) -> anyhow::Result<Self> {
        let mut files: BTreeMap<Kind, (String, String)> = BTreeMap::new();
        for (kind, text) in BUILTIN_KIND_FILES {
            let kind = Kind::parse(kind)?;
            let path = format!("the built-in {kind}/{KIND_FILE}");
            files.insert(kind, (path, (*text).to_owned()));
        }
        if let Some(dir) = templates {
            for (kind, path, text) in read_kind_files(dir)? {
                files.insert(kind, (path, text));
            }
        }
        let mut kinds: BTreeSet<Kind> = files.keys().cloned().collect();
        kinds.extend(variables.named_kinds());
        let mut book = BTreeMap::new();
        for kind in kinds {
            let file = match files.remove(&kind) {
                Some((path, text)) => Some((parse_file(&path, &text)?, path)),
                None => None,
            };
            let settings = merge(&kind, file, variables)?;
            book.insert(kind, settings);
        }
        Ok(Self(book))
    }

    /// A kind's settings; a kind no file nor variable names has the defaults.
    pub fn settings(&self, kind: &str) -> KindSettings {
        self.0.get(kind).cloned().unwrap_or_default()
    }

    /// Every kind a file or a variable names, with its settings.
    pub fn iter(&self) -> impl Iterator<Item = (&Kind, &KindSettings)> {
        self.0.iter()
    }

    /// The kinds of the bulk lane.
    pub fn lanes(&self) -> Lanes {
        Lanes::of_bulk(self.kinds_where(|s| s.lane == Lane::Bulk))
    }

    /// The kinds' default lifetimes.
    pub fn expire_after(&self) -> ExpireAfter {
        ExpireAfter::of(
            self.0
                .iter()
                .filter_map(|(kind, s)| Some((kind.as_str().to_owned(), s.expire_after?)))
                .collect(),
        )
    }

    /// The kinds with a sender of their own, for the renderer.
    pub fn senders(&self) -> BTreeMap<String, KindSender> {
        self.0
            .iter()
            .filter(|(_, s)| s.from.is_some() || s.reply_to.is_some())
            .map(|(kind, s)| {
                let sender = KindSender {
                    from: s.from.clone(),
                    reply_to: s.reply_to.clone(),
                };
                (kind.as_str().to_owned(), sender)
            })
            .collect()
    }

    /// The kinds an unsubscribe or a complaint does not stop.
    pub fn essential(&self) -> BTreeSet<Kind> {
        self.kinds_where(|s| s.essential)
    }

    /// Each kind's secret fields and payload retention, for `outbox_kind_policies`: the
    /// kinds that declare either.
    pub fn policies(&self) -> Vec<KindPolicy> {
        self.0
            .iter()
            .filter(|(_, s)| !s.secret_fields.is_empty() || s.payload_retention.is_some())
            .map(|(kind, s)| KindPolicy {
                kind: kind.clone(),
                secret_fields: s.secret_fields.clone(),
                payload_retention: s.payload_retention,
            })
            .collect()
    }

    /// The kinds the automatic pause judges.
    pub fn auto_paused(&self) -> BTreeSet<Kind> {
        self.kinds_where(|s| s.auto_pause == Some(true))
    }

    fn kinds_where(&self, wanted: impl Fn(&KindSettings) -> bool) -> BTreeSet<Kind> {
        self.0
            .iter()
            .filter(|(_, settings)| wanted(settings))
            .map(|(kind, _)| kind.clone())
            .collect()
    }
}


/// A kind's settings from its file (if any) and the variables, which must agree.
fn merge(
    kind: &Kind,
    file: Option<(KindFile, String)>,
    variables: &KindArgs,
) -> anyhow::Result<KindSettings> {
    let (file, path) = match file {
        Some((file, path)) => (file, Some(path)),
        None => (KindFile::default(), None),
    };
    let at = |key: &str| {
        format!(
            "{} says {key}",
            path.as_deref().unwrap_or("the kind's kind.toml")
        )
    };
    let bulk_variable = variables
        .bulk_kinds
        .as_ref()
        .is_some_and(|lanes| lanes.of(kind.as_str()) == Lane::Bulk);
    let lane = match (file.lane, bulk_variable) {
        (Some(LaneKey::Transactional), true) => bail!(
            "OUTBOXD_BULK_KINDS names {kind}, but {}: say the lane in one place",
            at("lane = \"transactional\"")
        ),
        (Some(LaneKey::Bulk), _) | (None, true) => Lane::Bulk,
        _ => Lane::Transactional,
    };
    let expire_after = expire_after(kind, file.expire_after.as_deref(), variables, &at)?;
    let essential = file.essential.unwrap_or(false);
    // An essential kind is mailed to people who complained, so it gathers complaints: the
    // automatic pause would stop it (a password reset) for everyone.
    let auto_pause = match auto_pause(kind, file.auto_pause, variables, &at)? {
        Some(true) if essential => bail!(
            "{kind} is essential (sent even to addresses that complained), so the automatic \
             pause may not judge it: remove it from OUTBOXD_AUTO_PAUSE_KINDS or its auto_pause"
        ),
        None if essential => Some(false),
        judged => judged,
    };
    let (secret_fields, payload_retention) = payload_settings(&file, &at)?;
    Ok(KindSettings {
        lane,
        essential,
        secret_fields,
        payload_retention,
        from: mailbox(file.from.as_deref(), || at("from"))?,
        reply_to: mailbox(file.reply_to.as_deref(), || at("reply_to"))?,
        expire_after,
        auto_pause,
        file: path,
    })
}

/// A kind's lifetime, from its file and `OUTBOXD_EXPIRE_AFTER`, which must agree.
fn expire_after(
    kind: &Kind,
    file: Option<&str>,
    variables: &KindArgs,
    at: &dyn Fn(&str) -> String,
) -> anyhow::Result<Option<Duration>> {
    let lifetime = file
        .map(|text| parse_lifetime(text).with_context(|| at("expire_after")))
        .transpose()?;
    let variable_lifetime = variables
        .expire_after
        .as_ref()
        .and_then(|e| e.lifetime(kind.as_str()));
    Ok(match (lifetime, variable_lifetime) {
        (Some(file), Some(variable)) if file != variable => bail!(
            "OUTBOXD_EXPIRE_AFTER gives {kind} {}, but {} {}: say it in one place",
            humantime::format_duration(variable),
            at("expire_after ="),
            humantime::format_duration(file)
        ),
        (file, variable) => file.or(variable),
    })
}

/// A kind's secret fields and payload retention, from its file alone.
fn payload_settings(
    file: &KindFile,
    at: &dyn Fn(&str) -> String,
) -> anyhow::Result<(Vec<SecretField>, Option<Duration>)> {
    let fields = secret_fields(file.secret_fields.clone(), || at("secret_fields"))?;
    let retention = file
        .payload_retention
        .as_deref()
        .map(|text| parse_payload_retention(text).with_context(|| at("payload_retention")))
        .transpose()?;
    Ok((fields, retention))
}

/// Whether the automatic pause judges the kind, from its file and the two variables.
fn auto_pause(
    kind: &Kind,
    file: Option<bool>,
    variables: &KindArgs,
    at: &dyn Fn(&str) -> String,
) -> anyhow::Result<Option<bool>> {
    let judged = variables.auto_pause_kinds.contains(kind);
    let exempt = variables.auto_pause_exempt_kinds.contains(kind);
    match (file, judged, exempt) {
        (Some(false), true, _) => bail!(
            "OUTBOXD_AUTO_PAUSE_KINDS names {kind}, but {}: say it in one place",
            at("auto_pause = false")
        ),
        (Some(true), _, true) => bail!(
            "OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS names {kind}, but {}: say it in one place",
            at("auto_pause = true")
        ),
        (file, true, _) => Ok(file.or(Some(true))),
        (file, _, true) => Ok(file.or(Some(false))),
        (file, false, false) => Ok(file),
    }
}

mod files;
mod values;

#[cfg(test)]
mod tests;
