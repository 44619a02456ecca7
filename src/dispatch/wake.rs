//! What ends the dispatcher's wait between drains: a notification from the insert trigger
//! (LISTEN/NOTIFY), the poll interval, or the end of a back-off; and shutdown, always.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use sqlx::postgres::PgListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::claimer::Listen;
use super::floor::{ClaimFloor, Heard};
use super::notification_check::{FALLBACK_POLL, NotificationCheck};
use crate::message::RetryPolicy;
use crate::store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// How quickly the dispatcher comes back after the SMTP server or the database failed.
pub(super) const OUTAGE_BACKOFF: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    base: Duration::from_secs(1),
    max: Duration::from_secs(60),
};

/// How long past the linger its reply may take before the listening connection is given
/// up as hung.
const LINGER_GRACE: Duration = Duration::from_secs(5);
/// The most due times a replica keeps: the soonest, which are those it wakes for next.
const MAX_DUE_TIMES: usize = 1024;
/// How long after a row's due time the loop looks for it: the database's clock stamped
/// it a moment after this replica decided it (a retry), or this replica's clock may lag
/// the database's by a little (a `not_before`).
const DUE_SLACK: Duration = Duration::from_millis(100);

/// The dedicated LISTEN connection, reconnected whenever it is lost.
pub(super) struct Wakeups {
    /// Where to listen; nowhere past a transaction pooler.
    pool: Option<Store>,
    /// The dispatcher's store, whose statements the linger sends on the listener.
    store: Store,
    metrics: Arc<Metrics>,
    listener: Option<PgListener>,
    /// A linger cut short is warned of once: a `statement_timeout` would cut every one.
    cut_short_warned: bool,
    /// Whether a notification sent comes back.
    check: NotificationCheck,
    /// When rows this replica knows of fall due (retries it wrote, `not_before` rows it
    /// was told of), soonest first: each wait ends at the next, not at the poll interval.
    due: std::collections::BTreeSet<Instant>,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// Something may be due: look.
    Look,
    /// A notification: something was just committed.
    Heard,
    /// Shutting down.
    Stopped,
}

impl Wakeups {
    /// Listens on `listen`; checks that notifications come back by sending them through
    /// `send`, the dispatcher's own pool.
    pub fn new(listen: &Listen, send: Store, metrics: Arc<Metrics>) -> Self {
        Self {
            pool: listen.pool.clone(),
            store: send.clone(),
            check: NotificationCheck::new(send, listen.pool.is_some()),
            metrics,
            listener: None,
            cut_short_warned: false,
            due: std::collections::BTreeSet::new(),
        }
    }

    /// A row falls due at `due`: wake then. At most [`MAX_DUE_TIMES`] are kept, the
    /// soonest; past them the poll interval stands in.
    pub fn expect(&mut self, due: Instant) {
        self.due.insert(due + DUE_SLACK);
        while self.due.len() > MAX_DUE_TIMES {
            self.due.pop_last();
        }
    }

    /// How long until the soonest row known falls due; zero, once, when one fell due since
    /// the last look began (`looked`), so that a drain looks for it; `None` when none is.
    pub fn until_due(&mut self, looked: Instant) -> Option<Duration> {
        let now = Instant::now();
        let passed: Vec<Instant> = self.due.range(..=now).copied().collect();
        for due in &passed {
            self.due.remove(due);
        }
        if passed.iter().any(|due| *due > looked) {
            return Some(Duration::ZERO);
        }
        self.due.first().map(|due| *due - now)
    }

    /// What notifications said: the floor hears every due time, the wait those still to
    /// come.
    fn heard(&mut self, heard: Heard, floor: &mut ClaimFloor) {
        let (now, utc_now) = (Instant::now(), chrono::Utc::now());
        for later in &heard.later {
            self.expect(now + (*later - utc_now).to_std().unwrap_or_default());
        }
        floor.heard(heard);
    }

    /// The longest wait between claims: the poll interval, or the fallback poll while
    /// notifications do not come back.
    pub fn poll_interval(&self, configured: Duration) -> Duration {
        if self.check.working() {
            configured
        } else {
            configured.min(FALLBACK_POLL)
        }
    }

    /// Listens, if not listening yet. Call before looking for due rows, so that nothing
    /// committed meanwhile goes unnoticed; when it fails, the poll interval stands in.
    pub async fn listen(&mut self, floor: &mut ClaimFloor) {
        let Some(pool) = self.pool.as_ref().filter(|_| self.listener.is_none()) else {
            return;
        };
        match store::listen(pool).await {
            Ok(listener) => {
                self.listener = Some(listener);
                floor.listening(true);
            }
            Err(e) => {
                self.metrics.database_error(DatabaseOperation::Listen);
                warn!(error = %e, "cannot LISTEN for new messages; polling meanwhile");
            }
        }
    }

    /// Waits for `wait`, or for shutdown; when `notified` is set, a notification ends the
    /// wait too. Notifications are read either way, so that what they say lowers the
    /// claim's floor even while the loop waits for the pace or a back-off.
    pub async fn wait(
        &mut self,
        wait: Duration,
        notified: bool,
        stop: &CancellationToken,
        floor: &mut ClaimFloor,
    ) -> Woken {
        let timer = tokio::time::sleep(wait);
        tokio::pin!(timer);
        loop {
            let check_due = self.check.next_step();
            tokio::select! {
                biased;
                () = stop.cancelled() => return Woken::Stopped,
                woke = next_notifications(&mut self.listener), if self.listener.is_some() => {
                    match woke {
                        Ok(heard) => {
                            self.check.heard(&heard, &self.metrics);
                            let new = heard.of_messages();
                            self.heard(heard, floor);
                            if notified && new {
                                return Woken::Heard;
                            }
                        }
                        Err(e) => self.lost(&e, floor),
                    }
                }
                () = tokio::time::sleep_until(check_due), if self.listener.is_some() => {
                    self.check.step(&self.metrics).await;
                }
                () = &mut timer => return Woken::Look,
            }
        }
    }

    /// Lets what is committed in the next `linger` join the batch about to be claimed. The
    /// wait runs on the listening connection: PostgreSQL holds notifications back while a
    /// session runs a command and sends them together at its end, so however many
    /// messages arrive, the wait costs one wake-up, and the floor still hears of each.
    pub async fn linger(&mut self, linger: Duration, stop: &CancellationToken, floor: &mut ClaimFloor) {
        let Some(listener) = self.listener.as_mut().filter(|_| !linger.is_zero()) else {
            return;
        };
        let slept = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            slept = tokio::time::timeout(linger + LINGER_GRACE, store::linger(&self.store, listener, linger)) => slept,
        };
        match slept {
            Ok(Ok(())) => {}
            // Refused by the server (a `statement_timeout` shorter than the linger, a
            // cancel): the connection still listens, and what it heard counts.
            Ok(Err(e @ sqlx::Error::Database(_))) => {
                if !std::mem::replace(&mut self.cut_short_warned, true) {
                    warn!(error = %e, "the linger after a notification was cut short (a statement_timeout under OUTBOXD_LINGER?); not warning again");
                }
            }
            // The connection failed, or hangs: the poll interval must not depend on it.
            Ok(Err(e)) => return self.lost(&e, floor),
            Err(_) => return self.lost(&"no reply to the linger's pg_sleep", floor),
        }
        let mut heard = Heard::default();
        take_buffered(listener, &mut heard);
        self.check.heard(&heard, &self.metrics);
        self.heard(heard, floor);
    }

    /// The listening connection failed: listen again before the next look; meanwhile the
    /// floor cannot trust what it has heard.
    fn lost(&mut self, error: &dyn std::fmt::Display, floor: &mut ClaimFloor) {
        self.metrics.database_error(DatabaseOperation::Listen);
        warn!(error = %error, "lost the LISTEN connection; reconnecting");
        self.listener = None;
        floor.listening(false);
    }
}

/// Waits for a notification, then takes any others already buffered: one drain serves
/// them all.
async fn next_notifications(listener: &mut Option<PgListener>) -> Result<Heard, sqlx::Error> {
    let Some(listener) = listener.as_mut() else {
        return std::future::pending().await;
    };
    let mut heard = Heard::default();
    match listener.try_recv().await? {
        Some(first) => {
            heard.notification(first.channel(), first.payload());
            take_buffered(listener, &mut heard);
        }
        // The connection dropped (sqlx reconnects it) and notifications may have been
        // missed.
        None => heard.unknown = true,
    }
    Ok(heard)
}

/// Takes the notifications that arrived already, without waiting.
fn take_buffered(listener: &mut PgListener, heard: &mut Heard) {
    while let Some(next) = listener.next_buffered() {
        heard.notification(next.channel(), next.payload());
    }
}
