//! Access to the admin surface: a Bearer token for the API, HTTP Basic (the token as the
//! password) for the page, and a CSRF token for the page's forms. The admin token may do
//! everything, the read-only token only read (`tokens`): a change asked with it is refused
//! with 403. Comparisons are constant-time over digests, so neither content nor length
//! leaks through timing.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ring::hmac;
use std::sync::Arc;
use subtle::ConstantTimeEq as _;

use super::tokens::{Access, Matched, TokenSet};
use crate::store::admin::Operator;
use crate::store::messages::{MessageDetail, MessageState, StoredPayload};

/// Who made a request: the operator the audit trail names (with the token's name), what
/// the token lets them do, and the key of their page's CSRF tokens.
#[derive(Clone)]
pub struct Actor {
    pub operator: Operator,
    pub access: Access,
    csrf_key: hmac::Key,
}

impl Actor {
    fn new(name: String, matched: Matched) -> Self {
        Self {
            operator: Operator {
                name,
                token: Some(matched.name),
            },
            access: matched.access,
            csrf_key: matched.csrf_key,
        }
    }

    /// Whether the token may change things.
    pub fn may_change(&self) -> bool {
        self.access == Access::Admin
    }

    /// Withholds what this actor may not see: a read-only token sees no payload of an
    /// ended message (`null`; a pending one's shows, its secret fields masked).
    pub fn withhold(&self, message: &mut MessageDetail) {
        if !self.may_change() && message.state != MessageState::Pending {
            message.payload = StoredPayload(serde_json::Value::Null);
        }
    }
}

/// How long a CSRF token stays good: it is issued for the current window and accepted in
/// the next, so a page may sit open for at least this long before a button is pressed.
const CSRF_WINDOW_SECONDS: u64 = 3600;

/// The admin surface's tokens: at least one set is given.
#[derive(Debug)]
pub struct AdminAuth {
    admin: Option<TokenSet>,
    read: Option<TokenSet>,
}

impl AdminAuth {
    pub fn new(admin: Option<TokenSet>, read: Option<TokenSet>) -> Self {
        Self { admin, read }
    }

    /// The token `presented` is, if any.
    fn matches(&self, presented: &str) -> Option<Matched> {
        let admin = self.admin.as_ref().and_then(|set| set.matches(presented));
        let read = self.read.as_ref().and_then(|set| set.matches(presented));
        // A token a file rotation put in both sets may only read.
        read.or(admin)
    }

    /// The CSRF token for this actor's forms now: bound to the actor (the Basic user name),
    /// their token and the hour, so it is neither shared by everyone nor good forever.
    pub fn csrf_token(&self, actor: &Actor) -> String {
        csrf_for(actor, csrf_window(std::time::SystemTime::now()))
    }

    /// Whether a form's token is this actor's, from this window or the one before.
    pub fn csrf_matches(&self, actor: &Actor, presented: &str) -> bool {
        let window = csrf_window(std::time::SystemTime::now());
        [window, window.saturating_sub(1)].into_iter().any(|w| {
            presented
                .as_bytes()
                .ct_eq(csrf_for(actor, w).as_bytes())
                .into()
        })
    }

    fn bearer(&self, headers: &HeaderMap) -> Option<Matched> {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|token| self.matches(token.trim()))
    }

    /// The Basic user name and the token, when the password is one.
    fn basic(&self, headers: &HeaderMap) -> Option<(String, Matched)> {
        let encoded = headers
            .get(header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Basic ")?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (user, password) = decoded.split_once(':')?;
        let matched = self.matches(password)?;
        Some((actor_name(user, "admin"), matched))
    }
}

fn csrf_for(actor: &Actor, window: u64) -> String {
    let message = format!("{}\0{window}", actor.operator.name);
    crate::text::hex(hmac::sign(&actor.csrf_key, message.as_bytes()).as_ref())
}

fn csrf_window(now: std::time::SystemTime) -> u64 {
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / CSRF_WINDOW_SECONDS)
}


/// A name fit for the audit table: printable, short, never empty.
fn actor_name(raw: &str, fallback: &str) -> String {
    let cleaned: String = raw.chars().filter(|c| !c.is_control()).take(64).collect();
    let cleaned = cleaned.trim();
    if cleaned.is_empty() {
        fallback.to_owned()
    } else {
        cleaned.to_owned()
    }
}

/// API requests need `Authorization: Bearer <token>`; `X-Outboxd-Actor` names the caller.
/// The read-only token may only read: any other method is refused with 403, but for the
/// POSTs that read (a count of pending messages by filter).
pub async fn require_bearer(
    State(auth): State<Arc<AdminAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(matched) = auth.bearer(request.headers()) else {
        let mut response = (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": {
                "code": "unauthorized",
                "message": "send an admin token as `Authorization: Bearer <OUTBOXD_ADMIN_TOKEN>` (or OUTBOXD_ADMIN_READ_TOKEN, to read)"
            }})),
        )
            .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"outboxd\""),
        );
        return response;
    };
    let actor = request
        .headers()
        .get("x-outboxd-actor")
        .and_then(|v| v.to_str().ok())
        .map_or_else(
            || "api".to_owned(),
            |name| format!("api:{}", actor_name(name, "anonymous")),
        );
    let actor = Actor::new(actor, matched);
    if !actor.may_change() && !reads(request.method(), request.uri().path()) {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({"error": {
                "code": "read_only",
                "message": "this token may only read: a change needs OUTBOXD_ADMIN_TOKEN"
            }})),
        )
            .into_response();
    }
    request.extensions_mut().insert(actor);
    next.run(request).await
}

/// Whether a request only reads.
fn reads(method: &Method, path: &str) -> bool {
    matches!(*method, Method::GET | Method::HEAD) || path == READING_POST
}

/// The one POST that only reads: a count by filter (its filter is a JSON body).
const READING_POST: &str = "/api/v1/pending/count";

/// Page requests need HTTP Basic with a token as the password, so a browser works with
/// no login form; the user name is recorded as the actor. The read-only token's POSTs
/// (every form changes something) are refused with 403.
pub async fn require_basic(
    State(auth): State<Arc<AdminAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some((user, matched)) = auth.basic(request.headers()) else {
        let mut response = (
            StatusCode::UNAUTHORIZED,
            "outboxd admin: sign in with any user name and OUTBOXD_ADMIN_TOKEN (or OUTBOXD_ADMIN_READ_TOKEN) as the password\n",
        )
            .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"outboxd admin\", charset=\"UTF-8\""),
        );
        return response;
    };
    let actor = Actor::new(user, matched);
    if !actor.may_change() && !matches!(*request.method(), Method::GET | Method::HEAD) {
        return (
            StatusCode::FORBIDDEN,
            "outboxd admin: this token may only read; a change needs OUTBOXD_ADMIN_TOKEN\n",
        )
            .into_response();
    }
    request.extensions_mut().insert(actor);
    next.run(request).await
}

/// The names the admin surface answers to in a request's `Host`, besides IP literals and
/// `localhost`. A page that a browser reaches by a name of the attacker's that resolves to
/// this address (DNS rebinding) is the attacker's origin, whose scripts could use a token
/// they know (the compose file's, say): such a request is refused with 421.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminHosts {
    names: Vec<String>,
    any: bool,
}

impl AdminHosts {
    /// A comma-separated list of host names (no port); `*` allows any name.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut hosts = Self::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                hosts.any = true;
                continue;
            }
            let valid = name.split('.').all(|label| {
                !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            if !valid {
                return Err(format!("{name:?} is not a host name (without a port)"));
            }
            hosts.names.push(name.to_ascii_lowercase());
        }
        Ok(hosts)
    }

    /// Whether a request with this `Host` may reach the admin surface; one without a
    /// `Host` (no browser sends such a request) may.
    fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host.map(str::trim) else {
            return true;
        };
        let name = match host.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.any
            || name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.contains(&name)
    }
}

/// Admin requests must name this server in `Host` (see [`AdminHosts`]).
pub async fn require_known_host(
    State(hosts): State<Arc<AdminHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if hosts.allows(host) {
        return next.run(request).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "this Host is not one the admin surface answers to: add it to OUTBOXD_ADMIN_HOSTS\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::AdminHosts;

    #[test]
    fn the_admin_surface_answers_to_addresses_localhost_and_the_names_given() {
        let hosts = AdminHosts::parse("admin.example.com, outboxd-admin").unwrap();
        for allowed in [
            None,
            Some("127.0.0.1:9899"),
            Some("[::1]:9899"),
            Some("10.1.2.3"),
            Some("localhost:9899"),
            Some("Admin.Example.com"),
            Some("outboxd-admin:9899"),
        ] {
            assert!(hosts.allows(allowed), "{allowed:?}");
        }
        for refused in [
            Some("rebind.attacker.test:9899"),
            Some("example.com"),
            Some(""),
        ] {
            assert!(!hosts.allows(refused), "{refused:?}");
        }
        assert!(
            AdminHosts::parse("*")
                .unwrap()
                .allows(Some("anything.test"))
        );
        assert!(AdminHosts::parse("host:9899").is_err());
    }
}
