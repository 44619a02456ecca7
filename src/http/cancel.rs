//! Withdrawing messages under `/api/v1`: one by id or key, and pending messages by filter,
//! counted first, then cancelled in bounded batches; each change audited with the actor.

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;

use super::AdminState;
use super::api_error::ApiError;
use super::auth::Actor;
use crate::message::PendingFilter;
use crate::store::cancel::{self, CancelTarget};

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/messages/cancel", post(cancel_one))
        .route("/api/v1/pending/count", post(count))
        .route("/api/v1/pending/cancel", post(cancel_pending))
}

/// One message: by its id or by its producer's key, not both.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OneMessage {
    id: Option<i64>,
    key: Option<String>,
}

impl OneMessage {
    fn target(self) -> Result<CancelTarget, ApiError> {
        match (self.id, self.key) {
            (Some(id), None) => Ok(CancelTarget::Id(id)),
            (None, Some(key))
                if !key.is_empty()
                    && key.chars().count() <= outboxd_producer::MAX_IDEMPOTENCY_KEY_CHARS =>
            {
                Ok(CancelTarget::Key(key))
            }
            (None, Some(_)) => Err(ApiError::bad_request(format!(
                "key must be 1 to {} characters",
                outboxd_producer::MAX_IDEMPOTENCY_KEY_CHARS
            ))),
            _ => Err(ApiError::bad_request("give the message's id or its key, not both")),
        }
    }
}

async fn cancel_one(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Result<Json<OneMessage>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let target = request.target()?;
    let answer = cancel::cancel(&state.pool, &target, &actor.operator).await?;
    info!(actor = %actor.operator, action = "cancel", answer = answer.as_str(), "admin action");
    Ok(Json(json!({ "answer": answer.as_str() })))
}

async fn count(
    State(state): State<AdminState>,
    body: Result<Json<PendingFilter>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(filter) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    Ok(Json(json!(cancel::count_pending(&state.pool, &filter).await?)))
}

async fn cancel_pending(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Result<Json<PendingFilter>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(filter) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let done = cancel::cancel_pending(&state.pool, &filter, &actor.operator).await?;
    info!(
        actor = %actor.operator,
        action = "cancel",
        filter = %filter.describe(),
        cancelled = done.cancelled,
        in_flight = done.in_flight,
        "admin action"
    );
    Ok(Json(json!(done)))
}
