//! The admin JSON API under `/api/v1`. Errors have one shape:
//! `{"error": {"code": "...", "message": "..."}}`.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::AdminState;
use super::api_error::{ApiError, CheckedQuery, ParseQuery, check_text};
use super::auth::Actor;
use crate::store::admin::{
    self, Action, ActionError, DeadLetter, MessageDetail, MessageState, Selection,
};
use crate::message::Tag;
use crate::store::messages::{LookupError, RecipientPage, Search};
use crate::store::{MAX_PAGE, messages, stats};
use crate::telemetry::metrics::LookupResult;

const DEFAULT_PAGE: i64 = 50;
/// The most ids one bulk request names.
const MAX_IDS: usize = 10_000;

pub fn routes() -> Router<AdminState> {
    let router = Router::new()
        .route("/api/v1/dead-letters", get(list))
        .route("/api/v1/dead-letters/groups", get(groups))
        .route("/api/v1/dead-letters/{id}", get(show))
        .route("/api/v1/messages", get(by_recipient))
        .route("/api/v1/messages/{id}", get(show_any))
        .route("/api/v1/stats", get(stats));
    [Action::Retry, Action::Discard]
        .into_iter()
        .fold(router, action_routes)
}

/// `POST /api/v1/dead-letters/retry` on the dead letters a body selects, and
/// `POST /api/v1/dead-letters/{id}/retry` on one; the same for `discard`.
fn action_routes(router: Router<AdminState>, action: Action) -> Router<AdminState> {
    let name = action.as_str();
    router
        .route(
            &format!("/api/v1/dead-letters/{name}"),
            post(move |state, actor, body| bulk(state, actor, body, action)),
        )
        .route(
            &format!("/api/v1/dead-letters/{{id}}/{name}"),
            post(move |state, actor, id| one(state, actor, id, action)),
        )
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad_request(format!("{raw:?} is not a message id")))
}

/// `kind`, `tag`, `limit` and `after`, checked, for the list endpoint and the page.
pub struct ListQuery {
    pub kind: Option<String>,
    pub tag: Option<Tag>,
    pub limit: i64,
    pub after: Option<i64>,
}

/// A query's `tag`, when it has one, checked as producers' tags are.
fn tag_of(query: &HashMap<String, String>) -> Result<Option<Tag>, String> {
    query
        .get("tag")
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| Tag::parse(t).map_err(|e| e.to_string()))
        .transpose()
}

impl ParseQuery for ListQuery {
    /// `notice` is the page's: what its last form did.
    const PARAMETERS: &'static [&'static str] = &["kind", "tag", "limit", "after", "notice"];

    fn parse(query: &HashMap<String, String>) -> Result<Self, String> {
        let kind = query.get("kind").filter(|k| !k.is_empty()).cloned();
        if let Some(kind) = &kind {
            check_text("kind", kind)?;
        }
        let tag = tag_of(query)?;
        let limit = match query.get("limit") {
            None => DEFAULT_PAGE,
            Some(raw) => raw
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    format!("limit must be a number from 1 to {MAX_PAGE}, got {raw:?}")
                })?,
        };
        let after = match query.get("after").filter(|a| !a.is_empty()) {
            None => None,
            Some(raw) => Some(
                raw.parse::<i64>()
                    .ok()
                    .filter(|id| *id > 0)
                    .ok_or_else(|| format!("after must be a message id, got {raw:?}"))?,
            ),
        };
        Ok(Self {
            kind,
            tag,
            limit,
            after,
        })
    }
}

impl ListQuery {
    /// The `after` of the next page: the last id of a full page, none after a short one.
    pub fn next_after(&self, page: &[DeadLetter]) -> Option<i64> {
        crate::store::next_after(page, self.limit, |d| d.id)
    }
}

async fn list(
    State(state): State<AdminState>,
    CheckedQuery(query): CheckedQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let page =
        admin::list_dead_letters(
            &state.pool,
            query.kind.as_deref(),
            query.tag.as_ref(),
            query.after,
            query.limit,
        )
        .await?;
    let next_after = query.next_after(&page);
    Ok(Json(
        json!({"dead_letters": page, "next_after": next_after}),
    ))
}

/// Any message, in any state (pending, dispatched, dead_lettered, discarded, expired).
async fn show_any(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(message(&state, &actor, &id).await?)))
}

async fn show(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let message = message(&state, &actor, &id).await?;
    match message.state {
        MessageState::DeadLettered | MessageState::Discarded => Ok(Json(json!(message))),
        _ => Err(ApiError::not_found(format!(
            "message {} is {}, not a dead letter",
            message.id, message.state
        ))),
    }
}

/// The message the path names as `actor` may see it, or why there is none to show.
async fn message(
    state: &AdminState,
    actor: &Actor,
    raw_id: &str,
) -> Result<MessageDetail, ApiError> {
    let id = parse_id(raw_id)?;
    let mut message = admin::message(&state.pool, id)
        .await?
        .ok_or_else(|| ApiError::from(ActionError::NotFound(id)))?;
    actor.withhold(&mut message);
    Ok(message)
}

/// `recipient` or `tag`, `limit` and `after`, checked, for the message lookup and the page.
pub struct RecipientQuery {
    /// The address or the tag as given, for the page's search box.
    pub address: String,
    /// What to look for: an address's forms (`suppression::lookup_forms`), or a tag.
    pub search: Search,
    pub limit: i64,
    pub after: Option<i64>,
}

impl ParseQuery for RecipientQuery {
    const PARAMETERS: &'static [&'static str] = &["recipient", "tag", "limit", "after"];

    fn parse(query: &HashMap<String, String>) -> Result<Self, String> {
        let address = query
            .get("recipient")
            .map(|a| a.trim())
            .filter(|a| !a.is_empty());
        let (address, search) = match (address, tag_of(query)?) {
            (Some(_), Some(_)) => return Err("give recipient or tag, not both".to_owned()),
            (Some(address), None) => {
                check_text("recipient", address)?;
                let forms = crate::suppression::lookup_forms(address)?;
                (address.to_owned(), Search::Recipient(forms))
            }
            (None, Some(tag)) => (tag.to_string(), Search::Tag(tag)),
            (None, None) => {
                return Err(
                    "recipient or tag is required: the address or the tag whose messages to list"
                        .to_owned(),
                );
            }
        };
        let page = ListQuery::parse(
            &query
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "recipient" | "tag"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )?;
        Ok(Self {
            address,
            search,
            limit: page.limit,
            after: page.after,
        })
    }
}

impl RecipientQuery {
    /// The id the next page starts below, when this page is full.
    pub fn next_after(&self, page: &RecipientPage) -> Option<i64> {
        crate::store::next_after(&page.messages, self.limit, |m| m.id)
    }
}

/// `GET /api/v1/messages?recipient=` or `?tag=`: the messages to an address, or carrying a
/// tag, newest first, each with its timeline.
async fn by_recipient(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    CheckedQuery(query): CheckedQuery<RecipientQuery>,
) -> Result<Json<Value>, ApiError> {
    let page = look_up(&state, &actor, &query).await?;
    Ok(Json(json!({
        "messages": page.messages,
        "pending_searched_all": page.pending_searched_all,
        "next_after": query.next_after(&page),
    })))
}

/// A recipient lookup for an operator, the API's or the page's: on the lookups' own pool,
/// audited (`store::messages::by_recipient`), counted, and logged without the address.
pub(super) async fn look_up(
    state: &AdminState,
    actor: &Actor,
    query: &RecipientQuery,
) -> Result<RecipientPage, LookupError> {
    let started = std::time::Instant::now();
    let found = messages::find(
        &state.lookups,
        &query.search,
        query.after,
        query.limit,
        &actor.operator,
    )
    .await;
    let duration_ms = started.elapsed().as_millis();
    let found = found.map(|mut page| {
        page.messages.iter_mut().for_each(|m| actor.withhold(m));
        page
    });
    let result = match &found {
        Ok(page) => {
            info!(
                actor = %actor.operator,
                found = page.messages.len(),
                pending_searched_all = page.pending_searched_all,
                duration_ms,
                "recipient lookup"
            );
            LookupResult::Answered
        }
        Err(e) => {
            warn!(actor = %actor.operator, error = %e, duration_ms, "recipient lookup refused");
            match e {
                LookupError::Busy(_) => LookupResult::Busy,
                LookupError::TimedOut => LookupResult::TimedOut,
                LookupError::Database(_) => LookupResult::Failed,
            }
        }
    };
    state.metrics.recipient_lookup(result);
    found
}

async fn groups(State(state): State<AdminState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"groups": admin::groups(&state.pool).await?})))
}

async fn stats(State(state): State<AdminState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(stats::stats(&state.pool).await?)))
}

/// `action` on the dead letter the path names.
async fn one(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    action: Action,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    admin::apply_one(&state.pool, action, id, &actor.operator).await?;
    info!(actor = %actor.operator, action = action.as_str(), outbox.id = id, "admin action");
    let warnings = warnings(&state, action, &[id]).await;
    Ok(Json(
        json!({"id": id, action.past_tense(): 1, "warnings": warnings}),
    ))
}

/// What the action left undone, as sentences that name the remedy: a retried message
/// whose recipient is suppressed will end suppressed.
async fn warnings(state: &AdminState, action: Action, ids: &[i64]) -> Vec<String> {
    // The action is done: a failure to read what it left undone must not answer 503.
    match admin::left_undone(&state.pool, action, ids).await {
        Ok(undone) => undone.iter().map(|u| u.warning()).collect(),
        Err(e) => {
            warn!(error = %e, "could not read the suppressions of the messages retried");
            Vec::new()
        }
    }
}

/// The filter of a bulk request: exactly one of `ids`, `kind`, `group` or `"all": true`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    ids: Option<Vec<i64>>,
    kind: Option<String>,
    group: Option<GroupFilter>,
    all: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFilter {
    kind: String,
    error_class: String,
}

impl BulkRequest {
    fn selection(self) -> Result<Selection, ApiError> {
        let given = usize::from(self.ids.is_some())
            + usize::from(self.kind.is_some())
            + usize::from(self.group.is_some())
            + usize::from(self.all.is_some());
        if given != 1 {
            return Err(ApiError::bad_request(
                "give exactly one filter: {\"ids\": [..]}, {\"kind\": \"..\"}, {\"group\": {\"kind\": \"..\", \"error_class\": \"..\"}} or {\"all\": true}",
            ));
        }
        match (self.ids, self.kind, self.group, self.all) {
            (Some(ids), ..) if ids.is_empty() || ids.len() > MAX_IDS => Err(ApiError::bad_request(
                format!("ids must name 1 to {MAX_IDS} messages"),
            )),
            (Some(ids), ..) => Ok(Selection::Ids(ids)),
            (_, Some(kind), ..) if kind.is_empty() => {
                Err(ApiError::bad_request("kind must not be empty"))
            }
            (_, Some(kind), ..) => {
                check_text("kind", &kind).map_err(ApiError::bad_request)?;
                Ok(Selection::Kind(kind))
            }
            (_, _, Some(group), _) => {
                check_text("kind", &group.kind)
                    .and_then(|()| check_text("error_class", &group.error_class))
                    .map_err(ApiError::bad_request)?;
                Ok(Selection::Group {
                    kind: group.kind,
                    error_class: group.error_class,
                })
            }
            (.., Some(true)) => Ok(Selection::All),
            _ => Err(ApiError::bad_request("\"all\" must be true")),
        }
    }
}

/// `action` on the dead letters the body selects.
async fn bulk(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Result<Json<BulkRequest>, axum::extract::rejection::JsonRejection>,
    action: Action,
) -> Result<Json<Value>, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let selection = request.selection()?;
    let applied = admin::apply(&state.pool, action, &selection, &actor.operator).await?;
    let changed = &applied.changed;
    info!(actor = %actor.operator, action = action.as_str(), target = %selection, rows = changed.len(), "admin action");
    let mut warnings = warnings(&state, action, changed).await;
    if !applied.not_retryable.is_empty() {
        warnings.push(format!(
            "{} dead letters were not retried: their secret fields were scrubbed when they ended; their application must enqueue them anew (`not_retryable` lists them)",
            applied.not_retryable.len(),
        ));
    }
    let mut answer = json!({action.past_tense(): changed.len(), "warnings": warnings});
    if !applied.not_retryable.is_empty() {
        answer["not_retryable"] = json!(applied.not_retryable);
    }
    Ok(Json(answer))
}
