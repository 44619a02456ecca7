//! The producer crate (`outboxd-producer`), as an application uses it: in its own sqlx
//! transaction, without outboxd's stacks, in outboxd's schema and through a transaction
//! pooler when the deployment has them.

use std::time::Duration;

use outboxd_producer::{EnqueueError, InvalidMessage, NewMessage, Outbox};

use crate::helpers::succeeds;
use crate::helpers::{Outboxd, SmtpServer, TestDb, verification};
use crate::own_schema::SCHEMA;
use crate::poolers::{PgBouncer, each_once};

const FROM: (&str, &str) = ("OUTBOXD_FROM", "Acme <no-reply@acme.example>");

#[tokio::test]
async fn an_email_enqueued_in_the_applications_transaction_is_sent_once_it_commits() {
    let db = TestDb::new().await;
    let smtp = SmtpServer::start();
    let smtp_url = smtp.url();
    let _outboxd = Outboxd::start(&db.url, &[], &[("OUTBOXD_SMTP_URL", &smtp_url), FROM]).await;
    let mut tx = db
        .transaction_after("CREATE TABLE app_users (email text)")
        .await;
    let id = outboxd_producer::enqueue(
        &mut *tx,
        NewMessage::new("account_verification", verification("ada@example.com")).unwrap(),
    )
    .await
    .expect("enqueued");
    tx.commit().await.unwrap();
    let received = smtp.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(
        received[0].header("X-Outbox-Id"),
        Some(id.to_string().as_str())
    );
}

#[tokio::test]
async fn a_rolled_back_transaction_takes_its_email_with_it() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    outboxd_producer::enqueue(
        &mut *tx,
        NewMessage::new("account_verification", verification("ada@example.com")).unwrap(),
    )
    .await
    .expect("enqueued");
    tx.rollback().await.unwrap();
    assert_eq!(db.count("all").await, 0);
}

#[tokio::test]
async fn each_kind_of_bad_message_is_refused_before_the_database_sees_it() {
    let db = TestDb::new().await;
    let verification = || verification("a@example.com");
    let good = || NewMessage::new("account_verification", verification()).unwrap();
    let mut nul_deep = verification();
    nul_deep["items"] = serde_json::json!(["ok", {"note": "a\u{0}b"}]);
    let mut nul_key = verification();
    nul_key["na\u{0}me"] = serde_json::json!(1);
    for (message, refused) in [
        (
            NewMessage::new("../etc", verification()),
            InvalidMessage::Kind("../etc".into()),
        ),
        (
            NewMessage::new("account_verification", serde_json::json!([1])),
            InvalidMessage::PayloadNotObject,
        ),
        (good().with_priority(-1), InvalidMessage::Priority(-1)),
        (
            good().with_idempotency_key(""),
            InvalidMessage::IdempotencyKey,
        ),
        (
            good().with_traceparent("0".repeat(129)),
            InvalidMessage::Traceparent,
        ),
        (
            NewMessage::new("account_verification", nul_deep),
            InvalidMessage::Nul("payload.items[1].note".into()),
        ),
        (
            NewMessage::new("account_verification", nul_key),
            InvalidMessage::Nul("payload.na\\u0000me".into()),
        ),
        (
            good().with_idempotency_key("order-1\u{0}"),
            InvalidMessage::Nul("idempotency_key".into()),
        ),
        (
            good().with_tags(["campaign spring"]),
            InvalidMessage::Tag("campaign spring".into()),
        ),
        (good().with_tags([""]), InvalidMessage::Tag(String::new())),
        (
            good().with_tags(["x".repeat(65)]),
            InvalidMessage::Tag("x".repeat(65)),
        ),
        (
            good().with_tags((0..11).map(|i| format!("t{i}"))),
            InvalidMessage::TooManyTags(11),
        ),
    ] {
        // Refused where it is built: nothing invalid reaches a transaction.
        assert_eq!(message, Err(refused));
    }
    // A refusal converts into the enqueue's error, for one `?` in a function that builds
    // and enqueues; the application's transaction stays usable.
    let mut tx = db.pool.begin().await.unwrap();
    let enqueued: Result<i64, EnqueueError> = async {
        let message = good().with_priority(-1)?;
        outboxd_producer::enqueue(&mut *tx, message).await
    }
    .await;
    assert!(
        matches!(
            enqueued,
            Err(EnqueueError::Invalid(InvalidMessage::Priority(-1)))
        ),
        "{enqueued:?}"
    );
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count("all").await, 0, "nothing was written");
    let said = InvalidMessage::Nul("payload.items[1].note".into()).to_string();
    assert!(said.contains("payload.items[1].note holds a NUL"), "{said}");
}

#[tokio::test]
async fn in_outboxds_schema_through_a_transaction_pooler_each_message_is_enqueued_and_sent() {
    let db = TestDb::empty().await;
    crate::own_schema::in_schema(&db.url, &["migrate"]);
    let bouncer = PgBouncer::start("transaction", 2);
    bouncer.wait_until_up().await;
    // PgBouncer refuses the startup parameter sqlx sends by default.
    let options: sqlx::postgres::PgConnectOptions = bouncer.url(&db).parse().unwrap();
    let pooled = sqlx::PgPool::connect_with(options.extra_float_digits(None))
        .await
        .unwrap();
    let smtp = SmtpServer::start();
    let smtp_url = smtp.url();
    let _outboxd = Outboxd::start(
        &db.url,
        &[],
        &[
            ("OUTBOXD_SMTP_URL", &smtp_url),
            FROM,
            ("OUTBOXD_SCHEMA", SCHEMA),
        ],
    )
    .await;
    let outbox = Outbox::default()
        .in_schema(&SCHEMA.parse().unwrap())
        .prepared(false);
    // Each in a transaction of its own, as requests do, on the pooler's two server sessions.
    for i in 0..50 {
        let mut tx = pooled.begin().await.unwrap();
        let message = NewMessage::new(
            "account_verification",
            verification(&format!("user{i}@example.com")),
        )
        .unwrap();
        outbox.enqueue(&mut *tx, message).await.expect("enqueued");
        tx.commit().await.unwrap();
    }
    pooled.close().await;
    smtp.wait_for(50, Duration::from_secs(60)).await;
    each_once(&smtp, 50);
}

#[test]
fn the_crate_pulls_in_none_of_the_daemons_stacks() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = succeeds(
        std::process::Command::new(cargo)
            .args([
                "tree",
                "--locked",
                "-p",
                "outboxd-producer",
                "-e",
                "normal",
                "--prefix",
                "none",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
        "cargo tree",
    );
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split(' ').next())
        .collect();
    assert!(crates.contains(&"sqlx-postgres"), "{tree}");
    for stack in [
        "axum",
        "hyper",
        "tower",
        "lettre",
        "rustls",
        "ring",
        "rsa",
        "tokio",
        "opentelemetry",
        "tracing-subscriber",
        "metrics",
        "minijinja",
        "clap",
    ] {
        assert!(
            !crates.contains(&stack),
            "{stack} in the producer's tree:\n{tree}"
        );
    }
}
