//! The HTTP surface: `/metrics`, `/livez`, `/readyz`. Reads state and calls the store
//! (through [`Health`]); changes nothing.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

use crate::health::Health;

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    health: Arc<Health>,
}

/// The router, ready to serve.
pub fn router(prometheus: PrometheusHandle, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState { prometheus, health })
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
