//! The admin page's message search: the messages to an address, or one message, each with
//! its timeline, as the API's `GET /api/v1/messages` gives them.

use std::collections::HashMap;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use minijinja::{Value, context};

use super::{database_unavailable, environment, html_page, style_nonce};
use crate::http::api::RecipientQuery;
use crate::http::api::look_up;
use crate::http::api_error::ParseQuery as _;
use crate::http::auth::Actor;
use crate::http::{AdminState, plain};
use crate::store::messages::{self, LookupError, MessageDetail, PENDING_SCAN_ROWS, Search};

/// `GET /admin/messages?recipient=` or `?tag=`: the search boxes, and what they found.
pub(super) async fn search(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if query.is_empty() {
        return show(&state, &actor, &[], &Searched::default());
    }
    let query = match RecipientQuery::read(&query) {
        Ok(query) => query,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    match look_up(&state, &actor, &query).await {
        Ok(page) => show(
            &state,
            &actor,
            &page.messages,
            &Searched {
                recipient: match query.search {
                    Search::Recipient(_) => &query.address,
                    Search::Tag(_) => "",
                },
                tag: match query.search {
                    Search::Tag(_) => &query.address,
                    Search::Recipient(_) => "",
                },
                next_after: query.next_after(&page),
                pending_searched_all: page.pending_searched_all,
            },
        ),
        Err(LookupError::Database(e)) => database_unavailable(&e),
        Err(refused) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{refused}\n")),
    }
}

/// `GET /admin/messages/{id}`: one message and its timeline.
pub(super) async fn one(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Response {
    let Some(id) = id.parse::<i64>().ok().filter(|id| *id > 0) else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a message id\n"),
        );
    };
    match messages::message(&state.pool, id).await {
        Ok(Some(mut message)) => {
            actor.withhold(&mut message);
            show(&state, &actor, &[message], &Searched::default())
        }
        Ok(None) => plain(StatusCode::NOT_FOUND, format!("no message {id}\n")),
        Err(e) => database_unavailable(&e),
    }
}

/// What a search asked and how far it went: empty for one message's page.
#[derive(Default)]
struct Searched<'a> {
    recipient: &'a str,
    tag: &'a str,
    next_after: Option<i64>,
    /// `false`: only the first pending messages due were searched (a long backlog).
    pending_searched_all: bool,
}

fn show(
    state: &AdminState,
    actor: &Actor,
    found: &[MessageDetail],
    searched: &Searched<'_>,
) -> Response {
    let nonce = style_nonce();
    let messages: Vec<Value> = found.iter().map(message_view).collect();
    let Searched {
        recipient,
        tag,
        next_after,
        pending_searched_all,
    } = *searched;
    let search_query: String = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("recipient", recipient), ("tag", tag)].iter().filter(|(_, v)| !v.is_empty()))
        .finish();
    let pending_partly = !recipient.is_empty() && !pending_searched_all;
    let rendered = environment()
        .get_template("messages.html")
        .and_then(|template| {
            template.render(context! {
                actor => actor.operator.name.as_str(),
                may_change => actor.may_change(),
                now => Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                recipient,
                tag,
                search_query,
                messages,
                next_after,
                pending_partly,
                pending_scan_rows => PENDING_SCAN_ROWS,
                nonce => nonce.as_str(),
                csrf => state.auth.csrf_token(actor),
            })
        });
    match rendered {
        Ok(html) => html_page(html, &nonce),
        Err(e) => database_unavailable(&e),
    }
}

fn message_view(message: &MessageDetail) -> Value {
    let events: Vec<Value> = message
        .events
        .iter()
        .map(|e| {
            let said = e.said();
            context! {
                at => e.at.to_rfc3339(),
                at_short => e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                type => e.event.as_str(),
                actor => e.actor.as_deref().unwrap_or_default(),
                duration_ms => e.duration_ms,
                said,
            }
        })
        .collect();
    context! {
        id => message.id,
        kind => message.kind.as_str(),
        recipients => message.recipients.join(", "),
        state => message.state.as_str(),
        tags => message.tags.clone(),
        payload_shown => !message.payload.0.is_null(),
        payload => serde_json::to_string_pretty(&message.payload.0).unwrap_or_default(),
        secret_fields => message.secret_fields.clone(),
        secrets_scrubbed_at => message.secrets_scrubbed_at.map(|t| t.to_rfc3339()),
        payload_removed_at => message.payload_removed_at.map(|t| t.to_rfc3339()),
        events,
    }
}
