//! Sending: SMTP over a pool of connections driven by lettre's SMTP client, or nothing at
//! all when no SMTP server is configured. Classifies every failure; never touches the
//! database.

mod connection;
mod corked;
mod pool;
mod relays;
mod reply;
mod ses;
mod settings;
mod target;

use lettre::address::Envelope;

use crate::message::{Delivery, FailureType, Lane};
pub use reply::Reply;
pub use settings::{BadRelay, SmtpSettings};

/// Why a send failed. The dispatcher branches on this: a rejection dead-letters, a
/// deferral is retried, and an unreachable server may be an outage that is nobody's fault.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// A 5xx reply: this message will never be accepted as it is.
    #[error("SMTP server rejected the message: {reply}")]
    Rejected {
        reply: Reply,
        /// The recipient the reply was about: the one whose RCPT it answered, or the only
        /// one of the envelope.
        recipient: Option<String>,
    },
    /// A 4xx reply, or a reply outboxd could not make sense of.
    #[error("SMTP server deferred the message: {reply}")]
    Deferred { reply: Reply },
    /// No conversation with the server, or it ended before the server took the message:
    /// refused, reset, timed out, or TLS failed. Nothing was delivered.
    #[error("SMTP server unreachable: {0}")]
    Unreachable(String),
    /// The server had the whole message when the connection failed or its reply did not
    /// come in time: it may deliver it.
    #[error("SMTP outcome unknown: {0}")]
    Ambiguous(String),
}

impl SendError {
    /// A deferral with outboxd's own reason: no reply said it.
    pub(crate) fn deferred(reason: impl Into<String>) -> Self {
        SendError::Deferred {
            reply: Reply::own(reason),
        }
    }

    pub fn failure_type(&self) -> FailureType {
        match self {
            SendError::Rejected { .. } => FailureType::Permanent,
            SendError::Deferred { .. } | SendError::Unreachable(_) => FailureType::Transient,
            SendError::Ambiguous(_) => FailureType::Ambiguous,
        }
    }

    /// A short, stable name for grouping dead letters, stored as `error_class`:
    /// `smtp_550`, `unreachable`, ...
    pub fn error_class(&self) -> String {
        match self {
            SendError::Rejected { reply, .. } | SendError::Deferred { reply } => reply
                .code
                .map_or_else(|| "smtp_error".to_owned(), |c| format!("smtp_{c}")),
            SendError::Unreachable(_) => "unreachable".to_owned(),
            SendError::Ambiguous(_) => "ambiguous".to_owned(),
        }
    }

    /// Whether the relay said it is throttling us ([`Reply::is_throttling`]). Not the
    /// message's failure: it is released without an attempt and the pace is cut.
    pub fn is_throttling(&self) -> bool {
        matches!(self, SendError::Deferred { reply } if reply.is_throttling())
    }

    /// The recipient a permanent reply said does not exist ([`Reply::says_mailbox_unknown`]):
    /// the one to add to the suppression list.
    pub fn unknown_recipient(&self) -> Option<&str> {
        match self {
            SendError::Rejected {
                reply,
                recipient: Some(recipient),
            } if reply.says_mailbox_unknown() => Some(recipient),
            _ => None,
        }
    }

    /// Names the recipient of a rejection that does not name one yet.
    #[must_use]
    fn about(mut self, to: &lettre::Address) -> Self {
        if let SendError::Rejected { recipient, .. } = &mut self
            && recipient.is_none()
        {
            *recipient = Some(to.to_string());
        }
        self
    }

    /// Whether the server answered or took the message, which tells a message's own
    /// failure from an outage.
    pub fn reached_server(&self) -> bool {
        !matches!(self, SendError::Unreachable(_))
    }

    fn from_lettre(error: &lettre::transport::smtp::Error) -> Self {
        let reply = Reply::from_lettre(error);
        // An authentication failure fails every message alike: the server is unusable to
        // us, which is an outage to wait out, not a reason to dead-letter the message.
        let auth_failure = reply
            .as_ref()
            .and_then(|reply| reply.code)
            .is_some_and(|code| matches!(code, 530 | 534 | 535 | 538));
        match reply {
            Some(reply) if auth_failure => SendError::Unreachable(reply.to_string()),
            Some(reply) if error.is_permanent() => SendError::Rejected {
                reply,
                recipient: None,
            },
            Some(reply) => SendError::Deferred { reply },
            None if error.is_response() || error.is_client() => {
                SendError::deferred(error.to_string())
            }
            None => SendError::Unreachable(error.to_string()),
        }
    }
}

/// The longest acceptance reply kept.
const MAX_REPLY_CHARS: usize = 500;

/// The server's reply accepting a message (`250 2.0.0 Ok: queued as 4XyZ`), its lines
/// joined: the queue id in it is what a provider's support looks the message up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted(pub String);

impl From<&lettre::transport::smtp::response::Response> for Accepted {
    fn from(reply: &lettre::transport::smtp::response::Response) -> Self {
        let lines: Vec<&str> = reply.message().collect();
        let text = format!("{} {}", reply.code(), lines.join(" "));
        Self(crate::text::storable(text.trim_end(), MAX_REPLY_CHARS))
    }
}

/// A message that left: how, the server's reply when there was one, and the relay that
/// took it (`host:port`), and whether that was a fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub via: Delivery,
    pub reply: Option<Accepted>,
    pub relay: Option<String>,
    pub fallback: bool,
}

/// Where rendered messages go.
pub enum Mailer {
    Smtp(Box<SmtpMailer>),
    /// Development mode: messages are logged and reported as delivered.
    Disabled,
}

/// One relay as it stands: the lane whose relays it is, its name, and whether it is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayState {
    pub lane: Lane,
    pub relay: String,
    pub up: bool,
}

impl Mailer {
    pub fn new(settings: Option<SmtpSettings>) -> Result<Self, BadRelay> {
        match settings {
            None => Ok(Mailer::Disabled),
            Some(settings) => SmtpMailer::new(&settings).map(|smtp| Mailer::Smtp(Box::new(smtp))),
        }
    }

    /// The lane whose relays send a lane's mail: the bulk lane's own with
    /// `OUTBOXD_BULK_SMTP_URL`, else the transactional lane's. Each route has its own
    /// circuit.
    pub fn route(&self, lane: Lane) -> Lane {
        match self {
            Mailer::Smtp(smtp) if lane == Lane::Bulk && smtp.bulk.is_some() => Lane::Bulk,
            _ => Lane::Transactional,
        }
    }

    /// Every route, the transactional one first.
    pub fn routes(&self) -> Vec<Lane> {
        match self {
            Mailer::Smtp(smtp) if smtp.bulk.is_some() => vec![Lane::Transactional, Lane::Bulk],
            _ => vec![Lane::Transactional],
        }
    }

    /// Sends an email of a lane's to the envelope's recipients, through the lane's relays.
    pub async fn send(&self, lane: Lane, envelope: &Envelope, email: &[u8]) -> Result<Sent, SendError> {
        match self {
            Mailer::Smtp(smtp) => smtp.relays(lane).send(envelope, email).await.map(|handed| Sent {
                via: Delivery::Smtp,
                reply: Some(handed.accepted),
                relay: Some(handed.relay),
                fallback: handed.fallback,
            }),
            Mailer::Disabled => Ok(Sent {
                via: Delivery::LoggedOnly,
                reply: None,
                relay: None,
                fallback: false,
            }),
        }
    }

    /// Each relay of each route and whether it is up now, in the order they are tried.
    pub fn relays(&self) -> Vec<RelayState> {
        let Mailer::Smtp(smtp) = self else {
            return Vec::new();
        };
        self.routes()
            .into_iter()
            .flat_map(|lane| {
                smtp.relays(lane).iter().map(move |relay| RelayState {
                    lane,
                    relay: relay.label().to_owned(),
                    up: relay.is_up(),
                })
            })
            .collect()
    }

    /// Whether a route's relays take a connection now; used to close its circuit breaker.
    pub async fn probe(&self, route: Lane) -> Result<(), SendError> {
        match self {
            Mailer::Smtp(smtp) => smtp.relays(route).probe().await,
            Mailer::Disabled => Ok(()),
        }
    }

    /// Whether some relay of a route is up, as the relays' own probers last found: no
    /// probe, no wait.
    pub fn route_is_up(&self, route: Lane) -> bool {
        match self {
            Mailer::Smtp(smtp) => smtp.relays(route).iter().any(|relay| relay.is_up()),
            Mailer::Disabled => true,
        }
    }

    /// Each relay's route and name, and whether it answers a probe now, in order: `outboxd
    /// doctor`.
    pub async fn probe_each(&self) -> Vec<(Lane, String, Result<(), SendError>)> {
        let Mailer::Smtp(smtp) = self else {
            return Vec::new();
        };
        let mut answers = Vec::new();
        for lane in self.routes() {
            for (relay, answer) in smtp.relays(lane).probe_each().await {
                answers.push((lane, relay, answer));
            }
        }
        answers
    }

    pub fn is_enabled(&self) -> bool {
        matches!(self, Mailer::Smtp(_))
    }

    /// Says QUIT on pooled connections.
    pub async fn shutdown(&self) {
        if let Mailer::Smtp(smtp) = self {
            smtp.transactional.close().await;
            if let Some(bulk) = &smtp.bulk {
                bulk.close().await;
            }
        }
    }
}

/// Pooled SMTP clients, one pool per relay: the transactional lane's relays, and the bulk
/// lane's when it has its own.
pub struct SmtpMailer {
    transactional: relays::Relays,
    bulk: Option<relays::Relays>,
}

impl SmtpMailer {
    fn new(settings: &SmtpSettings) -> Result<Self, BadRelay> {
        let relays_of = |lane| -> Result<Option<relays::Relays>, BadRelay> {
            let targets = settings.targets(lane)?;
            if targets.is_empty() {
                return Ok(None);
            }
            let ca = settings.ca_certificates.as_deref();
            let relays = targets
                .into_iter()
                .enumerate()
                .map(|(place, target)| {
                    relays::Relay::new(target, settings.pool_size, settings.timeout, ca)
                        .map_err(|problem| BadRelay { lane, place, problem })
                })
                .collect::<Result<_, _>>()?;
            Ok(Some(relays::Relays::new(relays, settings.timeout)))
        };
        let transactional = relays_of(Lane::Transactional)?.ok_or_else(|| BadRelay {
            lane: Lane::Transactional,
            place: 0,
            problem: "no relay".to_owned(),
        })?;
        Ok(Self {
            transactional,
            bulk: relays_of(Lane::Bulk)?,
        })
    }

    fn relays(&self, lane: Lane) -> &relays::Relays {
        match (lane, &self.bulk) {
            (Lane::Bulk, Some(bulk)) => bulk,
            _ => &self.transactional,
        }
    }
}
