//! Waiting for a condition, never a fixed sleep, and reading a metric.

use std::time::{Duration, Instant};

use super::http_get;

/// The value of one series (`name{labels}` exactly as exposed) in a `/metrics` body.
pub fn metric_value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until `GET path` at `addr` answers 200, at most a minute: `what` is ready.
pub async fn until_ready(addr: &str, path: &str, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        http_get(addr, path).await.0 == 200
    })
    .await;
}

/// Polls `check` until it holds, or panics after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(within, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Polls `check` until it returns a value, and returns it; panics after `within`.
pub async fn poll_until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`poll_until`] for a synchronous check, outside an async test.
pub fn poll_until_blocking<T>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
