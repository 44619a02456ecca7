//! The admin page's withdrawals: one pending message from its page, and pending messages by
//! filter, counted on a page of their own before a second form cancels them; audited like
//! every admin action.

use std::collections::HashMap;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use minijinja::context;
use serde::Deserialize;
use tracing::info;

use super::{PostedForm, back_to, carries_csrf, database_unavailable, environment, html_page, style_nonce};
use crate::http::auth::Actor;
use crate::http::{AdminState, plain};
use crate::message::{FilterRequest, PendingFilter};
use crate::store::cancel::{self, CancelTarget};

/// The filter's fields as a form or a query gives them (empty ones left out).
const FIELDS: [&str; 5] = ["kind", "tag", "created_before", "created_after", "recipient_domain"];

#[derive(Debug, Deserialize)]
pub(super) struct OneCancelForm {
    csrf: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct PendingCancelForm {
    csrf: String,
    #[serde(flatten)]
    fields: HashMap<String, String>,
}

carries_csrf!(OneCancelForm, PendingCancelForm);

/// `POST /admin/messages/{id}/cancel`: one message, as `outbox_cancel_id` does.
pub(super) async fn one(
    State(state): State<AdminState>,
    Path(id): Path<i64>,
    PostedForm { actor, form: _ }: PostedForm<OneCancelForm>,
) -> Response {
    match cancel::cancel(&state.pool, &CancelTarget::Id(id), &actor.operator).await {
        Ok(answer) => {
            info!(actor = %actor.operator, action = "cancel", id, answer = answer.as_str(), "admin action");
            back_to(&[], &format!("Message {id}: {}.", answer.as_str()))
        }
        Err(e) => database_unavailable(&e),
    }
}

/// `GET /admin/pending?kind=...`: how many pending messages the filter matches, and the
/// form that cancels them.
pub(super) async fn count(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let filter = match filter_of(&query) {
        Ok(filter) => filter,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let counted = match cancel::count_pending(&state.pool, &filter).await {
        Ok(counted) => counted,
        Err(e) => return database_unavailable(&e),
    };
    let fields: Vec<(String, String)> = FIELDS
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), query.get(*name)?.trim().to_owned())))
        .filter(|(_, value)| !value.is_empty())
        .collect();
    let nonce = style_nonce();
    let rendered = environment().get_template("pending.html").and_then(|t| {
        t.render(context! {
            actor => actor.operator.name.as_str(),
            may_change => actor.may_change(),
            matching => counted.matching,
            in_flight => counted.in_flight,
            filter => filter.describe(),
            fields,
            csrf => state.auth.csrf_token(&actor),
            nonce => nonce.as_str(),
        })
    });
    match rendered {
        Ok(html) => html_page(html, &nonce),
        Err(e) => database_unavailable(&e),
    }
}

/// `POST /admin/pending/cancel`: what the filter matches, as `outboxd cancel --yes` does.
pub(super) async fn pending(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<PendingCancelForm>,
) -> Response {
    let filter = match filter_of(&form.fields) {
        Ok(filter) => filter,
        Err(e) => return back_to(&[], &format!("Could not cancel: {e}.")),
    };
    match cancel::cancel_pending(&state.pool, &filter, &actor.operator).await {
        Ok(done) => {
            info!(actor = %actor.operator, action = "cancel", filter = %filter.describe(), cancelled = done.cancelled, in_flight = done.in_flight, "admin action");
            back_to(
                &[],
                &format!(
                    "Cancelled {} pending messages ({}); {} being sent were marked.",
                    done.cancelled,
                    filter.describe(),
                    done.in_flight
                ),
            )
        }
        Err(e) => database_unavailable(&e),
    }
}

/// The filter of a query or form: its empty fields left out, and an unknown one refused.
fn filter_of(fields: &HashMap<String, String>) -> Result<PendingFilter, String> {
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("unknown field {unknown:?}"));
    }
    let given = |name: &str| {
        fields
            .get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let time = |name: &str| {
        given(name)
            .map(|v| {
                chrono::DateTime::parse_from_rfc3339(&v)
                    .map(|t| t.with_timezone(&chrono::Utc))
                    .map_err(|e| format!("{name} {v:?} is not an RFC 3339 time: {e}"))
            })
            .transpose()
    };
    PendingFilter::try_from(FilterRequest {
        kind: given("kind"),
        tag: given("tag"),
        created_before: time("created_before")?,
        created_after: time("created_after")?,
        recipient_domain: given("recipient_domain"),
    })
}
