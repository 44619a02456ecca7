//! `/unsubscribe/{token}`: one-click unsubscribe (RFC 8058). A mailbox provider (or the
//! confirmation page's button) POSTs `List-Unsubscribe=One-Click` and the link's address
//! is suppressed for its scope: 200, no redirect, the same on a second click. A GET, which
//! mail scanners make of every link, changes nothing: it shows a page with the button.
//! Any token outboxd did not make gets one answer, whatever is wrong with it. Reached from
//! the internet: bodies are small and bounded in time (`http::server`), recording waits in
//! a bounded line, and the log never holds an address. A token is opened before any body
//! is read, so a forgery costs one open per configured secret and nothing else.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use tracing::{debug, info, warn};

use crate::feedback::Turnstile;
use crate::store::Store;
use crate::suppression::{FeedbackSource, NewSuppression, SuppressionReason};
use crate::telemetry::metrics::{Metrics, UnsubscribeResult};
use crate::unsubscribe::{OneClick, Unsubscribe};

/// The largest body taken: RFC 8058's is 26 bytes, or a small multipart form.
const MAX_BODY_BYTES: usize = 4096;
/// Unsubscribes recorded at once, more waiting at most, each for at most this long: a
/// flood gets 503s (which providers retry) and leaves the surface's connections free.
const TURNS: usize = 2;
const LINE: usize = 64;
const WAIT: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct UnsubscribeState {
    store: Store,
    links: Arc<OneClick>,
    turnstile: Arc<Turnstile>,
    metrics: Arc<Metrics>,
}

/// The route, with its state.
pub fn router(store: Store, links: Arc<OneClick>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/unsubscribe/{token}", get(confirm_page).post(unsubscribe))
        .with_state(UnsubscribeState {
            store,
            links,
            turnstile: Arc::new(Turnstile::new(TURNS, LINE, WAIT)),
            metrics,
        })
}

/// The link's token, opened; a path that is not even text is one more bad token.
fn opened(links: &OneClick, token: Result<Path<String>, PathRejection>) -> Option<Unsubscribe> {
    links.open(&token.ok()?.0).ok()
}

/// The page a person (or a scanner) sees on following the link: a button, nothing done.
async fn confirm_page(
    State(state): State<UnsubscribeState>,
    token: Result<Path<String>, PathRejection>,
) -> Response {
    match opened(&state.links, token) {
        Some(_) => page(StatusCode::OK, CONFIRM_PAGE),
        None => not_a_link(),
    }
}

/// RFC 8058's POST: the link's address suppressed for its scope.
async fn unsubscribe(
    State(state): State<UnsubscribeState>,
    token: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let refused = |response: Response| {
        state.metrics.unsubscribe(UnsubscribeResult::Refused);
        response
    };
    // The token first: a forgery costs one open per secret, and no body is read for it.
    let Some(link) = opened(&state.links, token) else {
        debug!("refused an unsubscribe link outboxd did not make");
        return refused(not_a_link());
    };
    if super::declared_longer_than(&body, MAX_BODY_BYTES as u64) {
        return refused(plain(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large\n"));
    }
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => return refused(plain(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large, or did not arrive in time\n")),
    };
    if !is_one_click(&headers, &body) {
        return refused(plain(
            StatusCode::BAD_REQUEST,
            "expected the body List-Unsubscribe=One-Click (RFC 8058)\n",
        ));
    }
    let Ok(_turn) = state.turnstile.enter().await else {
        state.metrics.unsubscribe(UnsubscribeResult::Failed);
        return busy();
    };
    record(&state, &link).await
}

async fn record(state: &UnsubscribeState, link: &Unsubscribe) -> Response {
    let entry = NewSuppression {
        address: link.address.clone(),
        reason: SuppressionReason::Unsubscribe,
        source: FeedbackSource::OneClick,
        scope: link.scope,
        detail: Some("one-click unsubscribe (RFC 8058)".to_owned()),
        message_id: Some(link.message),
        until: None,
    };
    match crate::store::suppressions::record_unsubscribe(&state.store, &entry).await {
        Ok(added) => {
            let result = if added {
                UnsubscribeResult::Recorded
            } else {
                UnsubscribeResult::AlreadyRecorded
            };
            state.metrics.unsubscribe(result);
            info!(
                scope = link.scope.as_str(),
                message = link.message,
                result = result.as_str(),
                "one-click unsubscribe"
            );
            page(StatusCode::OK, DONE_PAGE)
        }
        Err(e) => {
            warn!(error = %e, message = link.message, "could not record a one-click unsubscribe");
            state.metrics.unsubscribe(UnsubscribeResult::Failed);
            busy()
        }
    }
}

/// Whether the body is RFC 8058's: `List-Unsubscribe=One-Click`, form-encoded, or as a
/// part of `multipart/form-data` (which the RFC prefers).
fn is_one_click(headers: &HeaderMap, body: &Bytes) -> bool {
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("multipart/form-data") {
        return text.split("\r\n\r\n").zip(text.split("\r\n\r\n").skip(1)).any(|(head, value)| {
            head.contains("name=\"List-Unsubscribe\"")
                && value.split("\r\n").next() == Some("One-Click")
        });
    }
    text.trim()
        .split('&')
        .any(|pair| pair == "List-Unsubscribe=One-Click")
}

/// The one answer for every token outboxd did not make.
fn not_a_link() -> Response {
    page(StatusCode::NOT_FOUND, NOT_A_LINK_PAGE)
}

fn busy() -> Response {
    let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "busy; try again in a moment\n");
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// A page: no script, no style from elsewhere, its form posting back to its own URL, the
/// token in its URL neither cached nor sent on as a referrer.
fn page(status: StatusCode, html: [&'static str; 5]) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html.concat(),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    response
}

/// A page of a heading and a paragraph, and the button when it is the confirmation.
const fn html(title: &'static str, text: &'static str, button: bool) -> [&'static str; 5] {
    [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"robots\" content=\"noindex\"><title>",
        title,
        "</title><style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;line-height:1.5}\
         button{font-size:1rem;padding:.6rem 1.2rem}</style></head><body><h1>",
        text,
        if button {
            "<form method=\"post\"><input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\
             <button type=\"submit\">Unsubscribe</button></form></body></html>"
        } else {
            "</body></html>"
        },
    ]
}

const CONFIRM_PAGE: [&str; 5] = html(
    "Unsubscribe",
    "Unsubscribe?</h1><p>You will get no more of these emails at this address. Messages you \
     need for your account, such as password resets, still reach you.</p>",
    true,
);
const DONE_PAGE: [&str; 5] = html(
    "Unsubscribed",
    "Unsubscribed</h1><p>You will get no more of these emails at this address.</p>",
    false,
);
const NOT_A_LINK_PAGE: [&str; 5] = html(
    "Not an unsubscribe link",
    "Not an unsubscribe link</h1><p>This link is not one this sender made, or it was \
     changed on the way. Use the link in the email as it came.</p>",
    false,
);
