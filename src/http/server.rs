//! The HTTP server for outboxd's listeners, made to survive the open internet.
//!
//! `axum::serve` sets no header-read timeout and no connection cap: connections that never
//! finish their request head stay open until the process runs out of file descriptors,
//! and then `/livez`, `/metrics` and the SMTP connections fail with it. Here each listener
//! has a cap on connections, a connection that sends no complete request head within
//! [`HEADER_TIMEOUT`] (at first, or while idle between requests) is closed, and when the
//! cap is reached the oldest connection that is not in the middle of a request makes room,
//! so a quick request such as a probe always gets through.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
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

/// One open connection, as the eviction sees it.
struct Tracked {
    /// Inside a request: not to be evicted.
    busy: Arc<AtomicBool>,
    close: CancellationToken,
}

/// The open connections of one listener, oldest first (ids grow).
#[derive(Default)]
struct Connections {
    open: std::sync::Mutex<BTreeMap<u64, Tracked>>,
    next_id: AtomicU64,
}

impl Connections {
    /// Registers a connection, first closing the oldest idle one if `cap` are open; `None`
    /// when all of them are in the middle of a request, and the new one must go.
    fn admit(&self, cap: usize) -> Option<(u64, Arc<AtomicBool>, CancellationToken)> {
        let mut open = lock(&self.open);
        if open.len() >= cap {
            let idle = open
                .iter()
                .find(|(_, c)| !c.busy.load(Ordering::Acquire))
                .map(|(id, _)| *id)?;
            if let Some(evicted) = open.remove(&idle) {
                evicted.close.cancel();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let busy = Arc::new(AtomicBool::new(false));
        let close = CancellationToken::new();
        open.insert(
            id,
            Tracked {
                busy: Arc::clone(&busy),
                close: close.clone(),
            },
        );
        Some((id, busy, close))
    }

    fn remove(&self, id: u64) {
        lock(&self.open).remove(&id);
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
            let Some((id, busy, close)) = connections.admit(max_connections) else {
                debug!("HTTP connection refused: every connection is busy with a request");
                continue;
            };
            let (router, connections, stop) =
                (router.clone(), Arc::clone(&connections), stop.clone());
            tasks.spawn(async move {
                serve_connection(stream, router, busy, close, stop).await;
                connections.remove(id);
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

/// One connection: HTTP/1.1 with the header timeout, until it ends, is evicted, or
/// shutdown asks it to finish its request and close.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
    busy: Arc<AtomicBool>,
    close: CancellationToken,
    stop: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let (router, busy) = (router.clone(), Arc::clone(&busy));
        async move {
            busy.store(true, Ordering::Release);
            let response = router.oneshot(request.map(axum::body::Body::new)).await;
            busy.store(false, Ordering::Release);
            response
        }
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
