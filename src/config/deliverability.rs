//! Options for deliverability: the suppression list, DKIM, attachments, and the bounce
//! and complaint webhooks; validated into the settings of `render` and `feedback`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;

use crate::feedback::postmark::PostmarkSettings;
use crate::feedback::sns::{DEFAULT_CERTIFICATE_HOSTS, SnsSettings, parse_host_patterns};
use crate::feedback::standard::StandardSettings;
use crate::feedback::{FeedbackSettings, HttpsClient};
use crate::text::debug_showing_only;

use super::parse_bytes;
use crate::message::{AutoPause, Kind, parse_share};

#[derive(Clone, Args)]
pub struct DeliverabilityArgs {
    /// Add a recipient to the suppression list when its server answers that the mailbox
    /// does not exist (550 5.1.1, 5.1.10, 5.1.2, 5.1.6, 5.2.1).
    #[arg(long, env = "OUTBOXD_SUPPRESS_HARD_BOUNCES", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "true|false")]
    pub suppress_hard_bounces: bool,

    /// The most bytes a message's attachments may decode to, together (e.g. 2MiB); a
    /// payload over it is dead-lettered (attachment_too_large). Default: 2MiB, or three
    /// quarters of OUTBOXD_MAX_MESSAGE_BYTES if that is less.
    #[arg(long, env = "OUTBOXD_MAX_ATTACHMENT_BYTES", value_parser = parse_bytes)]
    pub max_attachment_bytes: Option<usize>,

    /// Sign every email with DKIM for this domain (d=); needs the selector and the key.
    #[arg(long, env = "OUTBOXD_DKIM_DOMAIN")]
    pub dkim_domain: Option<String>,

    /// The DKIM selector (s=): the key's TXT record is at <selector>._domainkey.<domain>.
    #[arg(long, env = "OUTBOXD_DKIM_SELECTOR")]
    pub dkim_selector: Option<String>,

    /// The DKIM private key: RSA, PKCS#1 PEM (`openssl genrsa -traditional 2048`).
    #[arg(long, env = "OUTBOXD_DKIM_PRIVATE_KEY_FILE")]
    pub dkim_private_key_file: Option<PathBuf>,

    /// A second DKIM signature, Ed25519 (RFC 8463), beside the RSA one: its selector.
    #[arg(long, env = "OUTBOXD_DKIM_ED25519_SELECTOR")]
    pub dkim_ed25519_selector: Option<String>,

    /// The Ed25519 key, PKCS#8 PEM (`openssl genpkey -algorithm ed25519`).
    #[arg(long, env = "OUTBOXD_DKIM_ED25519_PRIVATE_KEY_FILE")]
    pub dkim_ed25519_private_key_file: Option<PathBuf>,

    /// DKIM keys for more From domains (a kind's `from`): DOMAIN:SELECTOR:KEY_FILE,
    /// comma-separated. An RSA key is PKCS#1 PEM; an Ed25519 one (PKCS#8) goes beside an
    /// RSA key of its domain. Each email is signed with its From domain's keys.
    #[arg(long, env = "OUTBOXD_DKIM_KEYS", value_delimiter = ',')]
    pub dkim_keys: Vec<String>,

    /// Turns on /webhooks/sns for Amazon SES notifications from these SNS topics
    /// (comma-separated ARNs); notifications from any other topic are refused.
    #[arg(long, env = "OUTBOXD_SNS_TOPIC_ARNS", value_delimiter = ',')]
    pub sns_topic_arns: Vec<String>,

    /// Hosts an SNS signing certificate and subscription confirmation may come from;
    /// `*` is one DNS label.
    #[arg(long, env = "OUTBOXD_SNS_CERTIFICATE_HOSTS", default_value = DEFAULT_CERTIFICATE_HOSTS)]
    pub sns_certificate_hosts: String,

    /// PEM certificates to trust, besides the public roots, when fetching from those hosts.
    #[arg(long, env = "OUTBOXD_SNS_CA_FILE")]
    pub sns_ca_file: Option<PathBuf>,

    /// Turns on /webhooks/postmark: the user:password Postmark sends (HTTP Basic).
    #[arg(
        long,
        env = "OUTBOXD_POSTMARK_WEBHOOK_CREDENTIALS",
        hide_env_values = true
    )]
    pub postmark_webhook_credentials: Option<String>,

    /// Turns on /webhooks/standard: the Standard Webhooks secret (whsec_...).
    #[arg(long, env = "OUTBOXD_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// Distinct hard-bounced recipients per send that pause such a kind, 5 at least (10%:
    /// where SES pauses an account).
    #[arg(long, env = "OUTBOXD_AUTO_PAUSE_HARD_BOUNCE_RATE", default_value = "10%", value_parser = parse_share)]
    pub auto_pause_hard_bounce_rate: f64,

    /// Distinct complainers per send that pause such a kind, 5 at least (0.5%: where SES
    /// pauses an account).
    #[arg(long, env = "OUTBOXD_AUTO_PAUSE_COMPLAINT_RATE", default_value = "0.5%", value_parser = parse_share)]
    pub auto_pause_complaint_rate: f64,

    /// How many of a kind's latest sends (of the last day) are judged, 100 at least; a
    /// kind with fewer is not judged.
    #[arg(long, env = "OUTBOXD_AUTO_PAUSE_WINDOW", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub auto_pause_window: u32,
}

debug_showing_only!(DeliverabilityArgs as args {
    suppress_hard_bounces,
    dkim_domain,
    sns_topic_arns,
});

impl DeliverabilityArgs {
    /// The automatic pause of `kinds` (the variable's and the kind files'), or `None` when
    /// no kind has it.
    pub fn auto_pause(&self, kinds: BTreeSet<Kind>) -> Option<AutoPause> {
        (!kinds.is_empty()).then_some(AutoPause {
            kinds,
            hard_bounce_share: self.auto_pause_hard_bounce_rate,
            complaint_share: self.auto_pause_complaint_rate,
            window: self.auto_pause_window,
        })
    }
}

/// The attachment bound when none is set (and OUTBOXD_MAX_MESSAGE_BYTES allows it).
const DEFAULT_MAX_ATTACHMENT_BYTES: usize = 2 * 1024 * 1024;

/// `arn:PARTITION:sns:REGION:ACCOUNT:NAME`, ACCOUNT twelve digits.
fn is_topic_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.split(':').collect();
    parts.len() == 6
        && parts[0] == "arn"
        && parts[1].starts_with("aws")
        && parts[2] == "sns"
        && !parts[3].is_empty()
        && parts[4].len() == 12
        && parts[4].bytes().all(|b| b.is_ascii_digit())
        && !parts[5].is_empty()
}

impl DeliverabilityArgs {
    /// The attachment bound, which must be reachable: base64 makes attachments a third
    /// larger in the payload and in the email, both bounded by OUTBOXD_MAX_MESSAGE_BYTES.
    pub fn attachment_bound(&self, max_message_bytes: usize) -> anyhow::Result<usize> {
        let reachable = max_message_bytes / 4 * 3;
        match self.max_attachment_bytes {
            None => Ok(DEFAULT_MAX_ATTACHMENT_BYTES.min(reachable)),
            Some(bytes) if bytes <= reachable => Ok(bytes),
            Some(bytes) => bail!(
                "--max-attachment-bytes / OUTBOXD_MAX_ATTACHMENT_BYTES ({bytes}) cannot be reached: \
                 base64 makes attachments a third larger, and the payload and the email are \
                 bounded by OUTBOXD_MAX_MESSAGE_BYTES ({max_message_bytes}); keep it under \
                 three quarters of that"
            ),
        }
    }

    /// The webhooks turned on, each checked.
    pub fn feedback(&self) -> anyhow::Result<FeedbackSettings> {
        let sns = if self.sns_topic_arns.iter().all(|arn| arn.trim().is_empty()) {
            if self.sns_ca_file.is_some() {
                bail!(
                    "OUTBOXD_SNS_CA_FILE is set but OUTBOXD_SNS_TOPIC_ARNS is not: /webhooks/sns is off without topics"
                );
            }
            None
        } else {
            let topics: Vec<String> = self
                .sns_topic_arns
                .iter()
                .map(|arn| arn.trim().to_owned())
                .filter(|arn| !arn.is_empty())
                .collect();
            if let Some(bad) = topics.iter().find(|arn| !is_topic_arn(arn)) {
                bail!(
                    "invalid --sns-topic-arns / OUTBOXD_SNS_TOPIC_ARNS: {bad:?} is not an ARN (arn:aws:sns:REGION:ACCOUNT:NAME)"
                );
            }
            let certificate_hosts = parse_host_patterns(&self.sns_certificate_hosts)
                .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_SNS_CERTIFICATE_HOSTS: {e}"))?;
            let extra_ca = match &self.sns_ca_file {
                Some(path) => Some(std::fs::read(path).with_context(|| {
                    format!("cannot read OUTBOXD_SNS_CA_FILE {}", path.display())
                })?),
                None => None,
            };
            let client = HttpsClient::new(extra_ca.as_deref())
                .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_SNS_CA_FILE: {e}"))?;
            Some(SnsSettings {
                topics,
                certificate_hosts,
                client,
            })
        };
        let postmark = parse_if_set(
            self.postmark_webhook_credentials.as_deref(),
            "OUTBOXD_POSTMARK_WEBHOOK_CREDENTIALS",
            PostmarkSettings::parse,
        )?;
        let standard = parse_if_set(
            self.webhook_secret.as_deref(),
            "OUTBOXD_WEBHOOK_SECRET",
            StandardSettings::parse,
        )?;
        Ok(FeedbackSettings {
            sns,
            postmark,
            standard,
        })
    }
}

/// A webhook's setting read by `parse` when it is set; the error names the variable.
fn parse_if_set<T>(
    value: Option<&str>,
    variable: &str,
    parse: fn(&str) -> Result<T, String>,
) -> anyhow::Result<Option<T>> {
    value
        .map(parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("invalid {variable}: {e}"))
}

/// The largest key file read: an RSA key of 8 192 bits is under 7 KB of PEM.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Reads a private key file, and its mode: a regular file of at most
/// [`MAX_KEY_FILE_BYTES`] (a path to `/dev/zero` once read until memory ran out).
pub(super) fn read_key_file(path: &std::path::Path) -> anyhow::Result<(String, u32)> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    // Looked at before it is opened: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path)?.is_file() {
        bail!("not a regular file");
    }
    let file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    if metadata.len() > MAX_KEY_FILE_BYTES {
        bail!(
            "{} bytes: a key file is at most {MAX_KEY_FILE_BYTES}",
            metadata.len()
        );
    }
    let mut pem = String::new();
    file.take(MAX_KEY_FILE_BYTES + 1).read_to_string(&mut pem)?;
    if pem.len() as u64 > MAX_KEY_FILE_BYTES {
        bail!("longer than {MAX_KEY_FILE_BYTES} bytes");
    }
    Ok((pem, metadata.permissions().mode()))
}
