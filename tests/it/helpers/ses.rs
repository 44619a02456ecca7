//! Amazon SES's API v2 as moto serves it (tests/support/ses_server.py), per test: the
//! `ses://` relay's far end, with what it sent readable.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::{free_port, poll_until, python, spooled};

/// A message moto's SES took.
#[derive(Debug, Clone, Deserialize)]
pub struct SentBySes {
    pub ses_message_id: String,
    pub outbox_id: String,
    pub message_id: String,
}

pub struct SesServer {
    pub port: u16,
    spool: tempfile::TempDir,
    child: Child,
    _stdin: ChildStdin,
}

impl SesServer {
    /// With `example.com` verified (the tests' From), and `flags` as ses_server.py takes
    /// them.
    pub fn start(flags: &[&str]) -> Self {
        let (port, spool) = (free_port(), tempfile::tempdir().expect("spool"));
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/ses_server.py"))
            .args(["--port", &port.to_string(), "--spool"])
            .arg(spool.path())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "READY", "moto did not start");
        let stdin = child.stdin.take().expect("stdin");
        Self {
            port,
            spool,
            child,
            _stdin: stdin,
        }
    }

    /// What outboxd is given to send through it: its relay URL's endpoint, and credentials
    /// from the environment (moto takes any).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "OUTBOXD_SES_ENDPOINT_URL".to_owned(),
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID".to_owned(), "AKIDTESTING".to_owned()),
            (
                "AWS_SECRET_ACCESS_KEY".to_owned(),
                "testing-secret".to_owned(),
            ),
        ]
    }

    pub fn sent(&self) -> Vec<SentBySes> {
        spooled(&self.spool.path().join("messages.jsonl"))
    }

    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<SentBySes> {
        poll_until(within, &format!("{n} messages sent by SES"), || async {
            let sent = self.sent();
            (sent.len() >= n).then_some(sent)
        })
        .await
    }

    /// SendEmail calls answered 429 (`--throttle-every`).
    pub fn throttled(&self) -> usize {
        std::fs::read_to_string(self.spool.path().join("throttled.jsonl"))
            .map_or(0, |text| text.lines().count())
    }
}

impl Drop for SesServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
