//! Commands the tests run (outboxd's subcommands, promtool, python, PostgreSQL's tools):
//! run once, and read as what they said.

use std::process::Command;

/// `outboxd args` on the database at `db_url`, as the operator `user` (`$USER`).
pub fn outboxd_as(user: &str, db_url: &str, args: &[&str]) -> Command {
    let mut command = super::outboxd();
    command
        .args(args)
        .args(["--database-url", db_url])
        .env("USER", user);
    command
}

/// `outboxd preview` of `kind` with `payload` and `extra` flags, which must succeed: what it
/// showed.
pub fn preview(kind: &str, payload: &str, extra: &[&str]) -> String {
    let mut command = super::outboxd();
    command
        .args(["preview", "--kind", kind, "--payload", payload])
        .args(extra);
    succeeds(&mut command, "outboxd preview")
}

/// Runs `command` to its end (`what` names it if it cannot start): whether it succeeded,
/// its standard output and its standard error.
pub fn said(command: &mut Command, what: &str) -> (bool, String, String) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `command`, which must succeed (else the test fails with everything it printed), and
/// returns what it wrote to its standard output.
pub fn succeeds(command: &mut Command, what: &str) -> String {
    String::from_utf8_lossy(&bytes_from(command, what)).into_owned()
}

/// As [`succeeds`], the standard output as bytes (a key in DER, say).
pub fn bytes_from(command: &mut Command, what: &str) -> Vec<u8> {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}
