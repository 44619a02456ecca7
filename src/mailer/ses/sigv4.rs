//! AWS Signature Version 4 for one request: the canonical request, the string to sign, the
//! key derived for the day, region and service, and the `Authorization` header. Only what
//! outboxd sends needs it: a path without encoding quirks, no query, a JSON body.

use chrono::{DateTime, Utc};
use ring::{digest, hmac};
use secrecy::ExposeSecret as _;

use super::credentials::Credentials;

/// What is signed of a request; header names lower-case, sorted by the signer.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
}

/// The headers to add to the request: `x-amz-date`, the session token if any, and
/// `authorization`.
pub fn sign(
    request: &Request<'_>,
    credentials: &Credentials,
    region: &str,
    service: &str,
    now: DateTime<Utc>,
) -> Vec<(String, String)> {
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let day = now.format("%Y%m%d").to_string();
    let mut added = vec![("x-amz-date".to_owned(), amz_date.clone())];
    if let Some(token) = &credentials.session_token {
        added.push(("x-amz-security-token".to_owned(), token.expose_secret().to_owned()));
    }
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .chain(&added)
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let canonical_request = format!(
        "{}\n{}\n\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        request.path,
        crate::text::hex(digest::digest(&digest::SHA256, request.body).as_ref())
    );
    let scope = format!("{day}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        crate::text::hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let secret = format!("AWS4{}", credentials.secret_access_key.expose_secret());
    let key = [day.as_str(), region, service, "aws4_request"]
        .iter()
        .fold(secret.into_bytes(), |key, part| {
            hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), part.as_bytes())
                .as_ref()
                .to_vec()
        });
    let signature = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), string_to_sign.as_bytes());
    added.push((
        "authorization".to_owned(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={}",
            credentials.access_key_id,
            crate::text::hex(signature.as_ref())
        ),
    ));
    added
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;

    use super::{Request, sign};
    use crate::mailer::ses::credentials::Credentials;

    /// AWS's Signature Version 4 test suite, `get-vanilla`: its published signature.
    #[test]
    fn the_aws_test_suite_s_get_vanilla_signs_as_published() {
        let credentials = Credentials::fixed(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
        );
        let request = Request {
            method: "GET",
            path: "/",
            headers: vec![("Host".to_owned(), "example.amazonaws.com".to_owned())],
            body: b"",
        };
        let now = chrono::Utc.with_ymd_and_hms(2015, 8, 30, 12, 36, 0).unwrap();
        let added = sign(&request, &credentials, "us-east-1", "service", now);
        let authorization = &added.iter().find(|(n, _)| n == "authorization").unwrap().1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn a_session_token_is_sent_and_signed() {
        let credentials = Credentials::fixed("AKID", "secret", Some("token"));
        let request = Request {
            method: "POST",
            path: "/v2/email/outbound-emails",
            headers: vec![("host".to_owned(), "email.eu-west-1.amazonaws.com".to_owned())],
            body: b"{}",
        };
        let now = chrono::Utc.with_ymd_and_hms(2026, 12, 6, 0, 0, 0).unwrap();
        let added = sign(&request, &credentials, "eu-west-1", "ses", now);
        assert!(added.contains(&("x-amz-security-token".to_owned(), "token".to_owned())));
        let authorization = &added.iter().find(|(n, _)| n == "authorization").unwrap().1;
        assert!(authorization.contains("/20261206/eu-west-1/ses/aws4_request"), "{authorization}");
        assert!(authorization.contains("SignedHeaders=host;x-amz-date;x-amz-security-token"), "{authorization}");
    }
}
