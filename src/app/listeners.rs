//! The HTTP listeners: metrics and probes, the admin surface with them or on a listener of
//! its own, and beside it what the internet reaches (the webhooks, one-click unsubscribe);
//! and the bounce listener's SMTP.

use std::sync::Arc;

use anyhow::Context as _;

use tokio_util::sync::CancellationToken;

use tokio::net::TcpListener;

use super::App;
use crate::config::RunConfig;
use crate::message::{MessageIds, ReturnPaths};
use crate::http;

/// Open connections on the metrics and probes listener, and on a separate admin listener.
/// Only a handler at work holds its connection (`http::server`), and the webhooks' requests
/// that wait for a turn are at most `feedback::Checks`' 65 and SNS's 32: the rest of each
/// cap is always there for a probe, a scrape or a provider's notification.
const MAX_HTTP_CONNECTIONS: usize = 256;
const MAX_ADMIN_CONNECTIONS: usize = 256;

impl App {
    /// The bounce listener, when `OUTBOXD_BOUNCE_LISTEN` is set. Call once: the socket
    /// moves into its task.
    pub(super) fn spawn_bounce_listener(
        &mut self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (listener, paths) = self.bounce_listener.take()?;
        let intake = crate::bounces::Intake::new(
            self.pools.surface.clone(),
            paths,
            self.message_ids.clone(),
            self.config.dispatch.lanes.clone(),
            Arc::clone(&self.metrics),
        );
        Some(crate::bounces::spawn(listener, intake, stop.clone()))
    }

    /// The HTTP servers: metrics and probes, and the admin surface with them or apart.
    pub(super) fn spawn_http(&mut self, stop: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let admin = self.config.admin_auth.as_ref().map(|auth| {
            http::admin_router(
                self.pools.surface.clone(),
                self.pools.lookup.clone(),
                Arc::clone(&self.metrics),
                Arc::clone(auth),
                self.kinds.clone(),
                self.config.admin_hosts.clone(),
            )
        });
        // The webhooks go where the admin surface goes: providers reach them there.
        let webhooks = http::webhooks::router(
            self.pools.surface.clone(),
            Arc::clone(&self.config.feedback),
            Arc::clone(&self.metrics),
            self.message_ids.clone(),
            self.config.dispatch.lanes.clone(),
        );
        // So do the one-click unsubscribe links: mailbox providers follow them.
        let unsubscribe = self.config.one_click.as_ref().map(|links| {
            http::unsubscribe::router(
                self.pools.surface.clone(),
                Arc::clone(links),
                Arc::clone(&self.metrics),
            )
        });
        let admin = merged(merged(admin, webhooks), unsubscribe);
        let mut main = http::router(self.prometheus.clone(), Arc::clone(&self.health));
        match (admin, self.admin_listener.take()) {
            (Some(admin), Some(listener)) => tasks.push(http::server::spawn(
                listener,
                admin,
                MAX_ADMIN_CONNECTIONS,
                stop.clone(),
            )),
            (Some(admin), None) => main = main.merge(admin),
            (None, _) => {}
        }
        if let Some(listener) = self.listener.take() {
            tasks.push(http::server::spawn(
                listener,
                main,
                MAX_HTTP_CONNECTIONS,
                stop.clone(),
            ));
        }
        tasks
    }

}

/// Both routers' routes, or the one there is.
fn merged(a: Option<axum::Router>, b: Option<axum::Router>) -> Option<axum::Router> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.merge(b)),
        (a, b) => a.or(b),
    }
}

/// The metrics and probes address, and the admin one when it is separate.
pub(super) async fn bind_listeners(
    config: &RunConfig,
) -> anyhow::Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>)> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (OUTBOXD_LISTEN)", config.listen))?;
    let admin_listener = match config.admin_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (OUTBOXD_ADMIN_LISTEN)"))?,
        ),
        None => None,
    };
    Ok((listener, admin_listener))
}

/// The return paths, when bounces come back to outboxd, and the bounce listener's socket,
/// bound, when this replica takes them (`OUTBOXD_BOUNCE_LISTEN`).
pub(super) async fn bind_bounce_listener(
    config: &RunConfig,
    message_ids: &MessageIds,
) -> anyhow::Result<(Option<Arc<ReturnPaths>>, Option<(TcpListener, Arc<ReturnPaths>)>)> {
    let Some(bounces) = &config.bounces else {
        return Ok((None, None));
    };
    let paths = ReturnPaths::new(&bounces.domain, &bounces.secrets, message_ids.tag().clone())
        .map_err(|e| anyhow::anyhow!("invalid OUTBOXD_BOUNCE_SECRET: {e}"))?;
    let paths = Arc::new(paths);
    let Some(addr) = bounces.listen else {
        return Ok((Some(paths), None));
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on OUTBOXD_BOUNCE_LISTEN {addr}"))?;
    Ok((Some(Arc::clone(&paths)), Some((listener, paths))))
}
