//! The HTTP server for outboxd's listeners, made to survive the open internet.
//!
//! `axum::serve` sets no header-read timeout and no connection cap: connections that never
//! finish their request head stay open until the process runs out of file descriptors,
//! and then `/livez`, `/metrics` and the SMTP connections fail with it. Here each listener
//! has a cap on connections, a connection that sends no complete request head within
//! [`HEADER_TIMEOUT`] (at first, or while idle between requests) is closed, and when the
//! cap is reached the oldest connection that is not serving a request makes room, so a
//! quick request such as a probe gets through a flood of half-open connections.
//!
//! A request's body must arrive whole within [`BODY_TIMEOUT`], and a connection still
//! receiving its body, or sending its response, can make room as an idle one does: only a
//! handler at work holds its connection. Trickled bodies once held every connection of the
//! admin listener, so that a signed bounce could not get in.

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
use std::future::Future as _;
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
/// How long a request's body may take to arrive, from its head on.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(15);

/// Between requests: may be evicted.
const IDLE: u8 = 0;
/// A request whose body has not all arrived: may be evicted.
const RECEIVING: u8 = 1;
/// A handler at work, its body read (or none): holds its connection.
const BUSY: u8 = 2;
/// The response being sent: may be evicted.
const RESPONDING: u8 = 3;
/// Chosen to make room: takes no further request.
const EVICTED: u8 = 4;
/// Which states make room, in the order they are chosen: a connection that has sent
/// nothing yet before one mid-body, before one whose response is on its way.
const EVICTABLE: [u8; 3] = [IDLE, RECEIVING, RESPONDING];

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

/// Moves a connection from one state to another, unless it was evicted meanwhile (an
/// evicted connection stays evicted).
fn advance(state: &AtomicU8, from: &[u8], to: u8) {
    for &from in from {
        if state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

/// Turns its connection back to idle when the response body is dropped (sent, or the
/// connection gone), or when a handler panics.
struct Serving(Arc<AtomicU8>);

impl Drop for Serving {
    fn drop(&mut self) {
        advance(&self.0, &[RESPONDING, BUSY, RECEIVING], IDLE);
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
            // Evictable -> evicted in one step, so a change of state at the same moment
            // either wins (and the connection is skipped) or finds the connection evicted.
            let evicted = EVICTABLE.iter().find_map(|&evictable| {
                open.iter().find_map(|(id, tracked)| {
                    tracked
                        .state
                        .compare_exchange(evictable, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                        .then_some(*id)
                })
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

/// One request on a tracked connection: refused if the connection was just evicted;
/// otherwise receiving until its body is in,
/// busy while its handler works, and responding until its response body is dropped.
async fn serve_request(
    router: Router,
    state: Arc<AtomicU8>,
    request: hyper::Request<Incoming>,
) -> Result<Response, std::convert::Infallible> {
    use hyper::body::Body as _;
    let receiving = if request.body().is_end_stream() {
        BUSY
    } else {
        RECEIVING
    };
    if state
        .compare_exchange(IDLE, receiving, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Ok(StatusCode::SERVICE_UNAVAILABLE.into_response());
    }
    let serving = Serving(state);
    let state = Arc::clone(&serving.0);
    let request = request.map(|body| Body::new(DeadlineBody::new(body, Arc::clone(&state))));
    let response = router.oneshot(request).await?;
    advance(&state, &[BUSY, RECEIVING], RESPONDING);
    Ok(response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _serving = &serving;
            frame
        }))
    }))
}

/// A request body that must arrive whole within [`BODY_TIMEOUT`], and that moves its
/// connection from receiving to busy once it has.
struct DeadlineBody {
    inner: Incoming,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    state: Arc<AtomicU8>,
}

impl DeadlineBody {
    fn new(inner: Incoming, state: Arc<AtomicU8>) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(BODY_TIMEOUT)),
            state,
        }
    }
}

/// Why a request body stopped: it took longer than [`BODY_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("the request body took longer than {BODY_TIMEOUT:?} to arrive")]
pub struct BodyTimedOut;

impl hyper::body::Body for DeadlineBody {
    type Data = hyper::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                advance(&this.state, &[RECEIVING], BUSY);
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(frame.map_err(Into::into))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for DeadlineBody {
    /// A handler that drops the body unread is at work all the same.
    fn drop(&mut self) {
        advance(&self.state, &[RECEIVING], BUSY);
    }
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
