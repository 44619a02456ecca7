//! The admin page: server-rendered HTML, no JavaScript build, POST forms with a CSRF token.

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use minijinja::value::Serde;
use minijinja::{Environment, context};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::api::ListQuery;
use super::api_error::{ParseQuery as _, check_text};
use super::auth::Actor;
use super::{AdminState, plain};
use crate::store::admin::{self, Action, ActionError, DeadLetter, Selection};
use crate::store::stats;
use crate::text::cut_with_ellipsis;

mod cancel;
mod forms;
mod messages;
mod pauses;
mod suppressions;

use forms::{PostedForm, carries_csrf};

/// Errors longer than this are folded behind "more".
const FOLD_AT: usize = 140;

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/admin", get(page))
        .route("/admin/dead-letters/bulk", post(bulk))
        .route("/admin/dead-letters/{id}/{action}", post(one))
        .route("/admin/suppressions", post(suppressions::add))
        .route("/admin/suppressions/remove", post(suppressions::remove))
        .route("/admin/kinds/pause", post(pauses::pause))
        .route("/admin/kinds/resume", post(pauses::resume))
        .route("/admin/messages", get(messages::search))
        .route("/admin/messages/{id}", get(messages::one))
        .route("/admin/messages/{id}/cancel", post(cancel::one))
        .route("/admin/pending", get(cancel::count))
        .route("/admin/pending/cancel", post(cancel::pending))
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        // Every value the page shows is text someone else wrote (a pause's reason, an
        // actor, a provider's reply): its control and reordering characters are shown as
        // escapes, so that RIGHT-TO-LEFT OVERRIDE cannot make the page say what was not
        // written; then HTML-escaped as usual.
        env.set_formatter(|out, state, value| match value.as_str() {
            Some(text) if !value.is_safe() => minijinja::escape_formatter(
                out,
                state,
                &minijinja::Value::from(crate::text::printable_lines(text)),
            ),
            _ => minijinja::escape_formatter(out, state, value),
        });
        for (name, text) in [
            ("style.html", include_str!("style.html")),
            ("admin.html", include_str!("admin.html")),
            ("messages.html", include_str!("messages.html")),
            ("pending.html", include_str!("pending.html")),
        ] {
            if let Err(e) = env.add_template(name, text) {
                tracing::error!(error = %e, template = name, "an admin page template does not parse");
            }
        }
        env
    })
}

fn csrf_refused() -> Response {
    plain(
        StatusCode::FORBIDDEN,
        "outboxd admin: the form's CSRF token is missing or wrong; reload the page\n".into(),
    )
}

/// "3 min ago", for a person scanning a table; the absolute time is beside it.
fn ago(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (now - then).num_seconds().max(0);
    match seconds {
        0..=59 => format!("{seconds} s ago"),
        60..=3599 => format!("{} min ago", seconds / 60),
        3600..=86_399 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86_400),
    }
}

fn short(text: &str) -> String {
    cut_with_ellipsis(text, FOLD_AT).into_owned()
}

fn duration_text(seconds: f64) -> String {
    let seconds = seconds.max(0.0) as u64;
    if seconds == 0 {
        "–".to_owned()
    } else {
        humantime::format_duration(std::time::Duration::from_secs(seconds)).to_string()
    }
}

#[derive(Serialize)]
struct Row {
    id: i64,
    kind: String,
    error_class: String,
    recipients: String,
    attempts: i32,
    last_error: String,
    short_error: String,
    error_folded: bool,
    created_at: String,
    created_ago: String,
    created_short: String,
    dead_lettered_at: String,
    dead_ago: String,
    dead_short: String,
    tags: Vec<String>,
}

impl Row {
    fn new(d: DeadLetter, now: DateTime<Utc>) -> Self {
        let last_error = d.last_error.unwrap_or_default();
        Row {
            id: d.id,
            tags: d.tags,
            kind: d.kind,
            error_class: d.error_class,
            recipients: d.recipients.join(", "),
            attempts: d.attempts,
            short_error: short(&last_error),
            error_folded: last_error.chars().count() > FOLD_AT,
            last_error,
            created_at: d.created_at.to_rfc3339(),
            created_ago: ago(d.created_at, now),
            created_short: d.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            dead_lettered_at: d.dead_lettered_at.to_rfc3339(),
            dead_ago: ago(d.dead_lettered_at, now),
            dead_short: d
                .dead_lettered_at
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string(),
        }
    }
}

async fn page(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Query(mut query): Query<HashMap<String, String>>,
) -> Response {
    let suppressed = query.remove("suppressed");
    let suppressed_after = query.remove("suppressed_after");
    for (name, value) in [
        ("suppressed", &suppressed),
        ("suppressed_after", &suppressed_after),
    ] {
        if let Some(Err(e)) = value.as_deref().map(|v| check_text(name, v)) {
            return plain(StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
    }
    let list = match ListQuery::read(&query) {
        Ok(list) => list,
        Err(e) => return plain(StatusCode::BAD_REQUEST, e),
    };
    let nonce = style_nonce();
    let shown = Shown {
        list: &list,
        notice: query.get("notice"),
        suppressed: suppressed.as_deref(),
        suppressed_after: suppressed_after.as_deref(),
    };
    match render(&state, &actor, &shown, &nonce).await {
        Ok(html) => html_page(html, &nonce),
        Err(e) => database_unavailable(&e),
    }
}

/// A rendered page, with the policy that lets only its own `<style>` block apply.
fn html_page(html: String, nonce: &str) -> Response {
    let policy = format!(
        "default-src 'none'; style-src 'nonce-{nonce}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    let mut response = Html(html).into_response();
    if let Ok(policy) = header::HeaderValue::from_str(&policy) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    response
}

/// A fresh nonce for the page's one `<style>` block: the page runs no script, and no style
/// an attacker could inject would carry it. URL-safe base64, which the template's HTML
/// escaping leaves as it is.
fn style_nonce() -> String {
    let mut bytes = [0_u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        // Without randomness the nonce is merely predictable: styles only, still no script.
        bytes = *b"outboxd-no-rand!";
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What the page was asked to show.
struct Shown<'a> {
    list: &'a ListQuery,
    notice: Option<&'a String>,
    /// The suppression list's search, and where its page starts.
    suppressed: Option<&'a str>,
    suppressed_after: Option<&'a str>,
}

async fn render(
    state: &AdminState,
    actor: &Actor,
    shown: &Shown<'_>,
    nonce: &str,
) -> anyhow::Result<String> {
    let (list, notice) = (shown.list, shown.notice);
    let now = Utc::now();
    let (suppressions, suppressed_next) =
        suppressions::rows(&state.pool, shown.suppressed, shown.suppressed_after, now).await?;
    let pauses = pauses::rows(&state.pool, now).await?;
    let query_value =
        |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
    let stats = stats::stats(&state.pool).await?;
    let groups = admin::groups(&state.pool).await?;
    let (kind_filter, tag_filter) = (list.kind.as_deref(), list.tag.as_ref());
    let page =
        admin::list_dead_letters(&state.pool, kind_filter, tag_filter, list.after, list.limit)
            .await?;
    let audit = audit_rows(&state.pool, now).await?;
    let next_after = list.next_after(&page);
    let kinds = kinds_shown(&state.kinds, stats.kinds.keys().chain(list.kind.iter()));
    let rows: Vec<Row> = page.into_iter().map(|d| Row::new(d, now)).collect();
    let groups: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let short_error = short(g.newest.last_error.as_deref().unwrap_or(""));
            context! { kind => g.kind, error_class => g.error_class, count => g.count, newest => context! { id => g.newest.id }, short_error }
        })
        .collect();
    let notice_error = notice.is_some_and(|n| n.starts_with("Could not"));
    let (kind, tag, filter_query) = filters(list);
    let html = environment().get_template("admin.html")?.render(context! {
        actor => actor.operator.name.as_str(),
        may_change => actor.may_change(),
        now => now.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        notice => notice,
        notice_error,
        stats => Serde(&stats),
        oldest_pending => duration_text(stats.oldest_pending_age_seconds),
        groups,
        kinds,
        kind,
        tag,
        filter_query,
        dead_letters => Serde(&rows),
        after => list.after,
        next_after,
        audit,
        suppressions,
        suppressed => shown.suppressed.unwrap_or_default(),
        suppressed_query => query_value(shown.suppressed.unwrap_or_default()),
        suppressed_next => suppressed_next.as_deref().map(query_value),
        reasons => suppressions::reasons(),
        pauses,
        csrf => state.auth.csrf_token(actor),
        nonce => nonce,
    })?;
    Ok(html)
}

/// The dead letters' filters: the kind, the tag, and both as a query string for the pager.
fn filters(list: &ListQuery) -> (String, String, String) {
    let kind = list.kind.clone().unwrap_or_default();
    let tag = list.tag.as_ref().map(ToString::to_string).unwrap_or_default();
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("kind", &kind), ("tag", &tag)].iter().filter(|(_, v)| !v.is_empty()))
        .finish();
    (kind, tag, query)
}

/// The page's recent admin actions.
async fn audit_rows(
    pool: &crate::store::Store,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<minijinja::Value>> {
    let audit = admin::audit_log(pool, 20).await?;
    Ok(audit
        .into_iter()
        .map(|a| context! { at => a.at.to_rfc3339(), ago => ago(a.at, now), actor => a.actor, token => a.token, action => a.action, target => a.target, rows => a.rows, detail => a.detail })
        .collect())
}

/// The kinds the page offers: those with templates and any the table or the filter names.
fn kinds_shown<'a>(templates: &[String], seen: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut kinds = templates.to_vec();
    for kind in seen {
        if !kinds.contains(kind) {
            kinds.push(kind.clone());
        }
    }
    kinds.sort();
    kinds
}

#[derive(Debug, Deserialize)]
struct OneForm {
    csrf: String,
    #[serde(default)]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct BulkForm {
    csrf: String,
    action: String,
    kind: String,
    error_class: String,
}

carries_csrf!(OneForm, BulkForm);

fn back(kind: &str, notice: &str) -> Response {
    if kind.is_empty() {
        back_to(&[], notice)
    } else {
        back_to(&[("kind", kind)], notice)
    }
}

/// Back to the page with these parameters and a notice.
fn back_to(pairs: &[(&str, &str)], notice: &str) -> Response {
    let mut url = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in pairs {
        url.append_pair(key, value);
    }
    url.append_pair("notice", notice);
    Redirect::to(&format!("/admin?{}", url.finish())).into_response()
}

/// The notice `said`, and what the action left undone (a retried message whose recipient
/// is suppressed), without the address: the notice travels in the redirect's URL.
async fn with_warnings(state: &AdminState, action: Action, ids: &[i64], said: String) -> String {
    match admin::left_undone(&state.pool, action, ids).await {
        Ok(undone) if undone.is_empty() => said,
        Ok(undone) => {
            let mut messages: Vec<i64> = undone.iter().map(|u| u.message_id).collect();
            messages.dedup();
            let listed: Vec<String> = messages.iter().map(i64::to_string).collect();
            format!(
                "{said} Warning: a recipient of message {} is suppressed; lift the suppression \
                 in the list below (or outboxd suppressions remove ADDRESS) or it will not be \
                 sent to them.",
                listed.join(", ")
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the suppressions of the messages retried");
            said
        }
    }
}

/// What an action did, as the page's notice says it.
fn done(action: Action) -> &'static str {
    match action {
        Action::Retry => "Retried",
        Action::Discard => "Discarded",
    }
}

fn parse_action(raw: &str) -> Option<Action> {
    match raw {
        "retry" => Some(Action::Retry),
        "discard" => Some(Action::Discard),
        _ => None,
    }
}

async fn one(
    State(state): State<AdminState>,
    Path((id, action)): Path<(String, String)>,
    PostedForm { actor, form }: PostedForm<OneForm>,
) -> Response {
    let (Ok(id), Some(action)) = (id.parse::<i64>(), parse_action(&action)) else {
        return plain(StatusCode::NOT_FOUND, "no such action\n".into());
    };
    match admin::apply_one(&state.pool, action, id, &actor.operator).await {
        Ok(()) => {
            info!(actor = %actor.operator, action = action.as_str(), outbox.id = id, "admin action");
            let said = format!("{} message {id}.", done(action));
            back(
                &form.kind,
                &with_warnings(&state, action, &[id], said).await,
            )
        }
        Err(
            e @ (ActionError::NotFound(_)
            | ActionError::NotDeadLettered { .. }
            | ActionError::PayloadGone(_)),
        ) => {
            back(&form.kind, &format!("Could not {}: {e}.", action.as_str()))
        }
        Err(ActionError::Database(e)) => database_unavailable(&e),
    }
}

async fn bulk(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<BulkForm>,
) -> Response {
    if let Err(e) = check_text("kind", &form.kind).and(check_text("error_class", &form.error_class))
    {
        return plain(StatusCode::BAD_REQUEST, format!("{e}\n"));
    }
    let Some(action) = parse_action(&form.action) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "action must be retry or discard\n".into(),
        );
    };
    let selection = Selection::Group {
        kind: form.kind,
        error_class: form.error_class,
    };
    match admin::apply(&state.pool, action, &selection, &actor.operator).await {
        Ok(applied) => {
            let changed = &applied.changed;
            info!(actor = %actor.operator, action = action.as_str(), target = %selection, rows = changed.len(), "admin action");
            let mut said = format!("{} {} messages ({selection}).", done(action), changed.len());
            if !applied.not_retryable.is_empty() {
                said.push_str(&format!(
                    " {} were not retried: their secret fields were scrubbed when they ended; their application must enqueue them anew.",
                    applied.not_retryable.len()
                ));
            }
            back("", &with_warnings(&state, action, changed, said).await)
        }
        Err(e) => database_unavailable(&e),
    }
}

/// The database error goes to the log; the operator gets a sentence.
fn database_unavailable(error: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %error, "admin page database error");
    plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "outboxd admin: the database did not answer; try again\n".to_owned(),
    )
}
