//! The suppression list under `/api/v1/suppressions`: list (search, pages), show, add and
//! remove; each change audited with the actor, as the dead-letter actions are.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use chrono::Utc;
use serde_json::{Value, json};
use tracing::info;

use super::AdminState;
use super::api_error::{ApiError, CheckedQuery, ParseQuery, check_text};
use super::auth::Actor;
use crate::store::MAX_PAGE;
use crate::store::suppressions::{self, Suppression};
use crate::suppression::{AddRequest, Address, Scope};

const DEFAULT_PAGE: i64 = 50;

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/suppressions", get(list).post(add))
        .route("/api/v1/suppressions/{address}", get(show).delete(remove))
}

/// `?search=&after=&limit=`, checked.
pub struct SuppressionQuery {
    pub search: Option<String>,
    pub after: Option<String>,
    pub limit: i64,
}

impl ParseQuery for SuppressionQuery {
    const PARAMETERS: &'static [&'static str] = &["search", "after", "limit"];

    fn parse(query: &HashMap<String, String>) -> Result<Self, String> {
        let text = |name: &str| -> Result<Option<String>, String> {
            match query.get(name).map(|v| v.trim()).filter(|v| !v.is_empty()) {
                Some(value) => check_text(name, value).map(|()| Some(value.to_owned())),
                None => Ok(None),
            }
        };
        let limit = match query.get("limit") {
            None => DEFAULT_PAGE,
            Some(raw) => raw
                .parse()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| format!("limit must be a number from 1 to {MAX_PAGE}"))?,
        };
        Ok(Self {
            search: text("search")?,
            after: text("after")?,
            limit,
        })
    }
}

impl SuppressionQuery {
    /// The `after` of the next page, when this one was full.
    pub fn next_after(&self, page: &[Suppression]) -> Option<String> {
        suppressions::next_address(page, self.limit)
    }
}

async fn list(
    State(state): State<AdminState>,
    CheckedQuery(query): CheckedQuery<SuppressionQuery>,
) -> Result<Json<Value>, ApiError> {
    let page = suppressions::list(
        &state.pool,
        query.search.as_deref(),
        query.after.as_deref(),
        query.limit,
    )
    .await?;
    Ok(Json(
        json!({"next_after": query.next_after(&page), "suppressions": page}),
    ))
}

fn address(raw: &str) -> Result<Address, ApiError> {
    Address::parse(raw).map_err(ApiError::bad_request)
}

async fn show(
    State(state): State<AdminState>,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let address = address(&raw)?;
    let entries = suppressions::get(&state.pool, &address).await?;
    shown(&address, entries, None).map(Json)
}

/// An address's entries as the API shows them: one with its fields (the entry of `scope`,
/// else the first active one, `all` before a lane's), and every one under `entries`; 404
/// when there is none.
fn shown(
    address: &Address,
    entries: Vec<Suppression>,
    scope: Option<Scope>,
) -> Result<Value, ApiError> {
    let chosen = entries
        .iter()
        .find(|e| Some(e.scope.0) == scope)
        .or_else(|| entries.iter().find(|e| e.active))
        .or_else(|| entries.first());
    let Some(chosen) = chosen else {
        return Err(ApiError::not_found(format!("{address} is not suppressed")));
    };
    let mut shown = json!(chosen);
    shown["entries"] = json!(entries);
    Ok(shown)
}

async fn add(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Result<Json<AddRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let entry = request.entry(Utc::now()).map_err(ApiError::bad_request)?;
    suppressions::add(&state.pool, &entry, &actor.operator).await?;
    info!(actor = %actor.operator, action = "suppress", reason = entry.reason.as_str(), "admin action");
    let stored = suppressions::get(&state.pool, &entry.address).await?;
    Ok((
        StatusCode::CREATED,
        Json(shown(&entry.address, stored, Some(entry.scope))?),
    ))
}

async fn remove(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(raw): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let address = address(&raw)?;
    if let Some(unknown) = query.keys().find(|key| key.as_str() != "scope") {
        return Err(ApiError::bad_request(format!(
            "unknown parameter {unknown:?}: use scope"
        )));
    }
    let scope = query
        .get("scope")
        .map(|scope| scope.parse::<Scope>())
        .transpose()
        .map_err(ApiError::bad_request)?;
    if suppressions::remove(&state.pool, &address, scope, &actor.operator).await? {
        info!(actor = %actor.operator, action = "unsuppress", "admin action");
        Ok(StatusCode::NO_CONTENT)
    } else {
        let scope = scope.map_or_else(String::new, |s| format!(" ({s})"));
        Err(ApiError::not_found(format!(
            "{address} has no suppression entry{scope}"
        )))
    }
}
