//! Bounces that come back later: with `OUTBOXD_BOUNCE_DOMAIN`, each email's envelope sender
//! is its own signed return path (`message::ReturnPaths`), and the delivery status
//! notifications (RFC 3464) a relay or a receiving domain sends there, hours later, reach
//! outboxd's own SMTP listener (`OUTBOXD_BOUNCE_LISTEN`). A hard bounce suppresses its
//! recipient and shows on its message's timeline, as the webhooks' do.
//!
//! - [`listener`]: the accept loop, bounded in connections;
//! - [`session`]: one SMTP conversation, bounded in lines, size, time and mistakes, that
//!   takes mail for the bounce domain only;
//! - [`intake`]: what a message taken comes to: forged, not a bounce, or recorded;
//! - [`dsn`]: the RFC 3464 report read from the bytes.

mod dsn;
mod intake;
mod listener;
mod session;

use std::net::SocketAddr;

use secrecy::SecretString;

use crate::text::debug_showing_only;
pub use intake::Intake;
pub use listener::spawn;

/// The bounce settings, checked before anything starts.
#[derive(Clone)]
pub struct BounceSettings {
    /// The return paths' domain, whose MX (or a relay's transport) points at the listener.
    pub domain: String,
    /// Where the listener takes DSNs; `None` when another replica or process does.
    pub listen: Option<SocketAddr>,
    /// Signs the return paths: one or more, comma-separated; the first signs.
    pub secrets: SecretString,
}

debug_showing_only!(BounceSettings as settings { domain, listen, secrets = "***" });
