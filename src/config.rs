//! Configuration: every option is a flag with an environment variable, parsed by clap and
//! then validated as a whole into typed settings before anything starts. The settings
//! types belong to the modules they configure; this module only builds them.

use crate::http::auth::{AdminAuth, AdminHosts};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use lettre::message::Mailbox;
use secrecy::SecretString;

use crate::background::retention::Retention;
use crate::bounces::BounceSettings;
use crate::callbacks::CallbackSettings;
use crate::dispatch::{DispatchSettings, RateLimit};
use crate::feedback::FeedbackSettings;
use crate::mailer::SmtpSettings;
use crate::message::{AutoPause, RetryPolicy};
use crate::render::{DkimKey, RenderLimits};
use crate::text::debug_showing_only;
use crate::unsubscribe::OneClick;

mod admin;
mod database;
mod deliverability;
mod dkim;
mod kinds;
mod senders;
mod smtp;
mod unsubscribe;
mod bounces;
mod callbacks;
mod values;

pub use database::{DEFAULT_DATABASE_URL, DatabaseArgs, DatabaseConfig};
#[cfg(test)]
pub(crate) use database::MIN_CONNECTIONS;
pub use deliverability::DeliverabilityArgs;
pub use kinds::{KindArgs, KindBook};
pub use smtp::SmtpArgs;
pub use admin::AdminArgs;
pub use bounces::BounceArgs;
pub use callbacks::CallbackArgs;
pub use unsubscribe::UnsubscribeArgs;
use values::{DAY, HOUR, MONTH, SECOND, TEN_MINUTES, WEEK};
pub use values::{parse_bytes, parse_duration_up_to, parse_retention};

/// The sender used when none is configured; only sensible without SMTP.
pub const DEV_FROM: &str = "outboxd <outboxd@localhost>";

/// Options of `outboxd run` (and `outboxd demo`).
#[derive(Args, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// How often to look for due messages when no notification arrives (e.g. 15s, 1m).
    #[arg(long, env = "OUTBOXD_POLL_INTERVAL", default_value = "15s", value_parser = parse_duration_up_to::<HOUR>)]
    pub poll_interval: Duration,

    /// After a notification, how long to let more arrive before claiming, so that messages
    /// committed close together go out as one batch: that much latency for about a third
    /// of the CPU per message under steady traffic. 0s claims at once.
    #[arg(long, env = "OUTBOXD_LINGER", default_value = "50ms", value_parser = parse_duration_up_to::<SECOND>)]
    pub linger: Duration,

    /// Messages claimed per batch at first; a drain goes on while batches come back full,
    /// doubling the claim up to --max-batch-size, and a short batch brings it back.
    #[arg(long, env = "OUTBOXD_BATCH_SIZE", default_value_t = 25,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,

    /// The most messages one claim takes while a backlog drains (at least --batch-size).
    /// Peak memory grows with twice this times the largest message.
    #[arg(long, env = "OUTBOXD_MAX_BATCH_SIZE", default_value_t = 400,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_batch_size: u32,

    /// Attempts (including the first) before a message is dead-lettered.
    #[arg(long, env = "OUTBOXD_MAX_ATTEMPTS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub max_attempts: u32,

    /// First retry delay after a transient failure; doubles each time, with jitter. 0s retries at the next poll.
    #[arg(long, env = "OUTBOXD_RETRY_BACKOFF", default_value = "30s", value_parser = parse_duration_up_to::<WEEK>)]
    pub retry_backoff: Duration,

    /// The longest delay between two attempts.
    #[arg(long, env = "OUTBOXD_RETRY_BACKOFF_MAX", default_value = "1h", value_parser = parse_duration_up_to::<MONTH>)]
    pub retry_backoff_max: Duration,

    /// How long a claimed batch is this process's; a crashed replica's rows come back after it.
    #[arg(long, env = "OUTBOXD_LEASE", default_value = "60s", value_parser = parse_duration_up_to::<DAY>)]
    pub lease: Duration,

    #[command(flatten)]
    pub smtp: SmtpArgs,

    /// Sender address, e.g. "Acme <no-reply@acme.example>". Required with --smtp-url.
    #[arg(long, env = "OUTBOXD_FROM")]
    pub from: Option<String>,

    /// Domains a kind's own `from` and `reply_to` (its kind.toml) may use: acme.example,
    /// news.acme.example. Default: OUTBOXD_FROM's domain.
    #[arg(long, env = "OUTBOXD_FROM_DOMAINS", value_delimiter = ',')]
    pub from_domains: Vec<String>,

    /// The most messages all replicas on this table send together, per second, minute or
    /// hour (14/s, 600/m, 50000/h). Unset: no limit. Throttling replies slow it down.
    #[arg(long, env = "OUTBOXD_RATE_LIMIT", value_parser = RateLimit::parse)]
    pub rate_limit: Option<RateLimit>,

    /// The most messages all replicas send together through the bulk lane's own relays
    /// (OUTBOXD_BULK_SMTP_URL), of the same form. Unset: no limit; throttling replies from
    /// those relays slow the bulk lane alone.
    #[arg(long, env = "OUTBOXD_BULK_RATE_LIMIT", value_parser = RateLimit::parse)]
    pub bulk_rate_limit: Option<RateLimit>,

    /// Each kind's settings that variables give (`kind.toml` gives them too).
    #[command(flatten)]
    pub kinds: KindArgs,

    /// SMTP connections, and so sends in flight at once.
    #[arg(long, env = "OUTBOXD_SMTP_CONCURRENCY", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub smtp_concurrency: u32,

    /// The most addresses one message may have in to, cc, bcc and reply_to together; a
    /// message with more is dead-lettered (too_many_recipients) without being rendered.
    #[arg(long, env = "OUTBOXD_MAX_RECIPIENTS", default_value = "1000",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_recipients: u32,

    /// The largest payload and the largest email, in bytes (e.g. 4MiB, 500kB); a message
    /// past it is dead-lettered (payload, too_large). Peak memory grows with twice
    /// --batch-size times this.
    #[arg(long, env = "OUTBOXD_MAX_MESSAGE_BYTES", default_value = "4MiB", value_parser = parse_bytes)]
    pub max_message_bytes: usize,

    /// Bound on connecting to the SMTP server and on the SMTP transaction, each; a whole
    /// send, replacing a dead pooled connection included, ends within two.
    #[arg(long, env = "OUTBOXD_SMTP_TIMEOUT", default_value = "10s", value_parser = parse_duration_up_to::<TEN_MINUTES>)]
    pub smtp_timeout: Duration,

    /// Directory of templates, one subdirectory per kind (subject.txt, body.txt, body.html);
    /// adds kinds and overrides the built-in ones.
    #[arg(long, env = "OUTBOXD_TEMPLATES")]
    pub templates: Option<PathBuf>,

    /// Domain of the deterministic Message-ID (<outbox-ID.TAG@DOMAIN>). Default: the sender's domain.
    #[arg(long, env = "OUTBOXD_MESSAGE_ID_DOMAIN")]
    pub message_id_domain: Option<String>,

    /// How often the database gauges (pending, dead letters, oldest pending age) are sampled.
    #[arg(long, env = "OUTBOXD_SAMPLE_INTERVAL", default_value = "15s", value_parser = parse_duration_up_to::<HOUR>)]
    pub sample_interval: Duration,

    /// HTTP address for metrics and probes.
    #[arg(long, env = "OUTBOXD_LISTEN", default_value = "0.0.0.0:9898")]
    pub listen: SocketAddr,

    /// Delete dispatched and discarded rows older than this (e.g. 7d, 12h); 0 keeps them forever.
    /// Dead letters that are not discarded are never deleted.
    #[arg(long, env = "OUTBOXD_RETENTION", default_value = "7d", value_parser = parse_retention)]
    pub retention: Retention,

    /// On SIGTERM or Ctrl-C, how long sends in flight may take before their rows are released.
    #[arg(long, env = "OUTBOXD_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration_up_to::<HOUR>)]
    pub shutdown_timeout: Duration,

    /// Name written to locked_by on claimed rows. Default: host name and process id.
    #[arg(long, env = "OUTBOXD_WORKER_ID")]
    pub worker_id: Option<String>,

    #[command(flatten)]
    pub deliverability: DeliverabilityArgs,

    #[command(flatten)]
    pub unsubscribe: UnsubscribeArgs,

    #[command(flatten)]
    pub bounces: BounceArgs,

    #[command(flatten)]
    pub callbacks: CallbackArgs,

    #[command(flatten)]
    pub admin: AdminArgs,
}

debug_showing_only!(RunArgs as args {
    database,
    poll_interval,
    linger,
    batch_size,
    smtp = args.smtp,
    from,
    admin_token = args.admin.admin_token.as_ref().map(|_| "***"),
    admin_read_token = args.admin.admin_read_token.as_ref().map(|_| "***"),
});

/// Everything `outboxd run` needs, checked.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub database: DatabaseConfig,
    pub dispatch: DispatchSettings,
    pub smtp: Option<SmtpSettings>,
    pub from: Mailbox,
    pub message_id_domain: String,
    pub templates: Option<PathBuf>,
    pub limits: RenderLimits,
    pub listen: SocketAddr,
    pub sample_interval: Duration,
    pub shutdown_timeout: Duration,
    /// The admin surface's tokens; `None`: the admin page and API are off.
    pub admin_auth: Option<Arc<AdminAuth>>,
    pub admin_listen: Option<SocketAddr>,
    pub admin_hosts: AdminHosts,
    pub retention: Retention,
    /// Signs every email when set.
    /// The DKIM keys, one signature each: none, RSA, or RSA and Ed25519.
    pub dkim: Vec<DkimKey>,
    /// The bounce and complaint webhooks turned on.
    pub feedback: Arc<FeedbackSettings>,
    /// Kinds paused by outboxd itself on a bounce or complaint breach; `None`: off.
    pub auto_pause: Option<AutoPause>,
    /// Each kind's settings: its kind.toml and the per-kind variables.
    pub kinds: KindBook,
    /// One-click unsubscribe links in bulk emails, and `/unsubscribe`; `None`: off.
    pub one_click: Option<Arc<OneClick>>,
    /// Signed return paths, and the listener for the DSNs sent to them; `None`: off.
    pub bounces: Option<BounceSettings>,
    /// The delivery callbacks to the application; `None`: off.
    pub callbacks: Option<Arc<CallbackSettings>>,
}

impl RunConfig {
    /// How long the dispatch loop may go without progress before `/livez` fails: three poll
    /// intervals, plus the longest a batch can take (its lease and one send).
    pub fn liveness_bound(&self) -> Duration {
        self.dispatch.poll_interval * 3 + self.dispatch.lease + self.dispatch.send_timeout
    }

    /// The rights on outboxd's objects this configuration uses, which readiness checks.
    pub fn rights(&self) -> crate::store::Rights {
        crate::store::Rights {
            auto_pause: self.auto_pause.is_some(),
            callbacks: self.callbacks.is_some(),
            payload_retention: self.kinds.policies().iter().any(|p| p.payload_retention.is_some()),
        }
    }
}

impl RunArgs {
    /// Checks the options together; the error names the option and what is wrong with it.
    pub fn validate(&self) -> anyhow::Result<RunConfig> {
        let database = self.database.validate()?;
        self.check_durations()?;
        let smtp = self.smtp.settings(self.smtp_timeout, self.smtp_concurrency)?;
        let from = self.sender(smtp.is_some())?;
        let message_id_domain = match &self.message_id_domain {
            Some(domain) => values::domain_name(domain).map_err(|e| {
                anyhow::anyhow!("invalid --message-id-domain / OUTBOXD_MESSAGE_ID_DOMAIN {e}")
            })?,
            None => from.email.domain().to_owned(),
        };
        if let Some(dir) = &self.templates
            && !dir.is_dir()
        {
            bail!(
                "--templates / OUTBOXD_TEMPLATES {} is not a directory",
                dir.display()
            );
        }
        let max_attachment_bytes = self
            .deliverability
            .attachment_bound(self.max_message_bytes)?;
        let admin_auth = self.admin.auth(self.listen)?;
        self.kinds.check_auto_pause_lists()?;
        let dkim = self.deliverability.dkim()?;
        let kinds = self.kind_book(&from, &dkim)?;
        self.check_bulk_relay(smtp.as_ref(), &kinds)?;
        Ok(RunConfig {
            database,
            dispatch: self.dispatch_settings(&kinds)?,
            smtp,
            from,
            message_id_domain,
            templates: self.templates.clone(),
            limits: RenderLimits {
                max_recipients: self.max_recipients as usize,
                max_message_bytes: self.max_message_bytes,
                max_attachment_bytes,
            },
            listen: self.listen,
            sample_interval: self.sample_interval,
            admin_auth,
            admin_listen: self.admin.admin_listen,
            admin_hosts: self.admin.admin_hosts.clone(),
            retention: self.retention,
            shutdown_timeout: self.shutdown_timeout,
            dkim,
            feedback: Arc::new(self.deliverability.feedback()?),
            auto_pause: self.deliverability.auto_pause(kinds.auto_paused()),
            kinds,
            one_click: self.unsubscribe.one_click()?.map(Arc::new),
            bounces: self.bounces.settings()?,
            callbacks: self.callbacks.settings()?,
        })
    }

    fn check_durations(&self) -> anyhow::Result<()> {
        if self.poll_interval.is_zero() {
            bail!("--poll-interval / OUTBOXD_POLL_INTERVAL must be more than 0s");
        }
        if self.sample_interval.is_zero() {
            bail!("--sample-interval / OUTBOXD_SAMPLE_INTERVAL must be more than 0s");
        }
        if self.smtp_timeout.is_zero() {
            bail!("--smtp-timeout / OUTBOXD_SMTP_TIMEOUT must be more than 0s");
        }
        if self.retry_backoff_max < self.retry_backoff {
            bail!(
                "--retry-backoff-max / OUTBOXD_RETRY_BACKOFF_MAX ({}) is shorter than --retry-backoff / OUTBOXD_RETRY_BACKOFF ({})",
                humantime::format_duration(self.retry_backoff_max),
                humantime::format_duration(self.retry_backoff)
            );
        }
        if self.lease <= self.smtp_timeout * 3 {
            bail!(
                "--lease / OUTBOXD_LEASE ({}) must be more than three times --smtp-timeout / OUTBOXD_SMTP_TIMEOUT ({}), so that a send always ends inside its lease",
                humantime::format_duration(self.lease),
                humantime::format_duration(self.smtp_timeout)
            );
        }
        Ok(())
    }

    fn sender(&self, smtp: bool) -> anyhow::Result<Mailbox> {
        let from: &str = match (&self.from, smtp) {
            (Some(from), _) => from,
            (None, true) => {
                bail!("--from / OUTBOXD_FROM is required when OUTBOXD_SMTP_URL is set")
            }
            (None, false) => DEV_FROM,
        };
        from.parse()
            .with_context(|| format!("invalid --from / OUTBOXD_FROM {from:?}"))
    }

    /// The bulk lane's own relays need bulk kinds to send, and its own pace needs them.
    fn check_bulk_relay(&self, smtp: Option<&SmtpSettings>, kinds: &KindBook) -> anyhow::Result<()> {
        let bulk_relays = smtp.is_some_and(|smtp| !smtp.bulk_urls.is_empty());
        if bulk_relays && kinds.lanes().bulk().next().is_none() {
            bail!("OUTBOXD_BULK_SMTP_URL is set but no kind is bulk: name them in OUTBOXD_BULK_KINDS or with lane = \"bulk\" in their kind.toml");
        }
        if self.bulk_rate_limit.is_some() && !bulk_relays {
            bail!("OUTBOXD_BULK_RATE_LIMIT is set but OUTBOXD_BULK_SMTP_URL is not: it is the pace of the bulk lane's own relays (OUTBOXD_RATE_LIMIT paces relays the lanes share)");
        }
        Ok(())
    }

    fn dispatch_settings(&self, kinds: &KindBook) -> anyhow::Result<DispatchSettings> {
        let worker_id = match &self.worker_id {
            Some(id) if !id.trim().is_empty() => id.trim().to_owned(),
            Some(_) => bail!("--worker-id / OUTBOXD_WORKER_ID must not be empty"),
            None => default_worker_id(),
        };
        Ok(DispatchSettings {
            batch_size: self.batch_size,
            max_batch_size: self.max_batch_size.max(self.batch_size),
            retry: RetryPolicy {
                max_attempts: self.max_attempts,
                base: self.retry_backoff,
                max: self.retry_backoff_max,
            },
            lease: self.lease,
            concurrency: self.smtp_concurrency as usize,
            poll_interval: self.poll_interval,
            linger: self.linger,
            send_timeout: self.smtp_timeout,
            worker_id,
            max_payload_bytes: self.max_message_bytes,
            rate_limit: self.rate_limit,
            bulk_rate_limit: self.bulk_rate_limit,
            expire_after: kinds.expire_after(),
            suppress_hard_bounces: self.deliverability.suppress_hard_bounces,
            lanes: kinds.lanes(),
            essential: kinds.essential(),
        })
    }
}

fn default_worker_id() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "outboxd".to_owned());
    format!("{host}-{}", std::process::id())
}

/// A secret given as a value or in a file (read as a key file is: a regular file, bounded),
/// not both; `None` when neither. `name` is its variable, for the errors.
fn secret_given(
    value: Option<&str>,
    file: Option<&std::path::Path>,
    name: &str,
) -> anyhow::Result<Option<SecretString>> {
    let given = value.map(str::trim).filter(|s| !s.is_empty());
    match (given, file) {
        (Some(_), Some(_)) => bail!("both {name} and {name}_FILE are set: give one"),
        (Some(secret), None) => Ok(Some(SecretString::from(secret.to_owned()))),
        (None, Some(path)) => deliverability::read_key_file(path)
            .map(|(text, _mode)| Some(SecretString::from(text.trim().to_owned())))
            .with_context(|| format!("cannot read {name}_FILE {}", path.display())),
        (None, None) => Ok(None),
    }
}
