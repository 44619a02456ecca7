//! One HTTPS GET, for SNS: the signing certificate, and the subscription's confirmation.
//! Bounded in time and size; the public web's roots, and a private CA where one is set.

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// How long one fetch may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response read: a certificate is a few kilobytes.
const MAX_BODY: usize = 64 * 1024;

/// An HTTPS client that trusts the public web's roots and, optionally, a private CA.
#[derive(Clone)]
pub struct HttpsClient {
    tls: TlsConnector,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpsClient")
    }
}

impl HttpsClient {
    /// `extra_ca`: PEM certificates trusted besides the public roots.
    pub fn new(extra_ca: Option<&[u8]>) -> Result<Self, String> {
        Ok(Self {
            tls: TlsConnector::from(crate::tls::client_config(extra_ca)?),
        })
    }

    /// GETs an `https://` URL; the body of a 2xx answer, or why not.
    pub async fn get(&self, url: &url::Url) -> Result<Bytes, FetchError> {
        match tokio::time::timeout(TIMEOUT, self.get_now(url)).await {
            Ok(Ok(Ok(body))) => Ok(body),
            Ok(Ok(Err(answered))) => Err(FetchError::Answered(answered)),
            Ok(Err(failed)) => Err(FetchError::Failed(failed)),
            Err(_) => Err(FetchError::Failed(format!(
                "no answer within {}s",
                TIMEOUT.as_secs()
            ))),
        }
    }

    /// The body, `Err` inside for an answer other than 2xx, or `Err` outside for a
    /// fetch that failed.
    async fn get_now(&self, url: &url::Url) -> Result<Result<Bytes, String>, String> {
        if url.scheme() != "https" {
            return Err("only https is fetched".to_owned());
        }
        let host = url.host_str().ok_or("the URL has no host")?.to_owned();
        let port = url.port_or_known_default().unwrap_or(443);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {host}: {e}"))?;
        let name = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {host} failed: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(connection);
        let path = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, host.as_str())
            .header(
                hyper::header::USER_AGENT,
                concat!("outboxd/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?
            .to_bytes();
        driver.abort();
        if !status.is_success() {
            return Ok(Err(format!("{host} answered {status}")));
        }
        Ok(Ok(body))
    }
}

/// Why a fetch brought no body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The server answered, with something other than 2xx: what it has is not there.
    #[error("{0}")]
    Answered(String),
    /// No answer: the connection, TLS or the time failed; it may work later.
    #[error("{0}")]
    Failed(String),
}
