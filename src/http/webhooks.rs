//! The bounce and complaint webhooks: `/webhooks/sns`, `/webhooks/postmark` and
//! `/webhooks/standard`, each on only when configured. `feedback` checks and reads a
//! notification; this records what it reports. A refused request changes nothing.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use sqlx::PgPool;
use tracing::{info, warn};

use super::plain;
use crate::feedback::sns::{Sns, SnsOutcome};
use crate::feedback::{Event, EventKind, FeedbackError, FeedbackSettings, MAX_BODY_BYTES};
use crate::store;
use crate::suppression::FeedbackSource;
use crate::telemetry::metrics::{Metrics, WebhookResult};
use crate::text::mask_addresses;

#[derive(Clone)]
struct WebhookState {
    pool: PgPool,
    settings: Arc<FeedbackSettings>,
    sns: Option<Arc<Sns>>,
    metrics: Arc<Metrics>,
}

/// The webhooks the settings turn on; `None` when none is.
pub fn router(
    pool: PgPool,
    settings: Arc<FeedbackSettings>,
    metrics: Arc<Metrics>,
) -> Option<Router> {
    if !settings.any() {
        return None;
    }
    let sns = settings
        .sns
        .as_ref()
        .map(|sns| Arc::new(Sns::new(sns.clone())));
    let mut router = Router::new();
    if sns.is_some() {
        router = router.route("/webhooks/sns", post(sns_webhook));
    }
    if settings.postmark.is_some() {
        router = router.route("/webhooks/postmark", post(postmark_webhook));
    }
    if settings.standard.is_some() {
        router = router.route("/webhooks/standard", post(standard_webhook));
    }
    Some(router.with_state(WebhookState {
        pool,
        settings,
        sns,
        metrics,
    }))
}

/// The body, or the 413 that says it is too large.
async fn read_body(
    state: &WebhookState,
    source: FeedbackSource,
    body: Body,
) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            state
                .metrics
                .webhook_request(source, WebhookResult::TooLarge);
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {MAX_BODY_BYTES} bytes\n"),
            )
        })
}

async fn sns_webhook(State(state): State<WebhookState>, body: Body) -> Response {
    let source = FeedbackSource::Ses;
    let body = match read_body(&state, source, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let Some(sns) = &state.sns else {
        return plain(StatusCode::NOT_FOUND, "not configured\n".to_owned());
    };
    let events = match sns.receive(&body).await {
        Ok(SnsOutcome::Confirmed) => {
            info!("confirmed the SNS subscription");
            Ok(Vec::new())
        }
        Ok(SnsOutcome::Events(events)) => Ok(events),
        Err(e) => Err(e),
    };
    record(&state, source, events).await
}

async fn postmark_webhook(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let source = FeedbackSource::Postmark;
    let Some(postmark) = &state.settings.postmark else {
        return plain(StatusCode::NOT_FOUND, "not configured\n".to_owned());
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = postmark.authorize(authorization) {
        return refuse(&state, source, &e);
    }
    match read_body(&state, source, body).await {
        Ok(body) => record(&state, source, crate::feedback::postmark::events(&body)).await,
        Err(response) => response,
    }
}

async fn standard_webhook(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let source = FeedbackSource::Webhook;
    let Some(standard) = &state.settings.standard else {
        return plain(StatusCode::NOT_FOUND, "not configured\n".to_owned());
    };
    let body = match read_body(&state, source, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let verified = standard.verify(
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        &body,
        chrono::Utc::now().timestamp(),
    );
    let events = verified.and_then(|()| crate::feedback::standard::events(&body));
    record(&state, source, events).await
}

/// Records each event (its suppression and its row's mark), counts it, and answers.
async fn record(
    state: &WebhookState,
    source: FeedbackSource,
    events: Result<Vec<Event>, FeedbackError>,
) -> Response {
    let events = match events {
        Ok(events) => events,
        Err(e) => return refuse(state, source, &e),
    };
    let reports: Vec<_> = events.iter().map(|event| event.feedback(source)).collect();
    if let Err(e) = store::suppressions::record_feedback(&state.pool, &reports).await {
        warn!(error = %e, source = source.as_str(), "could not record a bounce or complaint");
        state.metrics.webhook_request(source, WebhookResult::Failed);
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "could not record the notification; send it again\n".to_owned(),
        );
    }
    for event in &events {
        match event.kind {
            EventKind::Bounce(bounce_type) => state.metrics.bounce(source, bounce_type),
            EventKind::Complaint => state.metrics.complaint(source),
            EventKind::Unsubscribe => {}
        }
    }
    state
        .metrics
        .webhook_request(source, WebhookResult::Accepted);
    plain(
        StatusCode::OK,
        format!("recorded {} recipient(s)\n", events.len()),
    )
}

/// The 4xx (or 503, for a check that could not be made now) a refused request gets.
fn refuse(state: &WebhookState, source: FeedbackSource, error: &FeedbackError) -> Response {
    let (status, result) = match error {
        FeedbackError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, WebhookResult::Unauthorized),
        FeedbackError::Invalid(_) => (StatusCode::BAD_REQUEST, WebhookResult::Invalid),
        FeedbackError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, WebhookResult::Failed),
    };
    warn!(source = source.as_str(), error = %mask_addresses(&error.to_string()), "refused a webhook request");
    state.metrics.webhook_request(source, result);
    plain(status, format!("{error}\n"))
}
