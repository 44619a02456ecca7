//! The SES API v2 as a relay (`ses://REGION`): each email is sent whole, as raw MIME, with
//! `SendEmail` (so rendering, DKIM and attachments are as over SMTP), signed with Signature
//! Version 4 and credentials from the standard AWS chain; `OUTBOXD_SES_ENDPOINT_URL` names
//! another endpoint. A small client of our own rather than the AWS SDK: docs/adr/0008 says
//! why. Its answers are read as SMTP's are: SES's message id is the acceptance; throttling
//! is a throttling reply (the pace is cut, no attempt charged); `MessageRejected` and other
//! refusals of the message are for good; a refusal of the account or its credentials is an
//! outage of this relay; a failure before the request went may fail over, one after it is
//! ambiguous.

mod credentials;
mod sigv4;

use std::time::Duration;

use base64::Engine as _;
use hyper::body::Bytes;
use lettre::address::Envelope;

use super::pool::Failure;
use super::{Accepted, Reply, SendError};
use crate::http_client::{Answer, HttpError, Origin};

/// Where SES's API is, parsed from `ses://REGION`.
#[derive(Debug, Clone)]
pub struct SesTarget {
    region: String,
    endpoint: url::Url,
}

impl SesTarget {
    /// `ses://eu-west-1`, at `endpoint` when one is given (`OUTBOXD_SES_ENDPOINT_URL`).
    pub fn parse(url: &url::Url, endpoint: Option<&str>) -> Result<Self, String> {
        let region = url.host_str().unwrap_or("").to_owned();
        let valid = !region.is_empty()
            && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid || !url.path().trim_matches('/').is_empty() || url.query().is_some() || !url.username().is_empty() {
            return Err("expected ses://REGION (credentials come from the AWS chain, never the URL)".to_owned());
        }
        let endpoint = match endpoint {
            Some(endpoint) => url::Url::parse(endpoint).map_err(|e| format!("OUTBOXD_SES_ENDPOINT_URL: {e}"))?,
            None => url::Url::parse(&format!("https://email.{region}.amazonaws.com")).map_err(|e| e.to_string())?,
        };
        let loopback = matches!(endpoint.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        match endpoint.scheme() {
            "https" => {}
            // A session token travels in a header: never in the clear off this machine.
            "http" if loopback => {}
            _ => return Err("OUTBOXD_SES_ENDPOINT_URL must be https:// (http:// only to this machine)".to_owned()),
        }
        Ok(Self { region, endpoint })
    }

    pub fn region(&self) -> &str {
        &self.region
    }
}

/// The SES API client of one relay.
pub struct SesClient {
    region: String,
    origin: Origin,
    credentials: credentials::Chain,
    timeout: Duration,
}

const SEND_PATH: &str = "/v2/email/outbound-emails";

impl SesClient {
    pub fn new(target: SesTarget, timeout: Duration, extra_ca: Option<&[u8]>) -> Result<Self, String> {
        let tls = crate::tls::client_config(extra_ca)?;
        Ok(Self {
            credentials: credentials::Chain::new(&target.region),
            origin: Origin::new(target.endpoint, Some(tls))?,
            region: target.region,
            timeout,
        })
    }

    /// `host:port` of the endpoint.
    pub fn label(&self) -> String {
        self.origin.label()
    }

    /// `SendEmail` with the raw message, to the envelope's recipients.
    pub async fn send_by(&self, envelope: &Envelope, body: &[u8], deadline: tokio::time::Instant) -> Result<Accepted, Failure> {
        let unsent = |error| Failure { error, before_data: true };
        let request = serde_json::json!({
            "Destination": { "ToAddresses": envelope.to().iter().map(ToString::to_string).collect::<Vec<_>>() },
            "Content": { "Raw": { "Data": base64::engine::general_purpose::STANDARD.encode(body) } },
        });
        let request = Bytes::from(request.to_string());
        let deadline = deadline.min(tokio::time::Instant::now() + self.timeout);
        let answer = self.call("POST", SEND_PATH, request, deadline).await.map_err(|e| match e {
            Called::NoCredentials(said) => unsent(SendError::Unreachable(said)),
            Called::Http(HttpError::Unsent(said)) => unsent(SendError::Unreachable(said)),
            Called::Http(HttpError::Sent(said)) => Failure {
                error: SendError::Ambiguous(format!("SES: {said}")),
                before_data: false,
            },
        })?;
        if (200..300).contains(&answer.status) {
            let id = serde_json::from_slice::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|v| v.get("MessageId").and_then(|id| id.as_str()).map(str::to_owned))
                .unwrap_or_else(|| "(no MessageId)".to_owned());
            return Ok(Accepted(crate::text::storable(&format!("SES MessageId {id}"), 500)));
        }
        if matches!(answer.status, 401 | 403) {
            // Rotated or revoked: found again for the next send.
            self.credentials.forget().await;
        }
        let error = refusal(&answer);
        // Nothing was taken when the account, the credentials or the service refused: another
        // relay may take it.
        let before_data = matches!(error, SendError::Unreachable(_));
        Err(Failure { error, before_data })
    }

    /// Whether the API answers this relay's credentials and the account may send:
    /// `GetAccount` and its `SendingEnabled`. Another answer than a refusal counts as up.
    pub async fn probe(&self) -> Result<(), SendError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = match self.call("GET", "/v2/email/account", Bytes::new(), deadline).await {
            Ok(answer) => answer,
            Err(Called::NoCredentials(said)) => return Err(SendError::Unreachable(said)),
            Err(Called::Http(e)) => return Err(SendError::Unreachable(e.to_string())),
        };
        if matches!(answer.status, 401 | 403) || answer.status >= 500 {
            return Err(refusal(&answer));
        }
        let account: Option<serde_json::Value> = serde_json::from_slice(&answer.body).ok();
        let sending = account.as_ref().and_then(|a| a.get("SendingEnabled")).and_then(serde_json::Value::as_bool);
        if sending == Some(false) {
            return Err(SendError::Unreachable("SES: sending is paused for this account (SendingEnabled is false)".to_owned()));
        }
        Ok(())
    }

    pub fn close(&self) {
        self.origin.close();
    }

    /// One signed call, credentials included, by `deadline`.
    async fn call(&self, method: &str, path: &str, body: Bytes, deadline: tokio::time::Instant) -> Result<Answer, Called> {
        let credentials = tokio::time::timeout_at(deadline, self.credentials.current())
            .await
            .map_err(|_| Called::NoCredentials("no AWS credentials within the send's time".to_owned()))?
            .map_err(Called::NoCredentials)?;
        // Signed as the origin sends it.
        let host = self.origin.host_header();
        let mut headers = vec![("host".to_owned(), host), ("content-type".to_owned(), "application/json".to_owned())];
        let request = sigv4::Request { method, path, headers: headers.clone(), body: &body };
        headers.extend(sigv4::sign(&request, &credentials, &self.region, "ses", chrono::Utc::now()));
        headers.retain(|(name, _)| name != "host");
        self.origin.send(method, path, &headers, body, deadline).await.map_err(Called::Http)
    }
}

/// Why a call brought no answer.
enum Called {
    NoCredentials(String),
    Http(HttpError),
}

/// What an error answer means for the message: SES's error type (`x-amzn-ErrorType`, or the
/// body's `__type`, `code` or XML `Code`) and message.
fn refusal(answer: &Answer) -> SendError {
    let body = String::from_utf8_lossy(&answer.body);
    let json: Option<serde_json::Value> = serde_json::from_str(&body).ok();
    let from_json = |key: &str| json.as_ref().and_then(|j| j.get(key)).and_then(|v| v.as_str()).map(str::to_owned);
    let from_xml = |tag: &str| {
        let open = format!("<{tag}>");
        let start = body.find(&open)? + open.len();
        Some(body[start..start + body[start..].find('<')?].to_owned())
    };
    let kind = answer
        .header("x-amzn-errortype")
        .map(str::to_owned)
        .or_else(|| from_json("__type"))
        .or_else(|| from_json("code"))
        .or_else(|| from_xml("Code"))
        .unwrap_or_default();
    // `MessageRejected:http://internal.amazon.com/...`, or `com.amazon...#MessageRejected`.
    let kind = kind.split(':').next().unwrap_or("").rsplit('#').next().unwrap_or("").to_owned();
    let said = from_json("message").or_else(|| from_json("Message")).or_else(|| from_xml("Message")).unwrap_or_default();
    let said = crate::text::storable(&format!("SES {} {kind}: {said}", answer.status), 400);
    classify(answer.status, &kind, said)
}

fn classify(status: u16, kind: &str, said: String) -> SendError {
    const THROTTLING: &[&str] = &["TooManyRequestsException", "Throttling", "ThrottlingException"];
    // The account, its credentials or the service: nothing about this message.
    const OUTAGE: &[&str] = &[
        "AccountSuspendedException", "SendingPausedException", "UnrecognizedClientException",
        "InvalidClientTokenId", "InvalidSignatureException", "SignatureDoesNotMatch",
        "IncompleteSignature", "MissingAuthenticationToken", "AccessDeniedException",
        "ExpiredTokenException", "ServiceUnavailable", "ServiceUnavailableException",
    ];
    // The message itself, as SES will never take it.
    const REFUSED: &[&str] = &[
        "MessageRejected", "BadRequestException", "InvalidParameterValue", "ValidationException",
    ];
    if status == 429 || THROTTLING.contains(&kind) {
        SendError::Deferred { reply: Reply::new(454, &format!("4.7.0 Throttling failure: {said}")) }
    } else if matches!(status, 401 | 403 | 503) || OUTAGE.contains(&kind) {
        SendError::Unreachable(said)
    } else if REFUSED.contains(&kind) {
        SendError::Rejected { reply: Reply::new(554, &format!("5.6.0 {said}")), recipient: None }
    } else {
        // Anything else (a kind's unverified MAIL FROM domain, an error SES adds later, a
        // proxy's 408, a 500): retried, and dead-lettered after the last attempt.
        SendError::Deferred { reply: Reply::new(451, &format!("4.3.0 {said}")) }
    }
}

#[cfg(test)]
mod tests {
    use super::classify;
    use crate::mailer::SendError;

    #[test]
    fn ses_s_answers_are_read_as_smtp_s_would_be() {
        let said = || "SES said so".to_owned();
        let throttled = classify(429, "TooManyRequestsException", said());
        assert!(throttled.is_throttling(), "{throttled:?}");
        assert!(matches!(classify(400, "MessageRejected", said()), SendError::Rejected { .. }));
        assert!(matches!(classify(400, "BadRequestException", said()), SendError::Rejected { .. }));
        // The account, not the message: an outage of this relay, charged to no message.
        assert!(matches!(classify(400, "SendingPausedException", said()), SendError::Unreachable(_)));
        assert!(matches!(classify(403, "", said()), SendError::Unreachable(_)));
        assert!(matches!(classify(503, "ServiceUnavailable", said()), SendError::Unreachable(_)));
        // Neither the message's fault for good nor an outage: retried.
        for (status, kind) in [(500, "InternalFailure"), (400, "MailFromDomainNotVerifiedException"), (400, "LimitExceededException"), (408, "")] {
            let failed = classify(status, kind, said());
            assert!(matches!(failed, SendError::Deferred { .. }) && !failed.is_throttling(), "{kind}");
        }
    }

    #[test]
    fn only_ses_s_own_url_form_is_taken() {
        let parse = |u: &str| super::SesTarget::parse(&url::Url::parse(u).unwrap(), None);
        assert!(parse("ses://eu-west-1").is_ok());
        assert_eq!(parse("ses://eu-west-1").unwrap().endpoint.as_str(), "https://email.eu-west-1.amazonaws.com/");
        assert!(parse("ses://AKID:secret@eu-west-1").is_err(), "no credentials in the URL");
        assert!(parse("ses://eu-west-1/x").is_err());
        assert!(parse("ses://").is_err());
        let at = |endpoint: &str| super::SesTarget::parse(&url::Url::parse("ses://us-east-1").unwrap(), Some(endpoint));
        assert!(at("http://127.0.0.1:5000").is_ok());
        assert!(at("https://vpce-1.email.us-east-1.vpce.amazonaws.com").is_ok());
        assert!(at("http://ses.internal.example").is_err(), "a token in the clear");
    }
}
