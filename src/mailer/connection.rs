//! One SMTP session, on a socket of our own with Nagle's algorithm off.
//!
//! lettre (0.11.23) writes a message's body and its terminating `\r\n.\r\n` as two writes on
//! a socket without `TCP_NODELAY`, so every message waits for the server's delayed ACK:
//! about 40 ms, which capped a connection at ~23 messages a second (fixed upstream in lettre
//! PR #1159, not yet released). So outboxd opens the TCP connection itself, sets
//! `TCP_NODELAY`, and hands it to lettre's SMTP client, which still speaks the protocol,
//! STARTTLS and AUTH. Implicit TLS (`smtps://`) is connected by lettre and keeps the stall.
//!
//! Where the server offers PIPELINING (RFC 2920), MAIL, RCPT and DATA go out in one write
//! and their replies are read together: two round trips per message instead of four, which
//! is most of a message's time on a fast link and all of it on a slow one. Writes are also
//! held until the client waits for a reply ([`Corked`]), so a message's body and its final
//! dot leave in one packet.

use std::io;
use std::time::Duration;

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::Mechanism;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::commands::{Data, Ehlo, Mail, Rcpt};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter};
use tokio::net::TcpStream;

use super::corked::Corked;
use super::target::{PLAINTEXT_AUTH_REFUSED, Security, Target};
use super::{Accepted, SendError};

/// How far a transaction got when it failed.
#[derive(Debug)]
pub(super) enum TransactionError {
    /// The server answered with an error, before or after the message, or the message
    /// cannot go to this server: it does not have it.
    Refused(SendError),
    /// The connection failed before the server accepted MAIL: nothing was delivered, and
    /// the server may be down (or a pooled connection went stale).
    Lost(lettre::transport::smtp::Error),
    /// The connection failed after the message was handed over, before the server said
    /// whether it took it: it may be delivered.
    Ambiguous(lettre::transport::smtp::Error),
}

/// An open SMTP session, and whether its server takes pipelined commands.
pub(super) struct Connection {
    pub(super) smtp: AsyncSmtpConnection,
    pipelining: bool,
    /// The current transaction's message has been (or is being) written: a failure or a
    /// timeout from here on leaves its fate unknown.
    pub(super) message_handed_over: bool,
    /// The server accepted the current transaction's MAIL: it is up and talking, so a
    /// failure from here on is the message's own.
    pub(super) mail_accepted: bool,
    /// The same socket, non-blocking, for [`Connection::closed_by_server`]; `None` where
    /// lettre opened the socket itself (`smtps://`).
    watch: Option<std::net::TcpStream>,
}

impl Connection {
    /// One message: MAIL, RCPT and DATA (in one write where the server offers PIPELINING),
    /// then the message; the server's reply accepting it. Says how far it got when it
    /// fails; after any failure the session is left, as lettre does, rather than guess where
    /// it stands.
    pub(super) async fn send(
        &mut self,
        envelope: &Envelope,
        body: &[u8],
    ) -> Result<Accepted, TransactionError> {
        self.message_handed_over = false;
        self.mail_accepted = false;
        // After a failure the connection is dropped, not told QUIT: a server slow to answer
        // it must not turn a refusal into a timeout.
        let parameters = self
            .mail_parameters(envelope, body)
            .map_err(|reason| TransactionError::Refused(SendError::deferred(reason)))?;
        let mail = Mail::new(envelope.from().cloned(), parameters);
        let recipients = envelope
            .to()
            .iter()
            .map(|to| Rcpt::new(to.clone(), Vec::new()));
        if self.pipelining {
            let mut group = mail.to_string();
            for rcpt in recipients {
                group.push_str(&rcpt.to_string());
            }
            group.push_str(&Data.to_string());
            // The reply to MAIL, then one per RCPT, then DATA's 354.
            let mail_reply = self.smtp.command(&group).await;
            mail_reply.map_err(|e| before_message(e, false))?;
            self.mail_accepted = true;
            for to in envelope.to() {
                let reply = self.smtp.read_response().await;
                reply.map_err(|e| refused_recipient(before_message(e, true), to))?;
            }
            let reply = self.smtp.read_response().await;
            reply.map_err(|e| before_message(e, true))?;
        } else {
            let mail_reply = self.smtp.command(mail).await;
            mail_reply.map_err(|e| before_message(e, false))?;
            self.mail_accepted = true;
            for (rcpt, to) in recipients.zip(envelope.to()) {
                let reply = self.smtp.command(rcpt).await;
                reply.map_err(|e| refused_recipient(before_message(e, true), to))?;
            }
            let reply = self.smtp.command(Data).await;
            reply.map_err(|e| before_message(e, true))?;
        }
        self.hand_over(envelope, body).await
    }

    /// The message's data, once the server has accepted DATA.
    async fn hand_over(
        &mut self,
        envelope: &Envelope,
        body: &[u8],
    ) -> Result<Accepted, TransactionError> {
        // From here the server may end up with the whole message, whatever happens next.
        self.message_handed_over = true;
        // A refusal of the message's data is about its recipient when it has only one (some
        // servers check recipients only then); never a refusal of MAIL.
        self.smtp
            .message(body)
            .await
            .map(|reply| Accepted::from(&reply))
            .map_err(|e| {
                if e.status().is_some() {
                    let refused = SendError::from_lettre(&e);
                    TransactionError::Refused(match envelope.to() {
                        [only] => refused.about(only),
                        _ => refused,
                    })
                } else {
                    TransactionError::Ambiguous(e)
                }
            })
    }

    /// SMTPUTF8 and 8BITMIME where the envelope or the body needs them, as lettre's own
    /// `send` negotiates them.
    fn mail_parameters(
        &self,
        envelope: &Envelope,
        body: &[u8],
    ) -> Result<Vec<MailParameter>, String> {
        let mut parameters = Vec::new();
        let info = self.smtp.server_info();
        let non_ascii_address = envelope
            .from()
            .into_iter()
            .chain(envelope.to())
            .any(|address| !AsRef::<str>::as_ref(address).is_ascii());
        if non_ascii_address {
            if !info.supports_feature(Extension::SmtpUtfEight) {
                return Err(
                    "the envelope has non-ASCII addresses but the server does not support SMTPUTF8"
                        .to_owned(),
                );
            }
            parameters.push(MailParameter::SmtpUtfEight);
        }
        if !body.is_ascii() {
            if !info.supports_feature(Extension::EightBitMime) {
                return Err(
                    "the message has non-ASCII bytes but the server does not support 8BITMIME"
                        .to_owned(),
                );
            }
            parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        Ok(parameters)
    }

    pub(super) fn has_broken(&self) -> bool {
        self.smtp.has_broken()
    }

    /// Whether the server closed the connection (or said something, which on an idle SMTP
    /// connection is a goodbye such as `421`) while it sat in the pool. Servers drop idle
    /// clients and restart; a send on such a connection would fail and cost an attempt.
    pub(super) fn closed_by_server(&self) -> bool {
        self.watch.as_ref().is_some_and(|socket| {
            !matches!(socket.peek(&mut [0; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        })
    }

    /// A new connection: TCP with `TCP_NODELAY`, EHLO, STARTTLS and AUTH as configured, all
    /// within the timeout.
    pub(super) async fn connect(target: &Target, timeout: Duration) -> Result<Self, SendError> {
        match tokio::time::timeout(timeout, Self::open(target, timeout)).await {
            Ok(result) => result,
            Err(_) => Err(SendError::Unreachable(format!(
                "no connection within {}",
                humantime::format_duration(timeout)
            ))),
        }
    }

    async fn open(target: &Target, timeout: Duration) -> Result<Self, SendError> {
        let (mut smtp, watch) = if target.security == Security::Wrapper {
            let tls = target.tls().map_err(lettre_error)?;
            let smtp = AsyncSmtpConnection::connect_tokio1(
                (target.host.as_str(), target.port),
                Some(timeout),
                &target.hello,
                Some(tls),
                None,
            )
            .await
            .map_err(lettre_error)?;
            (smtp, None)
        } else {
            let (smtp, watch) = open_own_socket(target).await?;
            (smtp, Some(watch))
        };
        // lettre keeps only the EHLO keywords it uses itself, so ask again for PIPELINING,
        // once per connection, before AUTH (after it, some servers would forget the login).
        let pipelining = smtp
            .command(Ehlo::new(target.hello.clone()))
            .await
            .map_err(lettre_error)?
            .message()
            .any(|line| {
                line.split_ascii_whitespace()
                    .next()
                    .is_some_and(|keyword| keyword.eq_ignore_ascii_case("PIPELINING"))
            });
        if let Some(credentials) = &target.credentials {
            if !smtp.is_encrypted() && !target.plaintext_auth_allowed {
                return Err(SendError::Unreachable(format!(
                    "the server offers no STARTTLS: {PLAINTEXT_AUTH_REFUSED}"
                )));
            }
            smtp.auth(&[Mechanism::Plain, Mechanism::Login], credentials)
                .await
                .map_err(lettre_error)?;
        }
        Ok(Connection {
            smtp,
            pipelining,
            message_handed_over: false,
            mail_accepted: false,
            watch,
        })
    }
}

/// How a command before the message's data failed. A reply with a code is the server's
/// answer; anything else (lettre reports the connection closing as an "incomplete
/// response") is the connection failing: before the server accepted MAIL an outage (or a
/// stale pooled connection), after it this message's own failure, which costs it an
/// attempt so that it cannot loop forever.
fn before_message(e: lettre::transport::smtp::Error, mail_accepted: bool) -> TransactionError {
    if e.status().is_some() || e.is_client() {
        TransactionError::Refused(SendError::from_lettre(&e))
    } else if mail_accepted {
        TransactionError::Refused(SendError::deferred(format!(
            "the connection failed during the transaction: {e}"
        )))
    } else {
        TransactionError::Lost(e)
    }
}

/// A refused RCPT is about its recipient.
fn refused_recipient(error: TransactionError, to: &lettre::Address) -> TransactionError {
    match error {
        TransactionError::Refused(e) => TransactionError::Refused(e.about(to)),
        other => other,
    }
}

fn lettre_error(error: lettre::transport::smtp::Error) -> SendError {
    SendError::from_lettre(&error)
}

/// TCP with `TCP_NODELAY` and held writes, the greeting, and STARTTLS as configured; also
/// returns a second handle on the socket, to see while the connection is idle whether the
/// server has closed it.
async fn open_own_socket(
    target: &Target,
) -> Result<(AsyncSmtpConnection, std::net::TcpStream), SendError> {
    let socket_error =
        |what: &'static str| move |e: io::Error| SendError::Unreachable(format!("{what}: {e}"));
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(socket_error("cannot connect"))?;
    tcp.set_nodelay(true)
        .map_err(socket_error("cannot set TCP_NODELAY"))?;
    let std = tcp
        .into_std()
        .map_err(socket_error("cannot watch the socket"))?;
    let watch = std
        .try_clone()
        .map_err(socket_error("cannot watch the socket"))?;
    let tcp = TcpStream::from_std(std).map_err(socket_error("cannot watch the socket"))?;
    let mut smtp =
        AsyncSmtpConnection::connect_with_transport(Box::new(Corked::new(tcp)), &target.hello)
            .await
            .map_err(lettre_error)?;
    let starttls = match target.security {
        Security::Required => true,
        Security::Opportunistic => smtp.can_starttls(),
        Security::None | Security::Wrapper => false,
    };
    if starttls {
        let tls = target.tls().map_err(lettre_error)?;
        smtp.starttls(tls, &target.hello)
            .await
            .map_err(|e| SendError::Unreachable(format!("STARTTLS failed: {e}")))?;
    }
    Ok((smtp, watch))
}
