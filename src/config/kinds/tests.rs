//! The rules that merge a kind's file with the variables, each on one case.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{KindArgs, KindBook, LaneKey, merge, parse_file};
use crate::dispatch::ExpireAfter;
use crate::message::{Kind, Lane, Lanes};

fn kind(name: &str) -> Kind {
    Kind::parse(name).expect("a kind")
}

fn variables(
    bulk: Option<&Lanes>,
    expire_after: Option<&ExpireAfter>,
    auto_pause: &BTreeSet<Kind>,
    auto_pause_exempt: &BTreeSet<Kind>,
) -> KindArgs {
    KindArgs {
        bulk_kinds: bulk.cloned(),
        expire_after: expire_after.cloned(),
        auto_pause_kinds: auto_pause.clone(),
        auto_pause_exempt_kinds: auto_pause_exempt.clone(),
    }
}

fn file(text: &str) -> Option<(super::KindFile, String)> {
    Some((
        parse_file("news/kind.toml", text).expect("parses"),
        "news/kind.toml".to_owned(),
    ))
}

#[test]
fn a_file_sets_every_key_and_the_variables_add_to_it() {
    let none = BTreeSet::new();
    let settings = merge(
        &kind("news"),
        file(
            "lane = \"bulk\"\nessential = false\nfrom = \"News <news@acme.example>\"\n\
             reply_to = \"editors@acme.example\"\nexpire_after = \"3d\"\nauto_pause = true\n",
        ),
        &variables(None, None, &none, &none),
    )
    .expect("merges");
    assert_eq!(settings.lane, Lane::Bulk);
    assert_eq!(settings.expire_after, Some(Duration::from_secs(3 * 86_400)));
    assert_eq!(settings.auto_pause, Some(true));
    assert_eq!(
        settings.from.map(|f| f.to_string()).as_deref(),
        Some("News <news@acme.example>")
    );
    // A variable alone sets what the file leaves out.
    let bulk = Lanes::parse("news").expect("parses");
    let settings = merge(
        &kind("news"),
        file("essential = true\n"),
        &variables(Some(&bulk), None, &none, &none),
    )
    .expect("merges");
    assert_eq!((settings.lane, settings.essential), (Lane::Bulk, true));
}

#[test]
fn a_setting_given_both_ways_must_agree() {
    let none = BTreeSet::new();
    let bulk = Lanes::parse("news").expect("parses");
    let lane = merge(
        &kind("news"),
        file("lane = \"transactional\"\n"),
        &variables(Some(&bulk), None, &none, &none),
    )
    .unwrap_err()
    .to_string();
    assert!(
        lane.contains("OUTBOXD_BULK_KINDS") && lane.contains("news/kind.toml"),
        "{lane}"
    );
    let lifetimes = ExpireAfter::parse("news=1d").expect("parses");
    let lifetime = merge(
        &kind("news"),
        file("expire_after = \"2d\"\n"),
        &variables(None, Some(&lifetimes), &none, &none),
    )
    .unwrap_err()
    .to_string();
    assert!(lifetime.contains("OUTBOXD_EXPIRE_AFTER"), "{lifetime}");
    // The same value both ways is no contradiction.
    let agreed = merge(
        &kind("news"),
        file("expire_after = \"24h\"\n"),
        &variables(None, Some(&lifetimes), &none, &none),
    )
    .expect("agrees");
    assert_eq!(agreed.expire_after, Some(Duration::from_secs(86_400)));
    let judged: BTreeSet<Kind> = [kind("news")].into();
    let paused = merge(
        &kind("news"),
        file("auto_pause = false\n"),
        &variables(None, None, &judged, &none),
    )
    .unwrap_err()
    .to_string();
    assert!(paused.contains("OUTBOXD_AUTO_PAUSE_KINDS"), "{paused}");
    let exempt = merge(
        &kind("news"),
        file("auto_pause = true\n"),
        &variables(None, None, &none, &judged),
    )
    .unwrap_err()
    .to_string();
    assert!(exempt.contains("OUTBOXD_AUTO_PAUSE_EXEMPT_KINDS"), "{exempt}");
}

#[test]
fn an_essential_kind_is_never_judged_by_the_automatic_pause() {
    let none = BTreeSet::new();
    let settings = merge(
        &kind("reset"),
        file("essential = true\n"),
        &variables(None, None, &none, &none),
    )
    .expect("merges");
    assert_eq!(settings.auto_pause, Some(false), "exempt without saying so");
    let judged: BTreeSet<Kind> = [kind("reset")].into();
    let refused = merge(
        &kind("reset"),
        file("essential = true\n"),
        &variables(None, None, &judged, &none),
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("reset is essential"), "{refused}");
}

#[test]
fn each_kind_of_bad_file_is_refused_with_where_and_what() {
    for (text, says) in [
        ("lanes = \"bulk\"\n", "unknown field `lanes`"),
        ("lane = \"newsletter\"\n", "unknown variant `newsletter`"),
        ("essential = \"yes\"\n", "invalid type"),
        ("lane = \n", "string values must be quoted"),
    ] {
        let error = parse_file("news/kind.toml", text).unwrap_err().to_string();
        assert!(
            error.starts_with("news/kind.toml: ") && error.contains(says),
            "{text:?}: {error}"
        );
    }
    let none = BTreeSet::new();
    for (text, says) in [
        ("from = \"not an address\"\n", "says from"),
        ("expire_after = \"0s\"\n", "more than 0s"),
        ("expire_after = \"soon\"\n", "\"soon\""),
    ] {
        let error = merge(&kind("news"), file(text), &variables(None, None, &none, &none))
            .unwrap_err();
        let error = format!("{error:#}");
        assert!(error.contains(says), "{text:?}: {error}");
    }
    assert_eq!(
        parse_file("k", "lane = \"bulk\"\n").unwrap().lane,
        Some(LaneKey::Bulk)
    );
}

#[test]
fn the_built_in_kinds_say_their_settings_and_an_unnamed_kind_has_the_defaults() {
    let none = BTreeSet::new();
    let book = KindBook::load(None, &variables(None, None, &none, &none)).expect("loads");
    let verification = book.settings("account_verification");
    assert!(!verification.essential);
    // Its file leaves the automatic pause to the variables.
    assert_eq!(verification.auto_pause, None);
    assert!(verification.file.as_deref().is_some_and(|f| f.contains("built-in")));
    assert_eq!(book.settings("invoice_notice").lane, Lane::Transactional);
    let unnamed = book.settings("password_reset");
    assert!(!unnamed.essential && unnamed.file.is_none());
    assert!(book.auto_paused().is_empty());
}
