//! The application's callback endpoint (tests/support/callback_receiver.py), which verifies
//! every request with the `standardwebhooks` package from PyPI.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{eventually, free_port, python, spooled};

/// The secret both sides hold: `whsec_` and the base64 of 32 bytes.
pub const CALLBACK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwAAAAAAAAAAA=";

/// One verified callback, as the receiver read it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Callback {
    pub webhook_id: String,
    #[serde(rename = "type")]
    pub event: String,
    pub timestamp: String,
    pub data: serde_json::Value,
}

impl Callback {
    pub fn message_id(&self) -> i64 {
        self.data["message_id"].as_i64().expect("a message id")
    }
}

/// A running receiver; killed when dropped.
pub struct CallbackReceiver {
    pub port: u16,
    spool: tempfile::TempDir,
    child: Option<Child>,
}

impl CallbackReceiver {
    pub fn start() -> Self {
        let spool = tempfile::tempdir().expect("spool");
        let mut receiver = Self {
            port: free_port(),
            spool,
            child: None,
        };
        receiver.start_again(&[]);
        receiver
    }

    /// Starts it (again) on its port, with the receiver's `flags`.
    pub fn start_again(&mut self, flags: &[&str]) {
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/callback_receiver.py"))
            .args([
                "--port",
                &self.port.to_string(),
                "--secret",
                CALLBACK_SECRET,
                "--spool",
            ])
            .arg(self.spool.path())
            .args(flags)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the callback receiver");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "READY", "the callback receiver did not start");
        self.child = Some(child);
    }

    /// Kills it, as a crash or a deployment would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/outboxd/callbacks?tenant=7", self.port)
    }

    /// Every verified callback, in the order they arrived.
    pub fn received(&self) -> Vec<Callback> {
        spooled(&self.spool.path().join("callbacks.jsonl"))
    }

    /// Requests that did not verify.
    pub fn forged(&self) -> Vec<serde_json::Value> {
        spooled(&self.spool.path().join("forged.jsonl"))
    }

    /// Waits until `n` callbacks arrived.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Callback> {
        let what = format!("{n} callbacks received");
        eventually(within, &what, || async { self.received().len() >= n }).await;
        self.received()
    }
}

impl Drop for CallbackReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}
