//! AWS credentials from the standard chain, in the Rust SDK's order: the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the shared
//! credentials file (`AWS_SHARED_CREDENTIALS_FILE` or `~/.aws/credentials`, profile
//! `AWS_PROFILE` or `default`), a web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` and
//! `AWS_ROLE_ARN`: EKS's IAM roles for service accounts, through STS), the container's
//! (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `_FULL_URI`: ECS, EKS Pod Identity), then the
//! instance's (IMDSv2), unless `AWS_EC2_METADATA_DISABLED` is `true`. Temporary credentials are kept until five
//! minutes before they expire.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hyper::body::Bytes;
use secrecy::SecretString;

use crate::http_client::Origin;

/// How long one credentials request may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Credentials are fetched again this long before they expire.
const REFRESH_BEFORE: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// One set of credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: SecretString,
    pub session_token: Option<SecretString>,
    pub expires: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub fn fixed(access_key_id: &str, secret: &str, token: Option<&str>) -> Self {
        Self {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: SecretString::from(secret.to_owned()),
            session_token: token.map(|t| SecretString::from(t.to_owned())),
            expires: None,
        }
    }

    fn fresh(&self) -> bool {
        self.expires.is_none_or(|at| Utc::now() + REFRESH_BEFORE < at)
    }
}

/// The chain, and the credentials it found last.
pub struct Chain {
    region: String,
    kept: tokio::sync::Mutex<Option<Credentials>>,
}

impl Chain {
    pub fn new(region: &str) -> Self {
        Self {
            region: region.to_owned(),
            kept: tokio::sync::Mutex::new(None),
        }
    }

    /// The credentials to sign with now, or why there are none (every source said why).
    /// Credentials about to expire that cannot be fetched again are used while they last.
    pub async fn current(&self) -> Result<Credentials, String> {
        let mut kept = self.kept.lock().await;
        if let Some(credentials) = kept.as_ref().filter(|c| c.fresh()) {
            return Ok(credentials.clone());
        }
        match self.find().await {
            Ok(found) => {
                *kept = Some(found.clone());
                Ok(found)
            }
            Err(e) => match kept.as_ref().filter(|c| c.expires.is_some_and(|at| Utc::now() < at)) {
                Some(still) => {
                    tracing::warn!(error = %e, "cannot fetch AWS credentials again; using the ones about to expire");
                    Ok(still.clone())
                }
                None => Err(e),
            },
        }
    }

    /// Forgets the kept credentials: SES refused them.
    pub async fn forget(&self) {
        *self.kept.lock().await = None;
    }

    async fn find(&self) -> Result<Credentials, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            return Ok(Credentials::fixed(&id, &secret, var("AWS_SESSION_TOKEN").as_deref()));
        }
        if let Some(found) = profile()? {
            return Ok(found);
        }
        if let (Some(token_file), Some(role)) = (var("AWS_WEB_IDENTITY_TOKEN_FILE"), var("AWS_ROLE_ARN")) {
            return self.web_identity(&token_file, &role, var("AWS_ROLE_SESSION_NAME")).await;
        }
        if let Some(uri) = var("AWS_CONTAINER_CREDENTIALS_FULL_URI").or_else(|| {
            var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").map(|path| format!("http://169.254.170.2{path}"))
        }) {
            return container(&uri).await;
        }
        if var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err("no AWS credentials: none in the environment, the shared credentials file, a web identity or the container, and the instance metadata is disabled".to_owned());
        }
        instance().await.map_err(|e| {
            format!("no AWS credentials: none in the environment, the shared credentials file, a web identity or the container, nor the instance metadata: {e}")
        })
    }

    /// STS `AssumeRoleWithWebIdentity`, which needs no signature (`AWS_ENDPOINT_URL_STS`
    /// names another endpoint).
    async fn web_identity(&self, token_file: &str, role: &str, session: Option<String>) -> Result<Credentials, String> {
        let token = std::fs::read_to_string(token_file)
            .map_err(|e| format!("cannot read AWS_WEB_IDENTITY_TOKEN_FILE {token_file}: {e}"))?;
        let endpoint = std::env::var("AWS_ENDPOINT_URL_STS")
            .unwrap_or_else(|_| format!("https://sts.{}.amazonaws.com", self.region));
        let loopback = ["http://127.0.0.1", "http://localhost", "http://[::1]"]
            .iter()
            .any(|start| endpoint.starts_with(start));
        if !endpoint.starts_with("https://") && !loopback {
            return Err("AWS_ENDPOINT_URL_STS must be https:// (http:// only to this machine): the web identity token travels in it".to_owned());
        }
        let session = session.unwrap_or_else(|| format!("outboxd-{}", std::process::id()));
        let form: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", "2011-06-15")
            .append_pair("RoleArn", role)
            .append_pair("RoleSessionName", &session)
            .append_pair("WebIdentityToken", token.trim())
            .finish();
        let headers = [("content-type".to_owned(), "application/x-www-form-urlencoded".to_owned())];
        let body = fetch(&endpoint, "POST", "/", &headers, Bytes::from(form)).await?;
        let text = String::from_utf8_lossy(&body);
        let element = |name: &str| {
            let open = format!("<{name}>");
            let start = text.find(&open)? + open.len();
            let end = start + text[start..].find(&format!("</{name}>"))?;
            Some(text[start..end].trim().to_owned())
        };
        let (Some(id), Some(secret)) = (element("AccessKeyId"), element("SecretAccessKey")) else {
            return Err("STS's answer to AssumeRoleWithWebIdentity holds no credentials".to_owned());
        };
        let mut credentials = Credentials::fixed(&id, &secret, element("SessionToken").as_deref());
        credentials.expires = element("Expiration").and_then(|at| at.parse().ok());
        Ok(credentials)
    }
}

/// The container's credentials endpoint (ECS, EKS Pod Identity), with its token if any.
async fn container(uri: &str) -> Result<Credentials, String> {
    let url = url::Url::parse(uri).map_err(|e| format!("AWS_CONTAINER_CREDENTIALS_*_URI: {e}"))?;
    // As the SDKs: plain HTTP only to this machine or the ECS and EKS agents' addresses.
    let local = matches!(
        url.host_str(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "169.254.170.2" | "169.254.170.23" | "[fd00:ec2::23]")
    );
    if url.scheme() != "https" && !local {
        return Err("AWS_CONTAINER_CREDENTIALS_FULL_URI must be https://, or http:// to this machine or the container agent".to_owned());
    }
    let token = match std::env::var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Ok(file) => Some(std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?),
        Err(_) => std::env::var("AWS_CONTAINER_AUTHORIZATION_TOKEN").ok(),
    };
    let headers: Vec<(String, String)> = token
        .map(|t| ("authorization".to_owned(), t.trim().to_owned()))
        .into_iter()
        .collect();
    let path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    let body = fetch(url.as_str(), "GET", &path, &headers, Bytes::new()).await?;
    from_json(&body, "Token")
}

/// IMDSv2: a session token, the instance's role, and its credentials.
async fn instance() -> Result<Credentials, String> {
    const IMDS: &str = "http://169.254.169.254";
    let ttl = [("x-aws-ec2-metadata-token-ttl-seconds".to_owned(), "21600".to_owned())];
    let token = fetch(IMDS, "PUT", "/latest/api/token", &ttl, Bytes::new()).await?;
    let token = [("x-aws-ec2-metadata-token".to_owned(), String::from_utf8_lossy(&token).trim().to_owned())];
    let listing = "/latest/meta-data/iam/security-credentials/";
    let role = fetch(IMDS, "GET", listing, &token, Bytes::new()).await?;
    let role = String::from_utf8_lossy(&role).lines().next().unwrap_or("").trim().to_owned();
    if role.is_empty() {
        return Err("the instance has no IAM role".to_owned());
    }
    let body = fetch(IMDS, "GET", &format!("{listing}{role}"), &token, Bytes::new()).await?;
    from_json(&body, "Token")
}

/// `{"AccessKeyId", "SecretAccessKey", TOKEN, "Expiration"}`, as the container and the
/// instance answer.
fn from_json(body: &[u8], token: &str) -> Result<Credentials, String> {
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("credentials that are not JSON: {e}"))?;
    let field = |name: &str| json.get(name).and_then(|v| v.as_str());
    let (Some(id), Some(secret)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err("an answer without AccessKeyId and SecretAccessKey".to_owned());
    };
    let mut credentials = Credentials::fixed(id, secret, field(token));
    credentials.expires = field("Expiration").and_then(|at| at.parse().ok());
    Ok(credentials)
}

/// The shared credentials file's profile, if the file is there.
fn profile() -> Result<Option<Credentials>, String> {
    let path = match std::env::var("AWS_SHARED_CREDENTIALS_FILE") {
        Ok(path) => std::path::PathBuf::from(path),
        Err(_) => match std::env::var("HOME") {
            Ok(home) => std::path::Path::new(&home).join(".aws/credentials"),
            Err(_) => return Ok(None),
        },
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let wanted = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_owned());
    Ok(read_profile(&text, &wanted))
}

/// A profile's keys in an INI file: `[name]`, then `key = value` lines.
fn read_profile(text: &str, wanted: &str) -> Option<Credentials> {
    let (mut current, mut found) = (String::new(), std::collections::HashMap::new());
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_owned();
        } else if current == wanted
            && let Some((key, value)) = line.split_once('=')
        {
            found.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let id = found.get("aws_access_key_id")?;
    let secret = found.get("aws_secret_access_key")?;
    Some(Credentials::fixed(id, secret, found.get("aws_session_token").map(String::as_str)))
}

/// One request to a credentials source; its body when it answered 2xx.
async fn fetch(origin: &str, method: &str, path: &str, headers: &[(String, String)], body: Bytes) -> Result<Bytes, String> {
    let url = url::Url::parse(origin).map_err(|e| format!("{origin}: {e}"))?;
    let origin = Origin::new(url, Some(crate::tls::client_config(None)?))?;
    let deadline = tokio::time::Instant::now() + FETCH_TIMEOUT;
    let answer = origin
        .send(method, path, headers, body, deadline)
        .await
        .map_err(|e| e.to_string())?;
    if !(200..300).contains(&answer.status) {
        return Err(format!("{} answered {}", origin.label(), answer.status));
    }
    Ok(answer.body)
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret as _;

    use super::{from_json, read_profile};

    #[test]
    fn a_profile_is_read_from_the_shared_credentials_file() {
        let file = "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n[mail]\naws_access_key_id=AKIDMAIL\naws_secret_access_key=s2\naws_session_token=t2\n";
        let mail = read_profile(file, "mail").unwrap();
        assert_eq!(mail.access_key_id, "AKIDMAIL");
        assert_eq!(mail.secret_access_key.expose_secret(), "s2");
        assert_eq!(mail.session_token.unwrap().expose_secret(), "t2");
        assert_eq!(read_profile(file, "default").unwrap().access_key_id, "AKIDDEFAULT");
        assert!(read_profile(file, "other").is_none());
    }

    #[test]
    fn the_container_s_and_the_instance_s_answers_are_read_with_their_expiry() {
        let body = br#"{"AccessKeyId":"ASIA1","SecretAccessKey":"s","Token":"t","Expiration":"2026-12-06T12:00:00Z"}"#;
        let credentials = from_json(body, "Token").unwrap();
        assert_eq!(credentials.access_key_id, "ASIA1");
        assert_eq!(credentials.expires.unwrap().to_rfc3339(), "2026-12-06T12:00:00+00:00");
        assert!(from_json(b"{}", "Token").is_err());
        assert!(from_json(b"not json", "Token").is_err());
    }
}
