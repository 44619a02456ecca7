//! What someone else wrote (an operator's pause reason, a caller's actor name, a database
//! role's name) reaches a terminal or the admin page with its control and reordering
//! characters shown as escapes: RIGHT-TO-LEFT OVERRIDE cannot make a line say what was not
//! written, and an escape sequence cannot drive an operator's terminal.

use std::time::Duration;

use sqlx::Connection as _;

use crate::admin::{TOKEN, admin_app, basic};
use crate::helpers::{TestDb, http_full, outboxd, poll_until};

/// RIGHT-TO-LEFT OVERRIDE: "reason gpj.exe" reads as "reason exe.jpg".
const RLO: char = '\u{202E}';

#[tokio::test]
async fn a_pause_s_reason_and_actor_are_shown_escaped_by_the_cli_and_the_page() {
    let db = TestDb::new().await;
    let (_app, addr) = admin_app(&db, None, &[]).await;
    let reason = format!("bounces {RLO}gpj.exe");
    let paused = outboxd()
        .args(["pause", "--kind", "workspace_invite", "--reason", &reason])
        .args(["--database-url", &db.url])
        .env("USER", format!("mallory{RLO}nimda"))
        .output()
        .expect("outboxd pause");
    assert!(paused.status.success(), "{paused:?}");
    let said = String::from_utf8(paused.stdout).unwrap();
    assert!(
        said.contains("bounces \\u{202e}gpj.exe") && !said.contains(RLO),
        "{said}"
    );

    let listed = outboxd()
        .args(["pauses", "--database-url", &db.url])
        .output()
        .expect("outboxd pauses");
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains("bounces \\u{202e}gpj.exe"), "{listed}");
    assert!(listed.contains("mallory\\u{202e}nimda"), "{listed}");
    assert!(!listed.contains(RLO), "{listed:?}");

    let page = http_full(
        &addr,
        "GET",
        "/admin",
        &[("Authorization", basic("ops", TOKEN).as_str())],
        "",
    )
    .await
    .unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("bounces \\u{202e}gpj.exe"),
        "{}",
        page.body
    );
    assert!(page.body.contains("mallory\\u{202e}nimda"), "{}", page.body);
    assert!(!page.body.contains(RLO));
}

#[tokio::test]
async fn a_role_name_with_a_terminal_escape_is_shown_escaped_by_the_doctor() {
    let db = TestDb::new().await;
    let role = format!("app\u{1b}[2J{RLO}{}", uuid::Uuid::new_v4().simple());
    db.exec(format!("CREATE ROLE \"{role}\" LOGIN")).await;
    let encoded: String = url::form_urlencoded::byte_serialize(role.as_bytes()).collect();
    let as_role = db
        .url
        .replacen("postgres@", &format!("{}@", encoded.replace('+', "%20")), 1);
    let mut open = sqlx::PgConnection::connect(&as_role).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT txid_current()")
        .execute(&mut open)
        .await
        .unwrap();
    let out = poll_until(Duration::from_secs(30), "the transaction named", || async {
        let output = outboxd()
            .args([
                "doctor",
                "--database-url",
                &db.url,
                "--long-transaction",
                "1s",
            ])
            .env("OUTBOXD_FROM", "Acme <no-reply@acme.example>")
            .output()
            .expect("outboxd doctor");
        let out = String::from_utf8_lossy(&output.stdout).into_owned();
        out.contains("app\\u{1b}[2J\\u{202e}").then_some(out)
    })
    .await;
    assert!(!out.contains('\u{1b}') && !out.contains(RLO), "{out:?}");
    open.close().await.unwrap();
    db.exec(format!("DROP ROLE \"{role}\"")).await;
}
