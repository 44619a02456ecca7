//! The relays a lane sends through, in order: the first that is up takes each message, and
//! a message moves on to the next only when its failure came before its data went (a
//! connection, greeting, TLS or AUTH failure, a 4xx or 421 before DATA), so that no relay
//! can have it. A failure after the handover is ambiguous: it is never sent elsewhere, and
//! is retried later as any other. A relay that could not be reached, or said 421, is down:
//! it is passed over (but the last, which is always tried, as a single relay always was)
//! and probed in the background every [`PROBE_EVERY`], whatever the traffic; traffic
//! returns to it when it answers. When none takes a message it is an outage, and the dispatcher's circuit opens.
//! docs/adr/0006-relay-failover.md says why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lettre::address::Envelope;
use tracing::{info, warn};

use super::pool::{Failure, Pool};
use super::ses::SesClient;
use super::settings::RelayTarget;
use super::{Accepted, SendError};
use crate::lock::lock;

/// How often a relay that is down is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How a relay is spoken to.
enum Transport {
    Smtp(Pool),
    Ses(SesClient),
}

impl Transport {
    async fn send_by(
        &self,
        envelope: &Envelope,
        body: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<Accepted, Failure> {
        match self {
            Transport::Smtp(pool) => pool.send_by(envelope, body, deadline).await,
            Transport::Ses(ses) => ses.send_by(envelope, body, deadline).await,
        }
    }

    async fn probe(&self) -> Result<(), SendError> {
        match self {
            Transport::Smtp(pool) => pool.probe().await,
            Transport::Ses(ses) => ses.probe().await,
        }
    }

    async fn close(&self) {
        match self {
            Transport::Smtp(pool) => pool.close().await,
            Transport::Ses(ses) => ses.close(),
        }
    }
}

/// One relay: how it is spoken to, and whether it is up.
pub struct Relay {
    label: String,
    transport: Transport,
    /// Shared by the send tasks, which mark it down, and its prober, which marks it up.
    up: AtomicBool,
    /// Whether its prober runs: shared by the send tasks (which start one) and the prober
    /// (which ends), under one lock, so that a relay marked down always has one.
    probing: std::sync::Mutex<bool>,
    /// Set at shutdown: its prober stops.
    closed: AtomicBool,
}

/// A message a relay accepted: its reply, and which relay (its place in the list, and its
/// name).
#[derive(Debug, Clone)]
pub struct Handed {
    pub accepted: Accepted,
    pub relay: String,
    pub fallback: bool,
}

impl Relay {
    /// `extra_ca`: PEM certificates trusted besides the public roots (an API endpoint's).
    pub fn new(
        target: RelayTarget,
        size: u32,
        timeout: Duration,
        extra_ca: Option<&[u8]>,
    ) -> Result<Self, String> {
        let (label, transport) = match target {
            RelayTarget::Smtp(target) => (target.label(), Transport::Smtp(Pool::new(target, size, timeout))),
            RelayTarget::Ses(target) => {
                let ses = SesClient::new(target, timeout, extra_ca)?;
                (ses.label(), Transport::Ses(ses))
            }
        };
        Ok(Self {
            label,
            transport,
            up: AtomicBool::new(true),
            probing: std::sync::Mutex::new(false),
            closed: AtomicBool::new(false),
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Marks it down, and starts its prober unless one runs.
    fn mark_down(self: &Arc<Self>, why: &SendError) {
        if self.up.swap(false, Ordering::AcqRel) {
            warn!(relay = %self.label, error = %crate::text::mask_addresses(&why.to_string()),
                  "relay down: probed every 5 s; meanwhile messages go to the next relay, if there is one");
        }
        let mut probing = lock(&self.probing);
        if !*probing {
            *probing = true;
            tokio::spawn(Arc::clone(self).probe_until_up());
        }
    }

    fn mark_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            info!(relay = %self.label, "relay answers again: traffic returns to it");
        }
    }

    /// Probes every [`PROBE_EVERY`] until it answers, whatever the traffic.
    async fn probe_until_up(self: Arc<Self>) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            {
                let mut probing = lock(&self.probing);
                if self.is_up() || self.closed.load(Ordering::Acquire) {
                    *probing = false;
                    return;
                }
            }
            if self.transport.probe().await.is_ok() {
                self.mark_up();
            }
        }
    }

    /// Whether it answers now (a connection and NOOP): marks it up or down.
    pub async fn probe(self: &Arc<Self>) -> Result<(), SendError> {
        let answered = self.transport.probe().await;
        match &answered {
            Ok(()) => self.mark_up(),
            Err(e) => self.mark_down(e),
        }
        answered
    }
}

/// A lane's relays, in the order they are tried.
pub struct Relays {
    relays: Vec<Arc<Relay>>,
    /// The longest one send may take, failing over included.
    longest_send: Duration,
}

impl Relays {
    pub fn new(relays: Vec<Relay>, timeout: Duration) -> Self {
        Self {
            relays: relays.into_iter().map(Arc::new).collect(),
            longest_send: timeout * 2,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Relay> {
        self.relays.iter().map(AsRef::as_ref)
    }

    /// Sends one message through the first relay that takes it, all within one send's
    /// bound (two send timeouts), so that the dispatcher's lease holds whatever happens.
    /// When none takes it, the answer is the first relay's that reached a server (a 4xx
    /// is the message's own failure), else that nothing could be reached.
    pub async fn send(&self, envelope: &Envelope, body: &[u8]) -> Result<Handed, SendError> {
        let deadline = tokio::time::Instant::now() + self.longest_send;
        let last = self.relays.len().saturating_sub(1);
        let mut failed: Option<SendError> = None;
        for (place, relay) in self.relays.iter().enumerate() {
            if !relay.is_up() && place < last {
                continue;
            }
            // A relay tried with less than one timeout left is not judged by its failure:
            // the shared bound cut it short, not the relay.
            let full_time =
                deadline.saturating_duration_since(tokio::time::Instant::now()) >= self.timeout();
            match relay.transport.send_by(envelope, body, deadline).await {
                Ok(accepted) => {
                    if place == last && !relay.is_up() {
                        relay.mark_up();
                    }
                    return Ok(Handed {
                        accepted,
                        relay: relay.label.clone(),
                        fallback: place > 0,
                    });
                }
                Err(Failure {
                    error,
                    before_data: true,
                }) if may_go_elsewhere(&error) => {
                    if full_time && relay_is_down(&error) {
                        relay.mark_down(&error);
                    }
                    if failed.as_ref().is_none_or(|first| !first.reached_server()) {
                        failed = Some(error);
                    }
                }
                Err(Failure { error, .. }) => return Err(error),
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        Err(failed.unwrap_or_else(|| SendError::Unreachable("every relay is down".to_owned())))
    }

    /// One send timeout.
    fn timeout(&self) -> Duration {
        self.longest_send / 2
    }

    /// Probes every relay (the dispatcher's circuit asks, while it is open); fine when one
    /// answers.
    pub async fn probe(&self) -> Result<(), SendError> {
        let mut failed = None;
        for relay in &self.relays {
            match relay.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => failed = Some(e),
            }
        }
        Err(failed.unwrap_or_else(|| SendError::Unreachable("no relay".to_owned())))
    }

    /// Probes each relay, for `outboxd doctor`: its name and whether it answered.
    pub async fn probe_each(&self) -> Vec<(String, Result<(), SendError>)> {
        let mut answers = Vec::with_capacity(self.relays.len());
        for relay in &self.relays {
            answers.push((relay.label.clone(), relay.transport.probe().await));
        }
        answers
    }

    /// Says QUIT on every relay's idle connections.
    pub async fn close(&self) {
        for relay in &self.relays {
            relay.closed.store(true, Ordering::Release);
            relay.transport.close().await;
        }
    }
}

/// Whether a failure before the data may go to the next relay: no conversation, or a 4xx
/// (a 5xx is a refusal for good, which another relay must not undo; a throttling reply cuts
/// the pace instead).
fn may_go_elsewhere(error: &SendError) -> bool {
    match error {
        SendError::Unreachable(_) => true,
        SendError::Deferred { .. } => !error.is_throttling(),
        _ => false,
    }
}

/// Whether a failure says the relay itself is unusable now, rather than this message's
/// transaction: no conversation, or a 421 (the service closing the channel).
fn relay_is_down(error: &SendError) -> bool {
    match error {
        SendError::Unreachable(_) => true,
        SendError::Deferred { reply } => reply.code == Some(421),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{may_go_elsewhere, relay_is_down};
    use crate::mailer::{Reply, SendError};

    fn deferred(code: u16, text: &str) -> SendError {
        SendError::Deferred {
            reply: Reply::new(code, text),
        }
    }

    #[test]
    fn only_a_failure_no_relay_can_have_acted_on_goes_elsewhere() {
        assert!(may_go_elsewhere(&SendError::Unreachable("refused".into())));
        assert!(may_go_elsewhere(&deferred(451, "4.3.0 try again later")));
        assert!(!may_go_elsewhere(&deferred(454, "4.7.0 Throttling failure: Maximum sending rate exceeded")));
        let refused = SendError::Rejected {
            reply: Reply::new(550, "5.1.1 no such user"),
            recipient: None,
        };
        assert!(!may_go_elsewhere(&refused), "a refusal for good stays one");
        assert!(!may_go_elsewhere(&SendError::Ambiguous("reset after DATA".into())));
    }

    #[test]
    fn a_relay_is_down_when_unreachable_or_closing_not_for_one_recipient() {
        assert!(relay_is_down(&SendError::Unreachable("refused".into())));
        assert!(relay_is_down(&deferred(421, "4.3.2 shutting down")));
        assert!(!relay_is_down(&deferred(451, "4.7.1 greylisted")));
    }
}
