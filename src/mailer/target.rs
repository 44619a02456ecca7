//! Where the SMTP server is and how to reach it, parsed from a relay's URL (`OUTBOXD_SMTP_URL` and the others) in
//! lettre's URL form, with the TLS roots to trust.

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, TlsParameters};
use lettre::transport::smtp::extension::ClientId;

use super::SmtpSettings;
use crate::text::debug_showing_only;

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
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) security: Security,
    pub(super) hello: ClientId,
    pub(super) credentials: Option<Credentials>,
    /// AUTH may be sent over a connection without TLS (`?tls=opportunistic` to a server
    /// that offers no STARTTLS): see [`PLAINTEXT_AUTH_REFUSED`].
    pub(super) plaintext_auth_allowed: bool,
    /// PEM certificates trusted, besides the usual roots, for the server's certificate.
    extra_roots: Option<Vec<u8>>,
}

debug_showing_only!(Target as target {
    host,
    port,
    security,
    credentials = target.credentials.as_ref().map(|_| "***"),
    extra_roots = target.extra_roots.is_some(),
});

impl Target {
    /// Parses lettre's URL form: `smtp://[user[:password]@]host[:port][/ehlo-name][?tls=required|opportunistic]`
    /// or `smtps://...`, for one relay's URL (the main one, or a fallback) with the settings
    /// every relay shares (PEM certificates to trust for TLS besides the usual roots). Errors
    /// never repeat the URL, which may hold a password.
    pub fn parse_url(raw: &str, settings: &SmtpSettings) -> Result<Self, String> {
        let extra_roots = settings.ca_certificates.as_deref();
        let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let (security, default_port) = security(&url)?;
        let credentials = credentials(&url)?;
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
        // Credentials cross the network in plain text only to a relay on this machine, or
        // when the operator says the network is trusted.
        let plaintext_auth_allowed = settings.allow_plaintext_auth || is_loopback(&host);
        if credentials.is_some() && security == Security::None && !plaintext_auth_allowed {
            return Err(PLAINTEXT_AUTH_REFUSED.to_owned());
        }
        let target = Self {
            port: url.port().unwrap_or(default_port),
            host,
            security,
            hello,
            credentials,
            extra_roots: extra_roots.map(<[u8]>::to_vec),
            plaintext_auth_allowed,
        };
        if security != Security::None {
            target.tls().map_err(|e| e.to_string())?;
        }
        Ok(target)
    }

    /// How the relay is named in metrics and timelines: `host:port`, never credentials.
    pub fn label(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub(super) fn tls(&self) -> Result<TlsParameters, lettre::transport::smtp::Error> {
        let mut builder = TlsParameters::builder(self.host.clone());
        if let Some(pem) = &self.extra_roots {
            builder = builder.add_root_certificate(Certificate::from_pem(pem)?);
        }
        builder.build()
    }
}

/// Why credentials are not sent over a connection without TLS.
pub(super) const PLAINTEXT_AUTH_REFUSED: &str = "the SMTP credentials would cross the network in plain text: use ?tls=required or smtps://, or set OUTBOXD_SMTP_ALLOW_PLAINTEXT_AUTH=true for a relay on a network you trust";

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// How to secure the connection, and the port that goes with it by default.
fn security(url: &url::Url) -> Result<(Security, u16), String> {
    let tls = url
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.into_owned());
    Ok(match (url.scheme(), tls.as_deref()) {
        ("smtp", None) => (Security::None, 25),
        ("smtp", Some("opportunistic")) => (Security::Opportunistic, 587),
        ("smtp", Some("required")) => (Security::Required, 587),
        ("smtps", None) => (Security::Wrapper, 465),
        (scheme, tls) => {
            return Err(format!(
                "unsupported scheme {scheme:?} or tls parameter {tls:?}: use smtp://, smtp://...?tls=required, smtp://...?tls=opportunistic or smtps://"
            ));
        }
    })
}

fn credentials(url: &url::Url) -> Result<Option<Credentials>, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| "user name or password is not UTF-8 once decoded".to_owned())
    };
    Ok(match url.password() {
        Some(password) => Some(Credentials::new(decode(url.username())?, decode(password)?)),
        None if !url.username().is_empty() => {
            return Err("a user name without a password".to_owned());
        }
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::*;

    fn parse(url: &str) -> Result<Target, String> {
        let settings = SmtpSettings {
            fallback_urls: Vec::new(),
            bulk_urls: Vec::new(),
            url: SecretString::from(url.to_owned()),
            timeout: std::time::Duration::from_secs(1),
            pool_size: 1,
            ca_certificates: None,
            allow_plaintext_auth: false,
            ses_endpoint: None,
        };
        Target::parse_url(url, &settings)
    }

    #[test]
    fn credentials_go_in_plain_text_only_to_this_machine() {
        assert_eq!(
            parse("smtp://u:p@mail.example").unwrap_err(),
            PLAINTEXT_AUTH_REFUSED
        );
        assert!(parse("smtp://u:p@127.0.0.1:2525").is_ok());
        assert!(parse("smtp://u:p@localhost").is_ok());
        assert!(parse("smtp://u:p@mail.example?tls=required").is_ok());
    }

    #[test]
    fn urls_follow_lettres_form() {
        let t = parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!((t.port, t.security), (2525, Security::None));
        let t = parse("smtp://user:p%40ss@mail.example?tls=required").unwrap();
        assert_eq!((t.port, t.security), (587, Security::Required));
        assert!(t.credentials.is_some());
        let t = parse("smtps://mail.example").unwrap();
        assert_eq!((t.port, t.security), (465, Security::Wrapper));
        for bad in [
            "http://mail.example",
            "smtp://",
            "smtp://h?tls=sometimes",
            "not a url",
            "smtp://user@h",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(
            !parse("smtp://u:secret@h?tls=bogus")
                .unwrap_err()
                .contains("secret")
        );
    }
}
