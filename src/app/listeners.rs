//! The HTTP listeners: metrics and probes, the admin surface with them or on a listener of
//! its own, and beside it what the internet reaches (the webhooks, one-click unsubscribe).

use std::sync::Arc;

use anyhow::Context as _;

use tokio_util::sync::CancellationToken;

use super::App;
use crate::config::RunConfig;
use crate::http;

/// Open connections on the metrics and probes listener, and on a separate admin listener.
/// Only a handler at work holds its connection (`http::server`), and the webhooks' requests
/// that wait for a turn are at most `feedback::Checks`' 65 and SNS's 32: the rest of each
/// cap is always there for a probe, a scrape or a provider's notification.
const MAX_HTTP_CONNECTIONS: usize = 256;
const MAX_ADMIN_CONNECTIONS: usize = 256;

impl App {
    /// The HTTP servers: metrics and probes, and the admin surface with them or apart.
    pub(super) fn spawn_http(&mut self, stop: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let admin = self.config.admin_token.as_ref().map(|token| {
            http::admin_router(
                self.pools.surface.clone(),
                self.pools.lookup.clone(),
                Arc::clone(&self.metrics),
                token,
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
