//! A pool of SMTP connections with Nagle's algorithm off.
//!
//! lettre (0.11.23) writes a message's body and its terminating `\r\n.\r\n` as two writes on
//! a socket without `TCP_NODELAY`, so every message waits for the server's delayed ACK:
//! about 40 ms, which capped a connection at ~23 messages a second (lettre fixed this
//! upstream in PR #1159, not yet released). This pool opens the TCP connections itself, sets
//! `TCP_NODELAY`, and hands them to lettre's SMTP client, which still speaks the protocol,
//! STARTTLS and AUTH. Implicit TLS (`smtps://`) is connected by lettre and keeps the stall.
//!
//! Where the server offers PIPELINING (RFC 2920), MAIL, RCPT and DATA go out in one write
//! and their replies are read together: two round trips per message instead of four, which
//! is most of a message's time on a fast link and all of it on a slow one. Writes are also
//! held until the client waits for a reply ([`Corked`]), so a message's body and its final
//! dot leave in one packet.

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{
    AsyncSmtpConnection, AsyncTokioStream, Certificate, TlsParameters,
};
use lettre::transport::smtp::commands::{Data, Ehlo, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::SendError;

/// Idle connections older than this are closed rather than reused: servers drop idle
/// clients after a while, and a dead connection would fail a send.
const MAX_IDLE: Duration = Duration::from_secs(30);

/// How the connection is secured, as lettre's URL form says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// `smtp://host`: plain text.
    None,
    /// `smtp://host?tls=opportunistic`: STARTTLS when offered.
    Opportunistic,
    /// `smtp://host?tls=required`: STARTTLS or fail.
    Required,
    /// `smtps://host`: TLS from the first byte.
    Wrapper,
}

/// Where and how to connect, parsed from an `OUTBOXD_SMTP_URL`.
#[derive(Clone)]
pub struct Target {
    host: String,
    port: u16,
    security: Security,
    hello: ClientId,
    credentials: Option<Credentials>,
    /// PEM certificates trusted, besides the usual roots, for the server's certificate.
    extra_roots: Option<Vec<u8>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("credentials", &self.credentials.as_ref().map(|_| "***"))
            .field("extra_roots", &self.extra_roots.is_some())
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Parses lettre's URL form: `smtp://[user[:password]@]host[:port][/ehlo-name][?tls=required|opportunistic]`
    /// or `smtps://...`, with PEM certificates to trust for TLS besides the usual roots.
    /// Errors never repeat the URL, which may hold a password.
    pub fn parse(raw: &str, extra_roots: Option<&[u8]>) -> Result<Self, String> {
        let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        let (security, default_port) = match (url.scheme(), tls.as_deref()) {
            ("smtp", None) => (Security::None, 25),
            ("smtp", Some("opportunistic")) => (Security::Opportunistic, 587),
            ("smtp", Some("required")) => (Security::Required, 587),
            ("smtps", None) => (Security::Wrapper, 465),
            (scheme, tls) => {
                return Err(format!(
                    "unsupported scheme {scheme:?} or tls parameter {tls:?}: use smtp://, smtp://...?tls=required, smtp://...?tls=opportunistic or smtps://"
                ));
            }
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| "user name or password is not UTF-8 once decoded".to_owned())
        };
        let credentials = match url.password() {
            Some(password) => Some(Credentials::new(decode(url.username())?, decode(password)?)),
            None if !url.username().is_empty() => {
                return Err("a user name without a password".to_owned());
            }
            None => None,
        };
        let name = url.path().trim_matches('/');
        let hello = if name.is_empty() {
            ClientId::default()
        } else {
            ClientId::Domain(name.to_owned())
        };
        if extra_roots.is_some() && security == Security::None {
            return Err("a CA file was given for a server reached without TLS: add ?tls=required, or use smtps://".to_owned());
        }
        if let Some(pem) = extra_roots
            && !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----")
        {
            return Err("the CA file holds no PEM certificate".to_owned());
        }
        let target = Self {
            port: url.port().unwrap_or(default_port),
            host,
            security,
            hello,
            credentials,
            extra_roots: extra_roots.map(<[u8]>::to_vec),
        };
        if security != Security::None {
            target.tls().map_err(|e| e.to_string())?;
        }
        Ok(target)
    }

    fn tls(&self) -> Result<TlsParameters, lettre::transport::smtp::Error> {
        let mut builder = TlsParameters::builder(self.host.clone());
        if let Some(pem) = &self.extra_roots {
            builder = builder.add_root_certificate(Certificate::from_pem(pem)?);
        }
        builder.build()
    }
}

/// Up to `size` connections, each used by one send at a time.
pub struct Pool {
    target: Target,
    timeout: Duration,
    permits: Semaphore,
    idle: Mutex<Vec<(Connection, Instant)>>,
}

/// An open SMTP session, and whether its server takes pipelined commands.
struct Connection {
    smtp: AsyncSmtpConnection,
    pipelining: bool,
    /// The same socket, non-blocking, for [`Connection::closed_by_server`]; `None` where
    /// lettre opened the socket itself (`smtps://`).
    watch: Option<std::net::TcpStream>,
}

impl Connection {
    /// One message. Pipelined when the server allows it and the message needs no ESMTP
    /// parameters (SMTPUTF8, 8BITMIME), which lettre's own `send` negotiates.
    async fn send(
        &mut self,
        envelope: &Envelope,
        body: &[u8],
    ) -> Result<(), lettre::transport::smtp::Error> {
        let plain = envelope
            .from()
            .into_iter()
            .chain(envelope.to())
            .all(|a| AsRef::<str>::as_ref(a).is_ascii())
            && body.is_ascii();
        if !(self.pipelining && plain) {
            return self.smtp.send(envelope, body).await.map(drop);
        }
        let mut group = Mail::new(envelope.from().cloned(), Vec::new()).to_string();
        for to in envelope.to() {
            group.push_str(&Rcpt::new(to.clone(), Vec::new()).to_string());
        }
        group.push_str(&Data.to_string());
        let smtp = &mut self.smtp;
        let result = async {
            // The reply to MAIL, then one per RCPT, then DATA's 354.
            smtp.command(&group).await?;
            for _ in envelope.to() {
                smtp.read_response().await?;
            }
            smtp.read_response().await?;
            smtp.message(body).await
        }
        .await;
        if result.is_err() {
            // Replies to the rest of the group may still be on the wire: like lettre after
            // any failed transaction, leave the session rather than guess where it stands.
            smtp.abort().await;
        }
        result.map(drop)
    }

    fn has_broken(&self) -> bool {
        self.smtp.has_broken()
    }

    /// Whether the server closed the connection (or said something, which on an idle SMTP
    /// connection is a goodbye such as `421`) while it sat in the pool. Servers drop idle
    /// clients and restart; a send on such a connection would fail and cost an attempt.
    fn closed_by_server(&self) -> bool {
        self.watch.as_ref().is_some_and(|socket| {
            !matches!(socket.peek(&mut [0; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        })
    }
}

impl Pool {
    pub fn new(target: Target, size: u32, timeout: Duration) -> Self {
        Self {
            target,
            timeout,
            permits: Semaphore::new(size.max(1) as usize),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take_idle(&self) -> Option<Connection> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE && !conn.has_broken() && !conn.closed_by_server() {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(&self, conn: Connection) {
        if !conn.has_broken() {
            self.idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((conn, Instant::now()));
        }
    }

    /// A new connection: TCP with `TCP_NODELAY`, EHLO, STARTTLS and AUTH as configured, all
    /// within the timeout.
    async fn connect(&self) -> Result<Connection, SendError> {
        match tokio::time::timeout(self.timeout, self.open()).await {
            Ok(result) => result,
            Err(_) => Err(SendError::Unreachable(format!(
                "no connection within {}",
                humantime::format_duration(self.timeout)
            ))),
        }
    }

    async fn open(&self) -> Result<Connection, SendError> {
        let target = &self.target;
        let lettre_error = |e: lettre::transport::smtp::Error| SendError::from_lettre(&e);
        let (mut conn, watch) = if target.security == Security::Wrapper {
            let tls = target.tls().map_err(lettre_error)?;
            let conn = AsyncSmtpConnection::connect_tokio1(
                (target.host.as_str(), target.port),
                Some(self.timeout),
                &target.hello,
                Some(tls),
                None,
            )
            .await
            .map_err(lettre_error)?;
            (conn, None)
        } else {
            let socket_error = |what: &str| {
                let what = what.to_owned();
                move |e: io::Error| SendError::Unreachable(format!("{what}: {e}"))
            };
            let tcp = TcpStream::connect((target.host.as_str(), target.port))
                .await
                .map_err(socket_error("cannot connect"))?;
            tcp.set_nodelay(true)
                .map_err(socket_error("cannot set TCP_NODELAY"))?;
            // A second handle on the same socket, to see while the connection is idle
            // whether the server has closed it.
            let std = tcp
                .into_std()
                .map_err(socket_error("cannot watch the socket"))?;
            let watch = std
                .try_clone()
                .map_err(socket_error("cannot watch the socket"))?;
            let tcp = TcpStream::from_std(std).map_err(socket_error("cannot watch the socket"))?;
            let mut conn = AsyncSmtpConnection::connect_with_transport(
                Box::new(Corked::new(tcp)),
                &target.hello,
            )
            .await
            .map_err(lettre_error)?;
            let starttls = match target.security {
                Security::Required => true,
                Security::Opportunistic => conn.can_starttls(),
                Security::None | Security::Wrapper => false,
            };
            if starttls {
                let tls = target.tls().map_err(lettre_error)?;
                conn.starttls(tls, &target.hello)
                    .await
                    .map_err(|e| SendError::Unreachable(format!("STARTTLS failed: {e}")))?;
            }
            (conn, Some(watch))
        };
        // lettre keeps only the EHLO keywords it uses itself, so ask again for PIPELINING,
        // once per connection, before AUTH (after it, some servers would forget the login).
        let pipelining = conn
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
            conn.auth(&[Mechanism::Plain, Mechanism::Login], credentials)
                .await
                .map_err(lettre_error)?;
        }
        Ok(Connection {
            smtp: conn,
            pipelining,
            watch,
        })
    }

    /// Sends one message, reusing an idle connection when there is one. A reused connection
    /// that turns out to be dead (closed by the server while idle) is replaced once.
    pub async fn send(&self, envelope: &Envelope, body: &[u8]) -> Result<(), SendError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SendError::Unreachable("the SMTP pool is closed".to_owned()))?;
        let (conn, reused) = match self.take_idle() {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        match self.send_on(conn, envelope, body).await {
            Err(Attempt::Stale(_)) if reused => {
                let conn = self.connect().await?;
                self.send_on(conn, envelope, body)
                    .await
                    .map_err(Attempt::into_error)
            }
            result => result.map_err(Attempt::into_error),
        }
    }

    async fn send_on(
        &self,
        mut conn: Connection,
        envelope: &Envelope,
        body: &[u8],
    ) -> Result<(), Attempt> {
        match tokio::time::timeout(self.timeout, conn.send(envelope, body)).await {
            Ok(Ok(())) => {
                self.give_back(conn);
                Ok(())
            }
            // No reply at all: the connection died under us, or was dead before we began.
            Ok(Err(e)) if !(e.is_transient() || e.is_permanent() || e.is_response()) => {
                Err(Attempt::Stale(SendError::from_lettre(&e)))
            }
            Ok(Err(e)) => {
                self.give_back(conn);
                Err(Attempt::Failed(SendError::from_lettre(&e)))
            }
            // Dropped, not returned: a half-finished exchange must never be reused.
            Err(_elapsed) => Err(Attempt::Failed(SendError::Unreachable(format!(
                "no reply within {}",
                humantime::format_duration(self.timeout)
            )))),
        }
    }

    /// Opens a connection and checks it with NOOP; kept for the next send.
    pub async fn probe(&self) -> Result<(), SendError> {
        let mut conn = self.connect().await?;
        if tokio::time::timeout(self.timeout, conn.smtp.test_connected())
            .await
            .unwrap_or(false)
        {
            self.give_back(conn);
            Ok(())
        } else {
            Err(SendError::Unreachable("NOOP was not answered".to_owned()))
        }
    }

    /// Says QUIT on idle connections.
    pub async fn close(&self) {
        self.permits.close();
        let idle: Vec<_> = std::mem::take(
            &mut *self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (mut conn, _) in idle {
            // Best effort: the process is leaving, and the server times idle clients out anyway.
            if let Err(e) = tokio::time::timeout(Duration::from_secs(1), conn.smtp.quit()).await {
                tracing::debug!(error = %e, "QUIT timed out");
            }
        }
    }
}

/// Above this, held writes are sent without waiting for a read: a big message streams.
const MAX_CORKED: usize = 64 * 1024;

/// A TCP stream that holds what is written until the next read (or shutdown), then sends
/// it in one write. SMTP is request and reply: every write is followed by a read of the
/// reply, so nothing waits longer than it would have. lettre flushes after each of its
/// writes; a flush here only marks the data as ready to go with the next read.
#[derive(Debug)]
struct Corked {
    tcp: TcpStream,
    held: Vec<u8>,
    sent: usize,
}

impl Corked {
    fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            held: Vec::new(),
            sent: 0,
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Corked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.held.len() >= MAX_CORKED {
            ready!(this.poll_send(cx))?;
        }
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

impl AsyncRead for Corked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncTokioStream for Corked {
    fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.peer_addr()
    }
}

enum Attempt {
    /// The connection failed without a reply: worth one retry on a fresh connection.
    Stale(SendError),
    Failed(SendError),
}

impl Attempt {
    fn into_error(self) -> SendError {
        match self {
            Attempt::Stale(e) | Attempt::Failed(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_follow_lettres_form() {
        let t = Target::parse("smtp://127.0.0.1:2525", None).unwrap();
        assert_eq!((t.port, t.security), (2525, Security::None));
        let t = Target::parse("smtp://user:p%40ss@mail.example?tls=required", None).unwrap();
        assert_eq!((t.port, t.security), (587, Security::Required));
        assert!(t.credentials.is_some());
        let t = Target::parse("smtps://mail.example", None).unwrap();
        assert_eq!((t.port, t.security), (465, Security::Wrapper));
        for bad in [
            "http://mail.example",
            "smtp://",
            "smtp://h?tls=sometimes",
            "not a url",
            "smtp://user@h",
        ] {
            assert!(Target::parse(bad, None).is_err(), "{bad}");
        }
        assert!(
            !Target::parse("smtp://u:secret@h?tls=bogus", None)
                .unwrap_err()
                .contains("secret")
        );
    }
}
