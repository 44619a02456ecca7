//! Paused kinds under `/api/v1`: pause and resume a kind, list the pauses; each change
//! audited with the actor, as the dead-letter actions are.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{Value, json};
use tracing::info;

use super::AdminState;
use super::api_error::ApiError;
use super::auth::Actor;
use crate::message::{Kind, NewPause, PauseRequest};
use crate::store::pauses;

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/pauses", get(list))
        .route("/api/v1/kinds/{kind}/pause", post(pause))
        .route("/api/v1/kinds/{kind}/resume", post(resume))
}

async fn list(State(state): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let pauses = pauses::list(&state.pool).await?;
    Ok(Json(json!({ "pauses": pauses })))
}

async fn pause(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(kind): Path<String>,
    body: Result<Json<PauseRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let new = NewPause::new(&kind, &request.reason).map_err(ApiError::bad_request)?;
    let pause = pauses::pause(&state.pool, &new.kind, &new.reason, &actor.operator).await?;
    info!(actor = %actor.operator, action = "pause", kind = %new.kind, reason = %new.reason, "admin action");
    Ok(Json(json!(pause)))
}

async fn resume(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(kind): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let kind = Kind::parse(&kind).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if pauses::resume(&state.pool, &kind, &actor.operator).await? {
        info!(actor = %actor.operator, action = "resume", kind = %kind, "admin action");
        Ok(Json(json!({ "kind": kind.as_str(), "resumed": true })))
    } else {
        Err(ApiError::not_found(format!("{kind} is not paused")))
    }
}
