//! `POST /api/v1/erase`: erasure by recipient for an operator (the admin token: a
//! read-only one gets 403), audited under the address's one-way mark, never the address.

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
use crate::store::erase::{self, SuppressionChoice};
use crate::suppression::Address;

pub fn routes() -> Router<AdminState> {
    Router::new().route("/api/v1/erase", post(erase_recipient))
}

/// The address, and whether its suppression list entries move to its mark.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EraseRequest {
    recipient: String,
    #[serde(default)]
    mark_suppression: bool,
}

async fn erase_recipient(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Result<Json<EraseRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let address = Address::parse(&request.recipient)
        .map_err(|e| ApiError::bad_request(format!("recipient: {e}")))?;
    let choice = if request.mark_suppression {
        SuppressionChoice::Mark
    } else {
        SuppressionChoice::Keep
    };
    // On a task of its own: a client that leaves does not stop an erasure half-way.
    let (pool, operator) = (state.pool.clone(), actor.operator.clone());
    let erasure =
        tokio::spawn(async move { erase::erase(&pool, &address, choice, &operator).await });
    let erased = erasure
        .await
        .map_err(|e| ApiError::internal(format!("the erasure stopped: {e}")))??;
    // The log names the mark, never the address.
    info!(actor = %actor.operator, action = "erase", mark = %erased.mark, messages = erased.messages_erased + erased.pending_cancelled, "admin action");
    Ok(Json(json!(erased)))
}
