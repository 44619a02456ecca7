//! The HTTP surface: `/metrics`, `/livez`, `/readyz`, and, with an admin token, the admin
//! API (`/api/v1`) and page (`/admin`). Reads state and calls the store; nothing else.

pub mod api;
mod api_error;
pub mod auth;
pub mod tokens;
mod cancel;
mod erase;
pub mod page;
pub mod pauses;
pub mod server;
pub mod suppressions;
pub mod unsubscribe;
pub mod webhooks;

use std::sync::Arc;

use crate::store::Store;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

use crate::background::health::Health;
use crate::telemetry::metrics::Metrics;

/// The largest admin request body: a bulk request of 10 000 ids fits.
const MAX_ADMIN_BODY_BYTES: usize = 256 * 1024;

/// The largest body `/metrics` and the probes take: they take none.
const MAX_PROBE_BODY_BYTES: u64 = 16 * 1024;

/// `router` answering 413 at once, before reading any of it, to a request whose declared
/// length is over `limit`: a body of 10 GB was read up to the limit before, and a route
/// that takes no body read nothing and answered. The webhooks check their own (and count
/// what they refuse).
fn refusing_bodies_over(router: Router, limit: u64) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| async move {
            if declared_longer_than(request.body(), limit) {
                let mut response = plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is over {limit} bytes\n"),
                );
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
            next.run(request).await
        },
    ))
}

/// Whether a body's declared length (its `Content-Length`) is over `limit`.
fn declared_longer_than(body: &axum::body::Body, limit: u64) -> bool {
    use hyper::body::Body as _;
    body.size_hint().lower() > limit
}

/// What the admin routes need.
#[derive(Clone)]
pub struct AdminState {
    pub pool: Store,
    /// Recipient lookups' own connections (`app::pools`).
    pub lookups: Store,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<auth::AdminAuth>,
    /// The kinds with templates, for the page's filter.
    pub kinds: Vec<String>,
}

/// The admin API (Bearer token) and page (HTTP Basic), both behind the admin token.
pub fn admin_router(
    pool: Store,
    lookups: Store,
    metrics: Arc<Metrics>,
    auth: Arc<auth::AdminAuth>,
    kinds: Vec<String>,
    hosts: auth::AdminHosts,
) -> Router {
    let state = AdminState {
        pool,
        lookups,
        metrics,
        auth: Arc::clone(&auth),
        kinds,
    };
    let api = api::routes()
        .merge(suppressions::routes())
        .merge(pauses::routes())
        .merge(cancel::routes())
        .merge(erase::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&auth),
            auth::require_bearer,
        ))
        .with_state(state.clone());
    let page = page::routes()
        .route_layer(axum::middleware::from_fn_with_state(
            auth,
            auth::require_basic,
        ))
        .with_state(state);
    let admin = api
        .merge(page)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_ADMIN_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(hosts),
            auth::require_known_host,
        ))
        .layer(axum::middleware::map_response(defensive_headers));
    refusing_bodies_over(admin, MAX_ADMIN_BODY_BYTES as u64)
}

/// On every admin response: nothing cached (recipients, CSRF tokens), no type sniffing, no
/// referrer to other sites, no framing (the page's buttons act in one click). Not
/// `no-referrer`: with it browsers post forms with `Origin: null`, which the page refuses.
/// The page sets a stricter content policy of its own, with its style nonce.
async fn defensive_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'; base-uri 'none'"),
        );
    }
    response
}

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    health: Arc<Health>,
}

/// The router, ready to serve.
pub fn router(prometheus: PrometheusHandle, health: Arc<Health>) -> Router {
    let probes = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState { prometheus, health });
    refusing_bodies_over(probes, MAX_PROBE_BODY_BYTES)
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.prometheus.render(),
    )
        .into_response()
}

/// A plain-text response, for the probes and the page's errors.
fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn livez(State(state): State<AppState>) -> Response {
    match state.health.liveness() {
        Ok(()) => plain(StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

#[derive(Debug, Deserialize)]
struct ReadyzQuery {
    verbose: Option<String>,
}

/// As kube-apiserver does: a bare status for machines, `?verbose` lists every check.
async fn readyz(State(state): State<AppState>, Query(query): Query<ReadyzQuery>) -> Response {
    let checks = state.health.readiness().await;
    let ready = checks.iter().all(|c| c.result.is_ok());
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = String::new();
    for check in &checks {
        match (&check.result, query.verbose.is_some()) {
            (Ok(()), true) => body.push_str(&format!("[+]{} ok\n", check.name)),
            (Err(reason), _) => body.push_str(&format!("[-]{} failed: {reason}\n", check.name)),
            (Ok(()), false) => {}
        }
    }
    body.push_str(if ready {
        "ok\n"
    } else {
        "readyz check failed\n"
    });
    plain(status, body)
}
