//! The callback sender: every replica runs one. It claims the callbacks due (each the
//! oldest unsent of its message), POSTs them a few at once, and records each: delivered on
//! a 2xx answer; otherwise tried again after a backoff (1 s, doubling, at most 10 min)
//! until it is older than `OUTBOXD_CALLBACK_MAX_AGE`, then kept as failed. While its
//! dispatcher drains a backlog, it works a quarter of the time (`YIELD_FACTOR`): delivery
//! keeps the cores, callbacks still flow, and they catch up once the drain ends.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use hyper::body::Bytes;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{BATCH, CONCURRENCY, CallbackSettings, TIMEOUT, callback_body};
use crate::backlog::Backlog;
use crate::http_client::Origin;
use crate::store::Store;
use crate::store::callbacks::{self, DueCallback};
use crate::telemetry::metrics::{CallbackFailure, DatabaseOperation, Metrics};


/// How long the sender waits when nothing is due.
const IDLE: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a callback.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// During a drain, the wait after a batch, as a multiple of the time the batch took.
const YIELD_FACTOR: u32 = 3;
/// The most a batch waits during a drain: callbacks never stop.
const MAX_YIELD: Duration = Duration::from_secs(2);

/// Sends callbacks until `stop`.
pub async fn run(
    store: Store,
    settings: Arc<CallbackSettings>,
    installation_tag: String,
    metrics: Arc<Metrics>,
    backlog: Arc<Backlog>,
    stop: CancellationToken,
) {
    let tls = match crate::tls::client_config(None) {
        Ok(tls) => tls,
        Err(e) => {
            warn!(error = %e, "no TLS settings for the callback URL: no callback is sent");
            return;
        }
    };
    let origin = match Origin::new(settings.url.clone(), Some(tls)) {
        Ok(origin) => origin,
        Err(e) => {
            warn!(error = %e, "the callback URL cannot be reached: no callback is sent");
            return;
        }
    };
    let sender = Sender {
        origin,
        settings,
        installation_tag,
        metrics,
    };
    // A claim's lease: every POST of the batch, each bounded by the timeout, and a margin.
    let lease = TIMEOUT * 2 + Duration::from_secs(5);
    loop {
        let due = tokio::select! {
            () = stop.cancelled() => return,
            due = callbacks::claim(&store, BATCH, lease) => due,
        };
        let wait = match due {
            Ok(due) if due.is_empty() => IDLE,
            Ok(due) => {
                let began = std::time::Instant::now();
                sender.send_all(&store, due).await;
                if backlog.draining() {
                    (began.elapsed() * YIELD_FACTOR).min(MAX_YIELD)
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => {
                sender.metrics.database_error(DatabaseOperation::Callbacks);
                warn!(error = %e, "could not claim callbacks");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One callback's POST.
struct Tried {
    id: i64,
    /// Its tries before this one.
    attempts: i32,
    sent: Result<(), Failed>,
}

/// Why a POST failed.
struct Failed {
    why: CallbackFailure,
    error: String,
}

struct Sender {
    origin: Origin,
    settings: Arc<CallbackSettings>,
    installation_tag: String,
    metrics: Arc<Metrics>,
}

impl Sender {
    /// POSTs each, a few at once, and records what became of each.
    async fn send_all(&self, store: &Store, due: Vec<DueCallback>) {
        let tried: Vec<Tried> = futures_util::stream::iter(due)
            .map(|callback| async move {
                Tried {
                    id: callback.id,
                    attempts: callback.attempts,
                    sent: self.post(&callback).await,
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let delivered: Vec<i64> = tried
            .iter()
            .filter(|t| t.sent.is_ok())
            .map(|t| t.id)
            .collect();
        if let Err(e) = callbacks::delivered(store, &delivered).await {
            // Sent again after the lease: at least once.
            self.metrics.database_error(DatabaseOperation::Callbacks);
            warn!(error = %e, "could not record delivered callbacks; they are sent again");
        }
        for Tried { id, attempts, sent } in tried {
            let Err(failed) = sent else { continue };
            self.metrics.callback_failed(failed.why);
            let (delay, max_age) = (backoff(attempts), self.settings.max_age);
            match callbacks::failed(store, id, &failed.error, delay, max_age).await {
                Ok(true) => warn!(callback = id, error = %failed.error, "a callback was given up on"),
                Ok(false) => debug!(callback = id, error = %failed.error, "a callback failed; tried again later"),
                Err(e) => {
                    self.metrics.database_error(DatabaseOperation::Callbacks);
                    warn!(error = %e, "could not record a failed callback");
                }
            }
        }
    }

    /// One POST, signed.
    async fn post(&self, callback: &DueCallback) -> Result<(), Failed> {
        let body = Bytes::from(callback_body(callback).to_string());
        let id = format!("evt_{}_{}", self.installation_tag, callback.id);
        let timestamp = chrono::Utc::now().timestamp().to_string();
        let signature = self.settings.secret.signature(&id, &timestamp, &body);
        let headers = [
            ("content-type".to_owned(), "application/json".to_owned()),
            ("webhook-id".to_owned(), id),
            ("webhook-timestamp".to_owned(), timestamp),
            ("webhook-signature".to_owned(), signature),
        ];
        let path = match self.settings.url.query() {
            Some(query) => format!("{}?{query}", self.settings.url.path()),
            None => self.settings.url.path().to_owned(),
        };
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        match self.origin.send("POST", &path, &headers, body, deadline).await {
            Ok(answer) if (200..300).contains(&answer.status) => Ok(()),
            Ok(answer) => Err(Failed {
                why: CallbackFailure::Refused,
                error: format!("the endpoint answered {}", answer.status),
            }),
            Err(e) => Err(Failed {
                why: CallbackFailure::Unreachable,
                error: e.to_string(),
            }),
        }
    }
}

/// The wait before the next try of a callback tried `attempts` times before: 1 s, doubling,
/// at most [`MAX_BACKOFF`].
fn backoff(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.clamp(0, 20)).unwrap_or(20);
    Duration::from_secs(1u64 << doublings).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_second_up_to_ten_minutes() {
        let waits: Vec<u64> = [0, 1, 2, 9, 10, 1000].map(|n| backoff(n).as_secs()).to_vec();
        assert_eq!(waits, [1, 2, 4, 512, 600, 600]);
    }
}
