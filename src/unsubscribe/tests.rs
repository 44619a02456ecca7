//! The token's promises: it opens to what it was made for, and to nothing when any of it
//! is changed, made with another secret, or not a token at all.

use secrecy::SecretString;

use super::{BadToken, OneClick, Unsubscribe};
use crate::lane::Lane;
use crate::suppression::{Address, Scope};

const SECRET: &str = "0123456789abcdef0123456789abcdef-one";
const OTHER: &str = "0123456789abcdef0123456789abcdef-two";

fn one_click(secrets: &str) -> OneClick {
    OneClick::new("https://mail.example.com/", &SecretString::from(secrets)).expect("settings")
}

fn token_of(url: &str) -> &str {
    url.rsplit('/').next().expect("a token")
}

fn ada() -> Address {
    Address::parse("Ada@Example.com").expect("an address")
}

#[test]
fn a_link_opens_to_the_address_scope_and_message_it_was_made_for() {
    let links = one_click(SECRET);
    let url = links.url_for(&ada(), Scope::Lane(Lane::Bulk), 42).expect("a link");
    assert!(url.starts_with("https://mail.example.com/unsubscribe/"), "{url}");
    assert_eq!(
        links.open(token_of(&url)),
        Ok(Unsubscribe {
            address: ada(),
            scope: Scope::Lane(Lane::Bulk),
            message: 42,
        })
    );
}

#[test]
fn two_links_for_one_address_differ_and_do_not_show_it() {
    let links = one_click(SECRET);
    let first = links.url_for(&ada(), Scope::Lane(Lane::Bulk), 1).expect("a link");
    let second = links.url_for(&ada(), Scope::Lane(Lane::Bulk), 1).expect("a link");
    assert_ne!(first, second);
    let decoded = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        token_of(&first),
    )
    .expect("base64");
    assert!(!String::from_utf8_lossy(&decoded).contains("ada@"));
}

#[test]
fn a_token_changed_in_any_one_character_opens_to_nothing() {
    let links = one_click(SECRET);
    let url = links.url_for(&ada(), Scope::Lane(Lane::Bulk), 7).expect("a link");
    let token = token_of(&url);
    for at in 0..token.len() {
        let mut changed: Vec<u8> = token.bytes().collect();
        changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(changed).expect("ascii");
        assert_eq!(links.open(&changed), Err(BadToken), "changed at {at}");
    }
}

#[test]
fn a_token_made_with_another_secret_opens_to_nothing_until_it_is_kept_for_rotation() {
    let old = one_click(OTHER);
    let url = old.url_for(&ada(), Scope::Lane(Lane::Bulk), 7).expect("a link");
    assert_eq!(one_click(SECRET).open(token_of(&url)), Err(BadToken));
    let rotated = one_click(&format!("{SECRET}, {OTHER}"));
    assert_eq!(rotated.open(token_of(&url)).map(|u| u.address), Ok(ada()));
}

#[test]
fn what_is_not_a_token_opens_to_nothing() {
    let links = one_click(SECRET);
    for junk in ["", "x", "AAAA", "not base64!", &"A".repeat(5000), "AQ"] {
        assert_eq!(links.open(junk), Err(BadToken), "{junk:.20}");
    }
}

#[test]
fn the_public_url_is_https_or_loopback_http_and_the_secret_long_enough() {
    let secret = SecretString::from(SECRET);
    for good in [
        "https://mail.example.com",
        "https://mail.example.com/outboxd/",
        "http://127.0.0.1:8080",
        "http://localhost:9000",
        "http://[::1]:9000",
    ] {
        assert!(OneClick::new(good, &secret).is_ok(), "{good}");
    }
    for (bad, says) in [
        ("http://mail.example.com", "HTTPS"),
        ("ftp://mail.example.com", "scheme"),
        ("https://mail.example.com/?a=1", "query"),
        ("https://u:p@mail.example.com", "credentials"),
        ("mail.example.com", "not a URL"),
    ] {
        let error = OneClick::new(bad, &secret).expect_err(bad);
        assert!(error.contains(says), "{bad}: {error}");
    }
    let error = OneClick::new("https://x.example", &SecretString::from("short")).expect_err("short");
    assert!(error.contains("at least 32"), "{error}");
}
