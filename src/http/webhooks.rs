//! The bounce and complaint webhooks: `/webhooks/sns`, `/webhooks/postmark` and
//! `/webhooks/standard`, each on only when configured. `feedback` checks and reads a
//! notification; this records what it reports. A refused request changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::Store;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use tracing::{debug, info, warn};

use super::plain;
use crate::feedback::sns::{Sns, SnsOutcome};
use crate::feedback::{
    Checks, EventKind, FeedbackError, FeedbackSettings, MAX_BODY_BYTES, Notification,
};
use crate::lock::lock;
use crate::message::{Lanes, MessageIds};
use crate::store;
use crate::store::suppressions::FeedbackRecorded;
use crate::suppression::FeedbackSource;
use crate::telemetry::metrics::{Metrics, WebhookResult};
use crate::text::{mask_addresses, printable};

#[derive(Clone)]
struct WebhookState {
    pool: Store,
    settings: Arc<FeedbackSettings>,
    sns: Option<Arc<Sns>>,
    /// Each webhook's own: a flood of one does not hold up the others' notifications.
    checks: Arc<WebhookChecks>,
    refusals: Arc<RefusalLog>,
    metrics: Arc<Metrics>,
    message_ids: MessageIds,
    /// Each kind's lane: a complaint or an unsubscribe about a message stops its lane.
    lanes: Lanes,
}

/// The webhooks the settings turn on; `None` when none is.
pub fn router(
    pool: Store,
    settings: Arc<FeedbackSettings>,
    metrics: Arc<Metrics>,
    message_ids: MessageIds,
    lanes: Lanes,
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
        checks: Arc::default(),
        refusals: Arc::default(),
        metrics,
        message_ids,
        lanes,
    }))
}

/// The checks of each webhook.
#[derive(Default)]
struct WebhookChecks {
    sns: Checks,
    postmark: Checks,
    standard: Checks,
}

impl WebhookState {
    fn checks(&self, source: FeedbackSource) -> &Checks {
        match source {
            FeedbackSource::Ses => &self.checks.sns,
            FeedbackSource::Postmark => &self.checks.postmark,
            _ => &self.checks.standard,
        }
    }
}

/// The body, or the 413 that says it is too large: at once when the declared length is
/// over the limit, without reading any of it.
async fn read_body(
    state: &WebhookState,
    source: FeedbackSource,
    body: Body,
) -> Result<Bytes, Response> {
    let too_large = || {
        state
            .metrics
            .webhook_request(source, WebhookResult::TooLarge);
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {MAX_BODY_BYTES} bytes\n"),
        )
    };
    if super::declared_longer_than(&body, MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                too_large()
            } else {
                // Cut short: the server's body deadline, or the connection gone.
                state
                    .metrics
                    .webhook_request(source, WebhookResult::Invalid);
                plain(
                    StatusCode::REQUEST_TIMEOUT,
                    "the body did not arrive in time\n".to_owned(),
                )
            }
        })
}

async fn sns_webhook(State(state): State<WebhookState>, body: Body) -> Response {
    let source = FeedbackSource::Ses;
    let Some(sns) = state.sns.clone() else {
        return not_configured();
    };
    let body = match read_body(&state, source, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let notification = match sns.receive(state.checks(source), body).await {
        Ok(SnsOutcome::Confirmed) => {
            info!("confirmed the SNS subscription");
            Ok(Notification::default())
        }
        Ok(SnsOutcome::Notification(notification)) => Ok(notification),
        Err(e) => Err(e),
    };
    record(&state, source, notification).await
}

async fn postmark_webhook(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let source = FeedbackSource::Postmark;
    let Some(postmark) = &state.settings.postmark else {
        return not_configured();
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = postmark.authorize(authorization) {
        return refuse(&state, source, &e);
    }
    check_and_record(&state, source, body, |body| {
        crate::feedback::postmark::notification(&body)
    })
    .await
}

/// The headers and the clock are checked before the body is read, and the body costs
/// one HMAC, in a turn of the checks.
async fn standard_webhook(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let source = FeedbackSource::Webhook;
    let Some(standard) = &state.settings.standard else {
        return not_configured();
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let signed = match standard.check_headers(
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        chrono::Utc::now().timestamp(),
    ) {
        Ok(signed) => signed,
        Err(e) => return refuse(&state, source, &e),
    };
    let settings = Arc::clone(&state.settings);
    check_and_record(&state, source, body, move |body| {
        if let Some(standard) = &settings.standard {
            standard.verify_body(&signed, &body)?;
        }
        Ok(Notification {
            events: crate::feedback::standard::events(&body)?,
            id: Some(signed.id),
        })
    })
    .await
}

/// A provider this installation takes no notification from.
fn not_configured() -> Response {
    plain(StatusCode::NOT_FOUND, "not configured\n".to_owned())
}

/// Reads the body, checks and reads it with `check` in a turn of the checks, and records
/// what it says.
async fn check_and_record(
    state: &WebhookState,
    source: FeedbackSource,
    body: Body,
    check: impl FnOnce(Bytes) -> Result<Notification, FeedbackError> + Send + 'static,
) -> Response {
    let body = match read_body(state, source, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let notification = state.checks(source).run(move || check(body)).await;
    record(state, source, notification).await
}

/// Records a notification (each recipient's suppression and its row's mark, once per
/// notification id), counts it, and answers with what it changed.
async fn record(
    state: &WebhookState,
    source: FeedbackSource,
    notification: Result<Notification, FeedbackError>,
) -> Response {
    let notification = match notification {
        Ok(notification) => notification,
        Err(e) => return refuse(state, source, &e),
    };
    let events = &notification.events;
    let reports: Vec<_> = events
        .iter()
        .map(|event| event.feedback(source, &state.message_ids))
        .collect();
    let recorded = match store::suppressions::record_feedback(
        &state.pool,
        source,
        notification.id.as_deref(),
        &reports,
        &state.lanes,
    )
    .await
    {
        Ok(recorded) => recorded,
        Err(e) => {
            warn!(error = %e, source = source.as_str(), "could not record a bounce or complaint");
            state.metrics.webhook_request(source, WebhookResult::Failed);
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "could not record the notification; send it again\n".to_owned(),
            );
        }
    };
    if !recorded.replay {
        for event in events {
            match event.kind {
                EventKind::Bounce(bounce_type) => state.metrics.bounce(source, bounce_type),
                EventKind::Complaint => state.metrics.complaint(source),
                EventKind::Unsubscribe => {}
            }
        }
    }
    state
        .metrics
        .webhook_request(source, WebhookResult::Accepted);
    plain(StatusCode::OK, answer(&recorded, events.len()))
}

/// What the provider is told: what the notification changed, in counts only.
fn answer(recorded: &FeedbackRecorded, recipients: usize) -> String {
    if recorded.replay {
        return "already recorded: this notification id was seen before; nothing changed\n"
            .to_owned();
    }
    format!(
        "recorded {recipients} recipient(s): {} suppressed, {} already suppressed, \
         {} message(s) marked, {} not marked\n",
        recorded.suppressed, recorded.already_suppressed, recorded.marked, recorded.not_marked
    )
}

/// The 4xx (or 503, for a check that could not be made now) a refused request gets. Its
/// body never holds the caller's text: a fixed line for what could not be read or checked
/// now, the same line for every one of SNS's checks (so that it does not tell a configured
/// topic from another), and the fixed reason of a refused credential or signature
/// otherwise. The whole reason goes to the log, escaped and masked.
fn refuse(state: &WebhookState, source: FeedbackSource, error: &FeedbackError) -> Response {
    let (status, result, text) = match error {
        FeedbackError::Unauthorized(_) if source == FeedbackSource::Ses => (
            StatusCode::UNAUTHORIZED,
            WebhookResult::Unauthorized,
            "not a notification SNS signed for a configured topic\n".to_owned(),
        ),
        FeedbackError::Unauthorized(reason) => (
            StatusCode::UNAUTHORIZED,
            WebhookResult::Unauthorized,
            format!("{reason}\n"),
        ),
        FeedbackError::Invalid(_) => (
            StatusCode::BAD_REQUEST,
            WebhookResult::Invalid,
            "not a notification outboxd can read (outboxd's log says why)\n".to_owned(),
        ),
        FeedbackError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            WebhookResult::Failed,
            "cannot be checked now; send it again\n".to_owned(),
        ),
    };
    state.refusals.refused(source, error);
    state.metrics.webhook_request(source, result);
    plain(status, text)
}

/// The log of refused requests: one warning a minute per webhook at most, with how many
/// were refused since the last one (a flood once wrote 193 000 lines), the rest at debug.
#[derive(Default)]
struct RefusalLog {
    /// Per webhook: when it last warned (never, at first), and the refusals since.
    since_warning:
        std::sync::Mutex<std::collections::HashMap<&'static str, (Option<Instant>, u64)>>,
}

/// How often a webhook's refusals are logged as a warning.
const REFUSAL_WARNING_EVERY: Duration = Duration::from_secs(60);

impl RefusalLog {
    fn refused(&self, source: FeedbackSource, error: &FeedbackError) {
        let reason = printable(&mask_addresses(&error.to_string())).into_owned();
        let reason = crate::text::cut(&reason, 300);
        let now = Instant::now();
        let mut log = lock(&self.since_warning);
        let (last, count) = log.entry(source.as_str()).or_insert((None, 0));
        *count += 1;
        if last.is_none_or(|last| now.duration_since(last) >= REFUSAL_WARNING_EVERY) {
            warn!(
                source = source.as_str(),
                refused = *count,
                error = reason,
                "refused webhook requests (this one, and those since the last warning)"
            );
            *last = Some(now);
            *count = 0;
        } else {
            debug!(
                source = source.as_str(),
                error = reason,
                "refused a webhook request"
            );
        }
    }
}
