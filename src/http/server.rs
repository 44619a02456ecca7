//! The HTTP server for outboxd's listeners, made to survive the open internet.
//!
//! `axum::serve` sets no header-read timeout and no connection cap: connections that never
//! finish their request head stay open until the process runs out of file descriptors,
//! and then `/livez`, `/metrics` and the SMTP connections fail with it. Here each listener
//! has a cap on connections, a connection that sends no complete request head within
//! [`HEADER_TIMEOUT`] (at first, or while idle between requests) is closed, and when the
//! cap is reached the oldest connection that is not serving a request makes room, so a
//! quick request such as a probe gets through a flood of half-open connections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::{debug, warn};

use crate::lock::lock;

/// How long a client may take to send a request head, and stay idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections may finish their requests at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The largest request head read.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// A pause after a failed accept (such as too many open files), so as not to spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Between requests: may be evicted.
const IDLE: u8 = 0;
/// Serving a request, from its head until its response body is dropped.
const BUSY: u8 = 1;
/// Chosen to make room: takes no further request.
const EVICTED: u8 = 2;

/// One open connection's state, shared by the eviction and the connection's service.
struct Tracked {
    state: Arc<AtomicU8>,
    close: CancellationToken,
}

/// The open connections of one listener, oldest first (ids grow).
#[derive(Default)]
struct Connections {
    open: std::sync::Mutex<BTreeMap<u64, Tracked>>,
    next_id: AtomicU64,
}

/// Removes its connection from the listener's list when the connection's task ends, by
/// return or by panic.
struct Registered {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.connections.open).remove(&self.id);
    }
}

/// Turns its connection back to idle when the response body is dropped (sent, or the
/// connection gone), or when a handler panics.
struct Serving(Arc<AtomicU8>);

impl Drop for Serving {
    fn drop(&mut self) {
        // Only a busy connection goes back to idle; an evicted one stays evicted.
        let _ = self
            .0
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Connections {
    /// Registers a connection, first evicting the oldest idle one if `cap` are open;
    /// `None` when every one of them is serving a request, and the new one must go.
    fn admit(
        self: &Arc<Self>,
        cap: usize,
    ) -> Option<(Registered, Arc<AtomicU8>, CancellationToken)> {
        let mut open = lock(&self.open);
        if open.len() >= cap {
            // Idle -> evicted in one step, so a request starting at the same moment either
            // wins (and the connection is skipped) or finds the connection evicted.
            let evicted = open.iter().find_map(|(id, tracked)| {
                tracked
                    .state
                    .compare_exchange(IDLE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                    .then_some(*id)
            })?;
            if let Some(tracked) = open.remove(&evicted) {
                tracked.close.cancel();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(AtomicU8::new(IDLE));
        let close = CancellationToken::new();
        open.insert(
            id,
            Tracked {
                state: Arc::clone(&state),
                close: close.clone(),
            },
        );
        let registered = Registered {
            connections: Arc::clone(self),
            id,
        };
        Some((registered, state, close))
    }

    fn len(&self) -> usize {
        lock(&self.open).len()
    }
}

/// Serves `router` on `listener` until `stop`, with at most `max_connections` open.
pub fn spawn(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let connections = Arc::new(Connections::default());
        let tasks = tokio_util::task::TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, open = connections.len(), "HTTP accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some((registered, state, close)) = connections.admit(max_connections) else {
                debug!("HTTP connection refused: every connection is serving a request");
                continue;
            };
            let (router, stop) = (router.clone(), stop.clone());
            tasks.spawn(async move {
                let _registered = registered;
                serve_connection(stream, router, state, close, stop).await;
            });
        }
        tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
            .await
            .is_err()
        {
            debug!("HTTP connections still open at shutdown were closed");
        }
    })
}

/// One request on a tracked connection: refused if the connection was just evicted,
/// otherwise busy until its response body is dropped.
async fn serve_request(
    router: Router,
    state: Arc<AtomicU8>,
    request: hyper::Request<Incoming>,
) -> Result<Response, std::convert::Infallible> {
    if state
        .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Ok(StatusCode::SERVICE_UNAVAILABLE.into_response());
    }
    let serving = Serving(state);
    let response = router.oneshot(request.map(Body::new)).await?;
    Ok(response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _serving = &serving;
            frame
        }))
    }))
}

/// One connection: HTTP/1.1 with the header timeout, until it ends, is evicted, or
/// shutdown asks it to finish its request and close.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
    state: Arc<AtomicU8>,
    close: CancellationToken,
    stop: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        serve_request(router.clone(), Arc::clone(&state), request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = close.cancelled() => return,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        debug!(error = %e, "HTTP connection ended with an error");
    }
}
