//! HTTP/1.1 to one origin (the SES endpoint, a credentials source, the callback URL), over TLS for
//! `https://` (the public web's roots, and a private CA where one is set) or plain for
//! `http://`, with idle connections kept for reuse. A failure is told apart by when it
//! happened: before the request went (`Unsent`: connecting, TLS, the handshake), so that
//! another relay may take the message, or after (`Sent`: its outcome unknown).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::lock::lock;

/// The largest answer read: SES's are a few hundred bytes, credentials a few KiB.
const MAX_BODY: usize = 256 * 1024;
/// Idle connections kept per origin.
const MAX_IDLE: usize = 32;
/// Idle connections older than this are closed rather than reused: servers close idle
/// clients after a while (SES after about a minute).
const MAX_IDLE_FOR: Duration = Duration::from_secs(20);

/// An answer: its status, headers (names lower-case) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why there is no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// Nothing went: the server has not seen the request.
    #[error("{0}")]
    Unsent(String),
    /// The request went; no whole answer came.
    #[error("{0}")]
    Sent(String),
}

/// One origin's client.
pub struct Origin {
    url: url::Url,
    host: String,
    port: u16,
    tls: Option<TlsConnector>,
    /// Idle connections, and since when.
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, std::time::Instant)>>,
}

impl Origin {
    /// `url`'s scheme, host and port; `tls` for `https://`.
    pub fn new(url: url::Url, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Self, String> {
        let host = url.host_str().ok_or("the URL has no host")?.to_owned();
        let port = url.port_or_known_default().ok_or("the URL has no port")?;
        let tls = match url.scheme() {
            "https" => Some(TlsConnector::from(tls.ok_or("no TLS settings")?)),
            "http" => None,
            other => return Err(format!("{other}:// is not HTTP")),
        };
        Ok(Self {
            url,
            host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
            port,
            tls,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// `host:port`, the relay's name in metrics and on timelines.
    pub fn label(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// One request, by `deadline`; `headers` besides `host`. A request an idle connection
    /// could not take (the server had closed it) goes once more on a new one: it was not
    /// sent.
    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(String, String)],
        body: Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, HttpError> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, self.host_header())
            .header(hyper::header::USER_AGENT, concat!("outboxd/", env!("CARGO_PKG_VERSION")));
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut request = request
            .body(Full::new(body))
            .map_err(|e| HttpError::Unsent(e.to_string()))?;
        let mut reused = self.take_idle();
        loop {
            let fresh = reused.is_none();
            let mut sender = match reused.take() {
                Some(sender) => sender,
                None => tokio::time::timeout_at(deadline, self.connect())
                    .await
                    .map_err(|_| HttpError::Unsent(format!("no connection to {} within the timeout", self.label())))??,
            };
            let answered = tokio::time::timeout_at(deadline, async {
                let response = match sender.try_send_request(request).await {
                    Ok(response) => response,
                    Err(mut e) => return Err(e.take_message().ok_or_else(|| e.into_error().to_string())),
                };
                read(response).await.map_err(Err)
            })
            .await;
            match answered {
                Ok(Ok(answer)) => {
                    self.give_back(sender);
                    return Ok(answer);
                }
                // Not sent: on a reused connection, once more on a new one.
                Ok(Err(Ok(unsent))) if !fresh => request = unsent,
                Ok(Err(Ok(_))) => return Err(HttpError::Unsent(format!("{} closed the connection", self.label()))),
                Ok(Err(Err(e))) => return Err(HttpError::Sent(e)),
                Err(_) => return Err(HttpError::Sent("no answer within the timeout".to_owned())),
            }
        }
    }

    /// The `Host` header it sends: the port only when it is not the scheme's own, an IPv6
    /// address in brackets.
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match (self.url.scheme(), self.port) {
            ("https", 443) | ("http", 80) => host,
            _ => format!("{host}:{}", self.port),
        }
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = lock(&self.idle);
        while let Some((sender, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE_FOR && !sender.is_closed() && sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE && !sender.is_closed() {
            idle.push((sender, std::time::Instant::now()));
        }
    }

    /// Drops the idle connections.
    pub fn close(&self) {
        lock(&self.idle).clear();
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, HttpError> {
        let unsent = |what: &str, e: &dyn std::fmt::Display| {
            HttpError::Unsent(format!("{what} {}: {e}", self.label()))
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unsent("cannot connect to", &e))?;
        tcp.set_nodelay(true).map_err(|e| unsent("cannot set up", &e))?;
        let (sender, connection) = match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| unsent("no TLS name for", &e))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| unsent("TLS failed with", &e))?;
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| unsent("HTTP failed with", &e))?;
                (sender, tokio::spawn(async move { drop(connection.await) }))
            }
            None => {
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| unsent("HTTP failed with", &e))?;
                (sender, tokio::spawn(async move { drop(connection.await) }))
            }
        };
        // The connection's task ends when its sender is dropped or the server closes it.
        drop(connection);
        Ok(sender)
    }
}

/// A response read whole, within [`MAX_BODY`].
async fn read(response: hyper::Response<hyper::body::Incoming>) -> Result<Answer, String> {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?
        .to_bytes();
    Ok(Answer { status, headers, body })
}
