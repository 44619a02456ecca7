//! A rolling upgrade as Kubernetes runs one: the migrate Job applies the new release's
//! migrations while the previous release's replicas run, then new replicas start beside
//! the old ones until the rollout has replaced them all.

use std::time::Duration;

use crate::helpers::{
    Outboxd, SmtpServer, TestDb, eventually, outboxd, previous_release, succeeds,
};

#[tokio::test]
async fn the_previous_release_keeps_delivering_on_the_migrated_schema_beside_this_one_each_message_once()
 {
    let db = TestDb::empty().await;
    let smtp = SmtpServer::start();
    migrate(previous_release(), &db);
    let old = Outboxd::previous_release_sending_to(&db.url, &smtp.url()).await;
    db.insert_many("account_verification", 200).await;
    smtp.wait_for(200, Duration::from_secs(60)).await;

    // The migrate Job: this release's migrations, under the running old replica, which then
    // restarts (a pod evicted mid-rollout) and starts on the migrated schema.
    migrate(outboxd(), &db);
    old.sigterm();
    let (status, _) = old.wait(Duration::from_secs(30));
    assert!(status.success());
    let old = Outboxd::previous_release_sending_to(&db.url, &smtp.url()).await;
    db.insert_many("account_verification", 200).await;
    smtp.wait_for(400, Duration::from_secs(60)).await;
    assert_eq!(
        old.sent_total().await,
        200.0,
        "the restarted old replica sent them"
    );

    // A new replica beside the old one; both claim from the same table.
    let new = Outboxd::sending_to(&db.url, &smtp.url(), &["--batch-size", "5"], &[]).await;
    db.insert_many("account_verification", 600).await;
    let received = smtp.wait_for(1000, Duration::from_secs(60)).await;

    let mut ids: Vec<_> = received.iter().map(|m| m.outbox_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (received.len(), ids.len()),
        (1000, 1000),
        "each message once"
    );
    eventually(
        Duration::from_secs(30),
        "every outcome recorded",
        || async { db.count("dispatched").await == 1000 },
    )
    .await;
    let (by_old, by_new) = (old.sent_total().await, new.sent_total().await);
    assert_eq!(
        by_old + by_new,
        800.0,
        "the restarted old replica's and the new one's"
    );
    assert!(by_old > 200.0 && by_new > 0.0, "old {by_old}, new {by_new}");
}

/// Runs `outboxd migrate` of `release` on `db`, and checks it succeeded.
fn migrate(mut release: std::process::Command, db: &TestDb) {
    succeeds(
        release.args(["migrate", "--database-url", &db.url]),
        "outboxd migrate",
    );
}
