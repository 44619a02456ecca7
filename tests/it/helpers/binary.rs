//! outboxd itself: its configuration as the binary parses it, the application built in
//! process, and the binary run as a child process.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Parser as _;
use outboxd::app::App;
use outboxd::cli::{Cli, Command as CliCommand};
use outboxd::config::RunConfig;

use super::*;

pub const FROM: &str = "Outbox Test <outbox@example.test>";

/// `outboxd run`'s configuration, parsed from flags exactly as the binary does.
pub fn config(db: &TestDb, smtp_url: Option<&str>, extra: &[&str]) -> RunConfig {
    let mut args = vec!["outboxd", "run", "--database-url", &db.url];
    if let Some(url) = smtp_url {
        args.extend(["--smtp-url", url, "--from", FROM]);
    }
    // Many apps run at once in this process: each gets its own port unless a test picks one.
    if !extra.contains(&"--listen") {
        args.extend(["--listen", "127.0.0.1:0"]);
    }
    args.extend(extra);
    let cli = Cli::try_parse_from(args).expect("arguments parse");
    let CliCommand::Run(run) = cli.command else {
        unreachable!("parsed a run command")
    };
    run.validate().expect("valid configuration")
}

/// The real application, built as `outboxd run` builds it.
pub async fn app(db: &TestDb, smtp_url: Option<&str>, extra: &[&str]) -> App {
    App::build(config(db, smtp_url, extra))
        .await
        .expect("app builds")
}

/// The one line a command that refused to run printed, after checking it failed.
pub fn refusal(output: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it ran: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

/// A one-line refusal ([`refusal`]) that begins `error: ` and says `says`.
pub fn refusal_saying(output: &std::process::Output, says: &str) -> String {
    let stderr = refusal(output);
    assert!(
        stderr.starts_with("error: ") && stderr.contains(says),
        "{stderr:?} does not say {says:?}"
    );
    stderr
}

/// `outboxd run` with `flags` on a database nobody answers at: its one-line refusal, which
/// says `says` ([`refusal_saying`]). For options refused before anything connects.
pub fn run_refused(flags: &[&str], says: &str) -> String {
    let output = outboxd()
        .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
        .args(flags)
        .output()
        .expect("outboxd run");
    refusal_saying(&output, says)
}

/// The binary, with no OUTBOXD_* or DATABASE_URL from the test's own environment, and an
/// HTTP port of its own unless a test names one (many run at once).
pub fn outboxd() -> Command {
    program(std::path::Path::new(env!("CARGO_BIN_EXE_outboxd")))
}

/// An outboxd binary at `path` ([`outboxd`]'s or another release's), with the same clean
/// environment and port.
pub fn program(path: &std::path::Path) -> Command {
    let mut command = Command::new(path);
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") || key == "DATABASE_URL" || key == "RUST_LOG" {
            command.env_remove(key);
        }
    }
    command.env("OUTBOXD_LISTEN", "127.0.0.1:0");
    command
}

/// The real outboxd binary, running `run` until dropped (or stopped with SIGTERM).
pub struct Outboxd {
    pub child: Child,
    pub http: String,
    /// What it wrote to stderr so far, read by a thread as it comes: a pipe nobody read
    /// would fill, and block the process at its next log line.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Outboxd {
    /// Starts `outboxd run` with these flags on a free port, and waits until it is ready.
    pub async fn start(db_url: &str, flags: &[&str], envs: &[(&str, &str)]) -> Self {
        let this = Self::start_unready(db_url, flags, envs);
        until_ready(&this.http, "/readyz", "outboxd ready").await;
        this
    }

    /// Starts `outboxd run` sending to the SMTP server at `smtp_url` from `a@example.com`,
    /// with these flags besides, and waits until it is ready.
    pub async fn sending_to(
        db_url: &str,
        smtp_url: &str,
        flags: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let mut all = vec!["--smtp-url", smtp_url, "--from", "a@example.com"];
        all.extend(flags);
        Self::start(db_url, &all, envs).await
    }

    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Starts the binary without waiting for it to be ready.
    pub fn start_unready(db_url: &str, flags: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::start_program(outboxd(), db_url, flags, envs)
    }

    /// Starts `run` of the binary `program` ([`program`]) without waiting for it to be ready.
    pub fn start_program(
        mut program: Command,
        db_url: &str,
        flags: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let http = format!("127.0.0.1:{}", free_port());
        let mut child = program
            .args(["run", "--database-url", db_url, "--listen", &http])
            .args(flags)
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start outboxd");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (mut pipe, kept) = (child.stderr.take().expect("stderr"), stderr.clone());
        std::thread::spawn(move || {
            let mut chunk = [0; 8192];
            while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut chunk) {
                let text = String::from_utf8_lossy(&chunk[..n]);
                kept.lock().expect("stderr kept").push_str(&text);
            }
        });
        Self {
            child,
            http,
            stderr,
        }
    }

    /// What it has written to stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().expect("stderr kept").clone()
    }

    /// Waits for the process to exit; returns its exit status and stderr.
    pub fn wait(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let status = poll_until_blocking(within, "outboxd to exit", || {
            self.child.try_wait().expect("wait")
        });
        // The reader thread ends with the pipe: wait until it has read the last of it.
        poll_until_blocking(Duration::from_secs(5), "stderr read to its end", || {
            (std::sync::Arc::strong_count(&self.stderr) == 1).then_some(())
        });
        let stderr = self.stderr.lock().expect("stderr kept").clone();
        (status, stderr)
    }
}

impl Drop for Outboxd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
