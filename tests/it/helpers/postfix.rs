//! A private, real Postfix (tests/support/postfix.py) per test: the application's relay,
//! or a mail system that accepts a message for a dead mailbox and sends its real DSN to the
//! envelope sender. Stopped when dropped.

use std::path::Path;
use std::process::Command;

use super::{free_port, python};

pub struct Postfix {
    pub port: u16,
    dir: tempfile::TempDir,
    flags: Vec<String>,
}

impl Postfix {
    /// Started on a free port with `flags` as postfix.py's `start` takes them (`--relay
    /// HOST:PORT`, `--dead-domain D`, `--transport D=HOST:PORT`).
    pub fn start(flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("postfix dir");
        let postfix = Self {
            port: free_port(),
            dir,
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        };
        postfix.start_again();
        postfix
    }

    /// Starts it again after [`Postfix::stop`], with its queue as it was.
    pub fn start_again(&self) {
        let port = self.port.to_string();
        let mut args = vec!["--port", &port];
        args.extend(self.flags.iter().map(String::as_str));
        let said = self.run("start", &args);
        assert!(said.contains("READY"), "postfix did not start: {said}");
    }

    pub fn stop(&self) {
        self.run("stop", &[]);
    }

    /// Messages in its queue, not yet delivered or bounced.
    pub fn queued(&self) -> usize {
        self.run("queue", &[]).trim().parse().expect("a count")
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// The outbox id of every message it took, once per time it took one: its log's
    /// `message-id=<outbox-ID.TAG@DOMAIN>` lines.
    pub fn message_ids_taken(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| line.contains("/cleanup["))
            .filter_map(|line| line.split("message-id=<outbox-").nth(1))
            .filter_map(|rest| rest.split(['.', '@']).next())
            .map(str::to_owned)
            .collect()
    }

    /// Its log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("maillog")).unwrap_or_default()
    }

    fn run(&self, command: &str, args: &[&str]) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/postfix.py");
        let output = Command::new(python())
            .arg(script)
            .args([command, "--dir"])
            .arg(self.dir.path())
            .args(args)
            .output()
            .expect("run postfix.py");
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "postfix.py {command}: {said}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        said
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        self.stop();
    }
}
