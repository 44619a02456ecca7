//! Whether notifications come back: now and then the dispatcher sends one on
//! `store::CHECK_CHANNEL` and waits for it on its LISTEN connection. Through a transaction
//! pooler it never arrives; then commits are found by a short poll instead, the gauge
//! `outbox_notifications_working` says 0, and one warning says why and what to set.

use std::time::Duration;

use crate::store::Store;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::floor::Heard;
use crate::store;
use crate::telemetry::metrics::{DatabaseOperation, Metrics};

/// The wait between claims while notifications do not come back.
pub(super) const FALLBACK_POLL: Duration = Duration::from_secs(2);
/// How often a check is sent.
const CHECK_EVERY: Duration = Duration::from_secs(60);
/// How long a check may take to come back before notifications count as not working.
const CHECK_WAIT: Duration = Duration::from_secs(5);
/// How long sending a check may take.
const SEND_WAIT: Duration = Duration::from_millis(500);

pub(super) struct NotificationCheck {
    /// Where checks are sent from: the dispatcher's own pool, as producers' commits are.
    pool: Store,
    working: bool,
    /// The check on its way, and when it was sent.
    sent: Option<(String, Instant)>,
    next_send: Instant,
    /// Said once, not at every check.
    warned: bool,
}

impl NotificationCheck {
    /// A check whose first notification goes out at once; `working` is what the check at
    /// start found.
    pub fn new(pool: Store, working: bool) -> Self {
        Self {
            pool,
            working,
            sent: None,
            next_send: Instant::now(),
            warned: !working,
        }
    }

    pub fn working(&self) -> bool {
        self.working
    }

    /// When the next step is due: a check to send, or the one sent to give up on.
    pub fn next_step(&self) -> Instant {
        match &self.sent {
            Some((_, at)) => *at + CHECK_WAIT,
            None => self.next_send,
        }
    }

    /// Sends the next check, or gives up on the one sent.
    pub async fn step(&mut self, metrics: &Metrics) {
        if self.sent.take().is_some() {
            self.set(false, metrics);
            self.next_send = Instant::now() + CHECK_EVERY;
            return;
        }
        let token = Uuid::new_v4();
        // Bounded: the wait it runs in must not stall on a database that is away (a pool
        // waits 10 s for a connection), and what the database's absence does is another
        // check's to say.
        match tokio::time::timeout(SEND_WAIT, store::send_check(&self.pool, token)).await {
            Ok(Ok(())) => self.sent = Some((token.to_string(), Instant::now())),
            Ok(Err(e)) => {
                metrics.database_error(DatabaseOperation::Listen);
                debug!(error = %e, "could not send the notification check; trying again later");
                self.next_send = Instant::now() + CHECK_EVERY;
            }
            Err(_) => self.next_send = Instant::now() + CHECK_EVERY,
        }
    }

    /// What the LISTEN connection heard: the check on its way, perhaps.
    pub fn heard(&mut self, heard: &Heard, metrics: &Metrics) {
        let back = matches!(&self.sent, Some((token, _)) if heard.checks.contains(token));
        if back {
            self.sent = None;
            self.next_send = Instant::now() + CHECK_EVERY;
            self.set(true, metrics);
        }
    }

    fn set(&mut self, working: bool, metrics: &Metrics) {
        metrics.notifications_working(working);
        if working && !self.working {
            info!("notifications come back again; polling at the poll interval");
        } else if !working && !self.warned {
            warn!(
                "notifications do not come back on the LISTEN connection (a transaction pooler in the way?): polling every 2s; set OUTBOXD_LISTEN_DATABASE_URL to a direct connection for LISTEN"
            );
        }
        self.warned |= !working;
        self.working = working;
    }
}
