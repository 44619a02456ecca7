//! Wiring: builds the dispatcher from a validated configuration and runs it until a signal.

use crate::backlog::Backlog;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use metrics_exporter_prometheus::PrometheusHandle;
use secrecy::ExposeSecret as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::background::health::Health;
use crate::background::retention::{self, Retention};
use crate::background::{auto_pause, recorder_upkeep, sampler, supervise};
use crate::config::RunConfig;
use crate::dispatch::{Dispatcher, Shutdown};
use crate::mailer::Mailer;
use crate::message::{MessageIds, ReturnPaths};
use crate::render::Renderer;
use crate::telemetry::metrics::{self, BackgroundTask, Metrics};
use crate::text::mask_addresses;
use crate::store;

mod demo;
mod demo_cluster;
mod listeners;
mod pools;

pub use demo::{demo, demo_database};
#[cfg(feature = "testing")]
pub use demo::sample_messages;
pub use demo_cluster::DemoCluster;
use listeners::{bind_bounce_listener, bind_listeners};
use pools::Pools;
pub use pools::connect_checked;

/// A dispatcher ready to run, with what it was built from.
pub struct App {
    /// Every pool, the dispatcher's included.
    pools: Pools,
    pub dispatcher: Dispatcher,
    pub mailer: Arc<Mailer>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub shutdown: Shutdown,
    pub config: RunConfig,
    prometheus: PrometheusHandle,
    listener: Option<tokio::net::TcpListener>,
    http_addr: SocketAddr,
    admin_listener: Option<tokio::net::TcpListener>,
    admin_addr: Option<SocketAddr>,
    kinds: Vec<String>,
    /// How this installation's Message-IDs read: the webhooks tell its rows by them.
    message_ids: MessageIds,
    /// The bounce listener's socket, bound, and the return paths it reads.
    bounce_listener: Option<(tokio::net::TcpListener, Arc<ReturnPaths>)>,
    /// Whether the dispatcher drains a backlog, which the callback sender yields to.
    backlog: Arc<Backlog>,
}

/// Liveness and readiness, on their own pool.
fn health(pools: &Pools, config: &RunConfig, metrics: &Arc<Metrics>, shutdown: &Shutdown) -> Arc<Health> {
    Arc::new(Health::new(
        pools.health.clone(),
        config.rights(),
        Arc::clone(metrics),
        shutdown.stop.clone(),
        config.liveness_bound(),
    ))
}

/// Writes what every statement reads of this replica's configuration: whether outcomes keep
/// callbacks, and each kind's secret fields and payload retention.
async fn publish_settings(store: &store::Store, config: &RunConfig) -> anyhow::Result<()> {
    let on = config.callbacks.is_some();
    store::callbacks::switch(store, on)
        .await
        .map_err(|e| anyhow::anyhow!("cannot switch the delivery callbacks {}: {e} (the role needs UPDATE (callbacks) ON outbox_installation: docs/src/deployment.md)", if on { "on" } else { "off" }))?;
    store::kind_policies::publish(store, &config.kinds.policies())
        .await
        .map_err(|e| anyhow::anyhow!("cannot write the kinds' secret fields and payload retention to outbox_kind_policies: {e} (docs/src/deployment.md lists the role's rights)"))
}

impl App {
    /// Loads the templates, connects, and checks the schema: everything that can be
    /// wrong is found here, before the first message is claimed.
    pub async fn build(config: RunConfig) -> anyhow::Result<Self> {
        // The configuration checked every relay's URL; this names the one, should it fail.
        let mailer = Mailer::new(config.smtp.clone())
            .map_err(|e| anyhow::anyhow!("invalid {} relay {}: {e}", e.lane.as_str(), e.place + 1))?;
        let (listener, admin_listener) = bind_listeners(&config).await?;
        let http_addr = listener.local_addr()?;
        let admin_addr = match &admin_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => (config.admin_auth.is_some() || config.feedback.any()).then_some(http_addr),
        };
        let pools = Pools::open(&config.database).await?;
        let message_ids = message_ids(&pools.dispatch, &config).await?;
        publish_settings(&pools.dispatch, &config).await?;
        let (return_paths, bounce_listener) = bind_bounce_listener(&config, &message_ids).await?;
        let renderer = renderer(&config, message_ids.clone(), return_paths)?;
        let kinds: Vec<String> = renderer.kinds().map(str::to_owned).collect();
        let prometheus = metrics::install_recorder()?;
        let shutdown = Shutdown::default();
        let metrics = Arc::new(Metrics::new(
            renderer.kinds(),
            config.dispatch.lanes.clone(),
            mailer.is_enabled(),
        ));
        metrics.notifications_working(pools.listen.is_some());
        let mailer = Arc::new(mailer);
        let backlog = Arc::new(Backlog::default());
        let dispatcher = Dispatcher::new(
            pools.dispatch.clone(),
            Arc::new(renderer),
            Arc::clone(&mailer),
            config.dispatch.clone(),
            shutdown.clone(),
            Arc::clone(&metrics),
        )
        .listening_on(pools.listen.clone())
        .reporting_backlog_to(Arc::clone(&backlog));
        let health = health(&pools, &config, &metrics, &shutdown);
        Ok(Self {
            pools,
            dispatcher,
            backlog,
            mailer,
            metrics,
            health,
            shutdown,
            config,
            prometheus,
            listener: Some(listener),
            http_addr,
            admin_listener,
            admin_addr,
            kinds,
            message_ids,
            bounce_listener,
        })
    }

    /// The dispatcher's store, whose sessions a test inspects.
    #[cfg(feature = "testing")]
    pub fn store(&self) -> &Store {
        &self.pools.dispatch
    }

    /// The address the HTTP server listens on (useful with port 0).
    #[cfg(feature = "testing")]
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where the admin page and API are served, when an admin token turns them on.
    #[cfg(feature = "testing")]
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Serves `/metrics`, `/livez` and `/readyz`, samples the gauges, and keeps the
    /// Prometheus recorder tidy, until `stop`. Readiness turns false as soon as the
    /// dispatcher is asked to stop; the endpoints keep answering while it drains.
    /// Call once: the HTTP listener moves into the server task.
    pub fn spawn_background(
        &mut self,
        stop: CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = self.spawn_http(&stop);
        tasks.extend(self.spawn_bounce_listener(&stop));
        tasks.extend(self.spawn_supervised(&stop));
        tasks
    }

    /// Retention, the sampler and the recorder's upkeep, each started again if it fails.
    fn spawn_supervised(&self, stop: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let payloads = self.config.kinds.policies().iter().any(|p| p.payload_retention.is_some());
        if self.config.retention != Retention::Keep || payloads {
            let (pool, metrics, stop, retention) = (
                self.pools.surface.clone(),
                Arc::clone(&self.metrics),
                stop.clone(),
                self.config.retention,
            );
            tasks.push(tokio::spawn(supervise(
                BackgroundTask::Retention,
                Arc::clone(&self.metrics),
                stop.clone(),
                move || retention::run(pool.clone(), retention, Arc::clone(&metrics), stop.clone()),
            )));
        }
        let (health, metrics, interval, sampler_stop, sample_pool) = (
            Arc::clone(&self.health),
            Arc::clone(&self.metrics),
            self.config.sample_interval,
            stop.clone(),
            self.pools.sample.clone(),
        );
        tasks.push(tokio::spawn(supervise(
            BackgroundTask::Sampler,
            Arc::clone(&self.metrics),
            stop.clone(),
            move || {
                sampler::run(
                    sample_pool.clone(),
                    Arc::clone(&health),
                    Arc::clone(&metrics),
                    interval,
                    sampler_stop.clone(),
                )
            },
        )));
        tasks.extend(self.spawn_auto_pause(stop));
        tasks.extend(self.spawn_callbacks(stop));
        let (prometheus, upkeep_stop) = (self.prometheus.clone(), stop.clone());
        tasks.push(tokio::spawn(supervise(
            BackgroundTask::RecorderUpkeep,
            Arc::clone(&self.metrics),
            stop.clone(),
            move || recorder_upkeep(prometheus.clone(), upkeep_stop.clone()),
        )));
        tasks
    }

    /// The automatic pause's check, when a kind has it, started again if it fails.
    fn spawn_auto_pause(&self, stop: &CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
        let rule = self.config.auto_pause.clone()?;
        let (pool, metrics, interval, stop) = (
            self.pools.surface.clone(),
            Arc::clone(&self.metrics),
            self.config.sample_interval,
            stop.clone(),
        );
        Some(tokio::spawn(supervise(
            BackgroundTask::AutoPause,
            Arc::clone(&self.metrics),
            stop.clone(),
            move || {
                auto_pause::run(
                    pool.clone(),
                    rule.clone(),
                    Arc::clone(&metrics),
                    interval,
                    stop.clone(),
                )
            },
        )))
    }

    /// The delivery callbacks' sender, when they are on, started again if it fails.
    fn spawn_callbacks(&self, stop: &CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
        let settings = self.config.callbacks.clone()?;
        let (pool, metrics, tag, stop, backlog) = (
            self.pools.surface.clone(),
            Arc::clone(&self.metrics),
            self.message_ids.tag().as_str().to_owned(),
            stop.clone(),
            Arc::clone(&self.backlog),
        );
        Some(tokio::spawn(supervise(
            BackgroundTask::Callbacks,
            Arc::clone(&self.metrics),
            stop.clone(),
            move || {
                crate::callbacks::run(
                    pool.clone(),
                    Arc::clone(&settings),
                    tag.clone(),
                    Arc::clone(&metrics),
                    Arc::clone(&backlog),
                    stop.clone(),
                )
            },
        )))
    }

    /// Says, in words, what this replica reads, where it sends, and what it serves.
    fn log_start(&self) {
        info!(
            database = %self.config.database.location(),
            kinds = %self.kinds.join(", "),
            message_ids = %self.message_ids.form(),
            "reading the outbox"
        );
        if let Some(smtp) = self
            .config
            .smtp
            .as_ref()
            .filter(|_| self.mailer.is_enabled())
        {
            info!(
                relay = %crate::text::redact_url(smtp.url.expose_secret()),
                connections = smtp.pool_size,
                timeout = %crate::text::duration(smtp.timeout),
                "delivering over SMTP"
            );
        } else {
            warn!(
                "OUTBOXD_SMTP_URL is not set: NO EMAIL WILL BE SENT. Messages are only logged and \
                 end as logged_only. This is for development; set OUTBOXD_SMTP_URL in production."
            );
        }
        info!(address = %self.http_addr, "serving /metrics, /livez and /readyz");
        match (self.admin_addr, self.config.admin_auth.is_some()) {
            (Some(address), true) => {
                info!(%address, "serving the admin page (/admin) and API (/api/v1)");
            }
            _ => info!("admin page and API are off: OUTBOXD_ADMIN_TOKEN is not set"),
        }
        if self.config.one_click.is_some() {
            info!(
                address = %self.admin_addr.unwrap_or(self.http_addr),
                bulk_kinds = ?self.config.dispatch.lanes.bulk_kinds(),
                "serving one-click unsubscribe (/unsubscribe/...): bulk emails carry its link"
            );
        }
        if let Some(address) = self.admin_addr.filter(|_| self.config.feedback.any()) {
            info!(%address, "serving the bounce and complaint webhooks (/webhooks/...)");
            if self.config.admin_listen.is_none() {
                // Providers reach the webhooks from the internet; /metrics tells whoever
                // reads it when mail was suppressed and why (docs/src/webhooks.md).
                warn!(
                    %address,
                    "the webhooks share OUTBOXD_LISTEN with /metrics and the probes: publish them on OUTBOXD_ADMIN_LISTEN and keep OUTBOXD_LISTEN off the internet"
                );
            }
        }
    }

    /// Delivers until SIGTERM or Ctrl-C, then drains within the shutdown bound.
    pub async fn run(mut self) -> anyhow::Result<()> {
        self.log_start();
        let background_stop = CancellationToken::new();
        let background = self.spawn_background(background_stop.clone());
        tokio::spawn(watch_signals(
            self.shutdown.clone(),
            self.config.shutdown_timeout,
        ));
        // On a worker thread, like everything it talks to: run from the main thread, every
        // query and send would hand over between threads (a fifth of the CPU of steady
        // traffic went to those wake-ups).
        // The task owns the dispatcher: as it ends, or unwinds from a panic, the connection
        // the dispatcher kept goes back to the pool.
        let ran = tokio::spawn(self.dispatcher.run()).await;
        background_stop.cancel();
        for task in background {
            if let Err(e) = task.await {
                warn!(error = %mask_addresses(&e.to_string()), "a background task ended badly");
            }
        }
        self.mailer.shutdown().await;
        self.pools.close().await;
        // A dispatcher that died must not look like a clean stop to the supervisor.
        // A panic was logged by the hook, masked; its message is not repeated here.
        ran.map_err(|e| {
            if e.is_panic() {
                anyhow::anyhow!("the dispatcher panicked (logged above)")
            } else {
                anyhow::anyhow!("the dispatcher failed: {e}")
            }
        })
    }
}

/// How this installation writes its Message-IDs: its tag (made by `outboxd migrate`) and
/// the configured domain.
async fn message_ids(pool: &Store, config: &RunConfig) -> anyhow::Result<MessageIds> {
    let tag = store::installation::tag(pool).await?;
    Ok(MessageIds::new(tag, config.message_id_domain.clone()))
}

/// The templates, parsed, with the limits and the DKIM key.
pub fn renderer(
    config: &RunConfig,
    message_ids: MessageIds,
    return_paths: Option<Arc<ReturnPaths>>,
) -> anyhow::Result<Renderer> {
    let renderer = Renderer::new(
        config.templates.as_deref(),
        config.from.clone(),
        message_ids,
    )?
    .with_limits(config.limits)
    .with_senders(config.kinds.senders());
    let renderer = match &config.one_click {
        Some(links) => renderer.with_one_click(
            Arc::clone(links),
            config.dispatch.lanes.bulk_kinds().into_iter().collect(),
        ),
        None => renderer,
    };
    let renderer = match return_paths {
        Some(paths) => renderer.with_return_paths(paths),
        None => renderer,
    };
    renderer
        .with_dkim(&config.dkim)
        .map_err(|e| anyhow::anyhow!("invalid DKIM settings: {e}"))
}

/// First SIGTERM or Ctrl-C: stop claiming and let sends in flight finish within `bound`.
/// After the bound, or at a second signal: give up on them (their rows are released).
async fn watch_signals(shutdown: Shutdown, bound: Duration) {
    wait_for_signal().await;
    info!(
        bound = %crate::text::duration(bound),
        "shutting down: no new claims; finishing sends in flight"
    );
    shutdown.stop.cancel();
    tokio::select! {
        () = tokio::time::sleep(bound) => warn!("shutdown bound reached; releasing unfinished sends"),
        () = wait_for_signal() => warn!("second signal; releasing unfinished sends"),
    }
    shutdown.abort.cancel();
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops outboxd");
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
