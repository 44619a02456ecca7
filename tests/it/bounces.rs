//! Bounces that come back later (`OUTBOXD_BOUNCE_DOMAIN`, `OUTBOXD_BOUNCE_LISTEN`), end to
//! end: a real Postfix accepts a message for a dead mailbox of its own domain, fails to
//! deliver it, and sends its real DSN to the message's signed return path, which its
//! transport leads to outboxd's listener; the address is suppressed and the bounce is on the
//! message's timeline. An auto-reply, a DSN to a forged return path, mail for another
//! domain and a flood of connections change nothing; a DSN that returns a large original
//! is still read.

use std::time::Duration;

use crate::helpers::{
    Outboxd, Postfix, SmtpTalk, TestDb, eventually, free_port, http_get, metric_value,
};

const DOMAIN: &str = "bounces.test";
const SECRET: &str = "a-bounce-secret-of-32-characters-at-least";

/// outboxd sending through `relay`, with its bounce listener on `listen`.
async fn taking_bounces(db: &TestDb, relay: &str, listen: &str) -> Outboxd {
    let flags = ["--bounce-domain", DOMAIN, "--bounce-listen", listen];
    Outboxd::sending_to(&db.url, relay, &flags, &[("OUTBOXD_BOUNCE_SECRET", SECRET)]).await
}

async fn suppressions(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM outbox_suppressions WHERE $1", true)
        .await
}

/// A DSN as Postfix writes one (tests/support/dsn), to `return_path` about `recipient`.
fn postfix_dsn(return_path: &str, recipient: &str) -> Vec<u8> {
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/dsn/postfix_unknown_user.eml"
    ))
    .expect("sample");
    sample
        .replace("bounces+42.abc@bounces.test", return_path)
        .replace("nobody@dead.test", recipient)
        .into_bytes()
}

#[tokio::test]
async fn a_dsn_from_postfix_for_a_dead_mailbox_suppresses_it_and_shows_on_the_timeline() {
    let db = TestDb::new().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let relay = Postfix::start(&[
        "--dead-domain",
        "dead.test",
        "--transport",
        &format!("{DOMAIN}={listen}"),
    ]);
    let outboxd = taking_bounces(&db, &relay.url(), &listen).await;

    let id = db.verification_to("nobody@dead.test").await;
    eventually(Duration::from_secs(30), "the DSN recorded", || async {
        let reason: Option<String> = sqlx::query_scalar(
            "SELECT reason || ' ' || source FROM outbox_suppressions WHERE address = 'nobody@dead.test'",
        )
        .fetch_optional(&db.pool)
        .await
        .expect("query");
        reason.as_deref() == Some("hard_bounce dsn")
    })
    .await;
    let (event, actor, detail): (String, String, String) = db
        .one_row(
            "SELECT event, actor, detail FROM outbox_message_events \
             WHERE message_id = $1 AND actor = 'dsn'",
            id,
        )
        .await;
    assert_eq!((event.as_str(), actor.as_str()), ("hard_bounce", "dsn"));
    assert!(detail.starts_with("5.1.1"), "{detail}");
    let feedback: String = db
        .scalar("SELECT feedback FROM outbox_messages WHERE id = $1", id)
        .await;
    assert_eq!(feedback, "hard_bounce");

    // The next message to the dead mailbox is not sent.
    let again = db.verification_to("nobody@dead.test").await;
    assert_eq!(db.ended(again).await.0.as_deref(), Some("suppressed"));
    let metrics = http_get(&outboxd.http, "/metrics").await.1;
    let recorded = "outbox_bounce_listener_messages_total{result=\"recorded\"}";
    assert_eq!(
        metric_value(&metrics, recorded),
        Some(1.0),
        "{}",
        relay.log()
    );
}

#[tokio::test]
async fn an_auto_reply_a_forged_return_path_and_other_domains_change_nothing() {
    let db = TestDb::new().await;
    let relay = crate::helpers::SmtpServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let outboxd = taking_bounces(&db, &relay.url(), &listen).await;
    let id = db.verification_to("ada@customer.example").await;
    let sent = relay.wait_for(1, Duration::from_secs(30)).await;
    let return_path = sent[0].mail_from.clone();
    assert!(
        return_path.starts_with(&format!("bounces+{id}.")),
        "{return_path}"
    );
    assert!(
        return_path.ends_with(&format!("@{DOMAIN}")),
        "{return_path}"
    );

    let mut talk = SmtpTalk::connect(&listen).await;
    assert!(talk.greeting.starts_with("220 "), "{}", talk.greeting);
    assert!(
        talk.say("EHLO mx.customer.example")
            .await
            .starts_with("250")
    );
    // An auto-reply to the genuine return path, quoting DSN words in its text.
    let vacation = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/dsn/vacation_auto_reply.eml"
    ))
    .expect("sample");
    let reply = talk
        .send("someone@customer.example", &return_path, &vacation)
        .await;
    assert!(reply.starts_with("250 "), "{reply}");
    // A real DSN's form, to return paths outboxd did not make: another row's id with this
    // signature, one signature digit changed, no signature.
    let other_row = return_path.replacen(&format!("+{id}."), &format!("+{}.", id + 1), 1);
    let mut changed = return_path.clone().into_bytes();
    let last = return_path.find('@').expect("an @") - 1;
    changed[last] = if changed[last] == b'0' { b'1' } else { b'0' };
    let changed = String::from_utf8(changed).expect("text");
    for forged in [other_row, changed, format!("bounces+{id}@{DOMAIN}")] {
        let reply = talk
            .send("", &forged, &postfix_dsn(&forged, "ada@customer.example"))
            .await;
        assert_eq!(reply, "250 2.0.0 ok\r\n", "one answer for every forgery");
    }
    // A DSN to the genuine return path about an address the message was not sent to.
    let reply = talk
        .send(
            "",
            &return_path,
            &postfix_dsn(&return_path, "someone.else@customer.example"),
        )
        .await;
    assert_eq!(reply, "250 2.0.0 ok\r\n");
    // Mail for another domain: no open relay.
    let reply = talk
        .send(
            "",
            "ada@customer.example",
            b"Subject: relay me\r\n\r\nhi\r\n",
        )
        .await;
    assert!(reply.starts_with("550 5.7.1"), "{reply}");
    assert!(talk.say("RSET").await.starts_with("250"));
    assert!(talk.say("NOOP").await.starts_with("250"));
    assert!(talk.say("QUIT").await.starts_with("221"));

    assert_eq!(suppressions(&db).await, 0);
    let events: i64 = db
        .scalar(
            "SELECT count(*) FROM outbox_message_events WHERE actor = 'dsn' AND $1",
            true,
        )
        .await;
    assert_eq!(events, 0);
    let metrics = http_get(&outboxd.http, "/metrics").await.1;
    let counted = |result: &str| {
        metric_value(
            &metrics,
            &format!("outbox_bounce_listener_messages_total{{result=\"{result}\"}}"),
        )
    };
    // The DSN about a stranger names our message but not one of its recipients: forged too.
    assert_eq!(counted("forged"), Some(4.0));
    assert_eq!(counted("not_a_bounce"), Some(1.0));
    assert_eq!(counted("recorded"), Some(0.0));
}

#[tokio::test]
async fn a_flood_of_connections_is_turned_away_and_a_real_dsn_still_gets_in() {
    let db = TestDb::new().await;
    let relay = crate::helpers::SmtpServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let _outboxd = taking_bounces(&db, &relay.url(), &listen).await;
    let id = db.verification_to("gone@customer.example").await;
    let return_path = relay.wait_for(1, Duration::from_secs(30)).await[0]
        .mail_from
        .clone();

    // 200 connections held open at once, each silent after its greeting.
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(SmtpTalk::connect(&listen).await);
    }
    let turned_away = flood
        .iter()
        .filter(|t| t.greeting.starts_with("421 "))
        .count();
    let greeted = flood
        .iter()
        .filter(|t| t.greeting.starts_with("220 "))
        .count();
    assert_eq!(greeted, 32, "the listener's bound");
    assert_eq!(turned_away, 168);
    drop(flood);

    // The flood's connections are gone: a turn is free again.
    let mut talk = SmtpTalk::connect(&listen).await;
    for _ in 0..100 {
        if talk.greeting.starts_with("220 ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        talk = SmtpTalk::connect(&listen).await;
    }
    assert!(talk.greeting.starts_with("220 "), "{}", talk.greeting);
    talk.say("HELO mx.customer.example").await;
    // A DSN that returns the whole original, 300 KiB of attachment in long lines: what is
    // kept of it is read, nothing is refused (a refused DSN would be lost).
    let mut dsn = postfix_dsn(&return_path, "gone@customer.example");
    let end = dsn.len() - b"--CD04C98C2E2.1796595073/postfix.test--\n".len();
    let attachment: Vec<u8> = vec![b'A'; 300 * 1024]
        .chunks(5000)
        .flat_map(|line| line.iter().copied().chain(*b"\n"))
        .collect();
    dsn.splice(end..end, attachment);
    let reply = talk.send("", &return_path, &dsn).await;
    assert_eq!(reply, "250 2.0.0 ok\r\n");
    let feedback: Option<String> = db
        .scalar("SELECT feedback FROM outbox_messages WHERE id = $1", id)
        .await;
    assert_eq!(feedback.as_deref(), Some("hard_bounce"));
}

#[tokio::test]
async fn a_refusal_of_the_sender_or_a_dsn_any_recipient_could_have_sent_suppresses_nobody() {
    let db = TestDb::new().await;
    let relay = crate::helpers::SmtpServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let _outboxd = taking_bounces(&db, &relay.url(), &listen).await;
    let alone = db.verification_to("ada@customer.example").await;
    let payload = serde_json::json!({
        "to": ["ada@team.example", "bob@team.example"],
        "name": "Ada",
        "verify_url": "https://app.example/v",
    });
    let shared = db.enqueue("account_verification", payload).await;
    let sent = relay.wait_for(2, Duration::from_secs(30)).await;
    let return_path = |id: i64| {
        sent.iter()
            .find(|m| m.outbox_id == id.to_string())
            .map(|m| m.mail_from.clone())
            .expect("sent")
    };
    let mut talk = SmtpTalk::connect(&listen).await;
    talk.say("EHLO mx.customer.example").await;
    // Microsoft's refusal of the sender's IP, as a relay that gave up reports it.
    let sender_refused = String::from_utf8(postfix_dsn(&return_path(alone), "ada@customer.example"))
        .expect("text")
        .replace("Status: 5.1.1", "Status: 5.7.708")
        .replace(
            "Diagnostic-Code: X-Postfix; unknown user",
            "Diagnostic-Code: smtp; 550 5.7.708 Service unavailable. Access denied, traffic not accepted from this IP.",
        );
    let reply = talk
        .send("", &return_path(alone), sender_refused.as_bytes())
        .await;
    assert_eq!(reply, "250 2.0.0 ok\r\n");
    // Bob saw the return path of the message he shared with Ada, and says her mailbox is gone.
    let about_ada = postfix_dsn(&return_path(shared), "ada@team.example");
    let reply = talk.send("", &return_path(shared), &about_ada).await;
    assert_eq!(reply, "250 2.0.0 ok\r\n");

    assert_eq!(suppressions(&db).await, 0, "nobody suppressed");
    let marks: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT id, feedback FROM outbox_messages ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        marks,
        [
            (alone, Some("soft_bounce".to_owned())),
            (shared, Some("hard_bounce".to_owned()))
        ],
        "both marked on their timelines"
    );
}

#[tokio::test]
async fn a_dsn_that_cannot_be_recorded_now_is_refused_for_later_and_postfix_delivers_it_again() {
    let db = TestDb::new().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let transport = format!("{DOMAIN}={listen}");
    let relay = Postfix::start(&["--dead-domain", "dead.test", "--transport", &transport]);
    let outboxd = taking_bounces(&db, &relay.url(), &listen).await;
    // An application's transaction holds the suppression list against writes (reads, the
    // claim's among them, go on): no bounce can be recorded.
    let held = db
        .transaction_after("LOCK TABLE outbox_suppressions IN SHARE MODE")
        .await;
    db.verification_to("nobody@dead.test").await;
    let failed = "outbox_bounce_listener_messages_total{result=\"failed\"}";
    eventually(
        Duration::from_secs(60),
        "the DSN refused with a 451",
        || async {
            let metrics = http_get(&outboxd.http, "/metrics").await.1;
            metric_value(&metrics, failed).is_some_and(|n| n >= 1.0)
        },
    )
    .await;
    assert_eq!(relay.queued(), 1, "Postfix keeps the DSN: {}", relay.log());
    // The transaction ends; Postfix's next try is recorded.
    held.rollback().await.expect("rollback");
    eventually(
        Duration::from_secs(60),
        "the DSN recorded on Postfix's retry",
        || async { suppressions(&db).await == 1 },
    )
    .await;
    assert!(
        relay.log().contains("451 4.3.0 could not record it now"),
        "{}",
        relay.log()
    );
}
