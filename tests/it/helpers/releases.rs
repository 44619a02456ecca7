//! outboxd's previous release, built from this clone's history, for rolling upgrades.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::*;

/// The previous release's (0.2.0) binary ([`program`]), built once by
/// tests/support/previous_release.sh (which .ci/run calls before the suite).
pub fn previous_release() -> Command {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    let binary = BINARY.get_or_init(|| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/previous_release.sh"
        );
        let path = succeeds(&mut Command::new(script), "previous_release.sh");
        PathBuf::from(path.trim())
    });
    program(binary)
}

impl Outboxd {
    /// The previous release's `run`, sending to `smtp_url` from `a@example.com`, ready.
    pub async fn previous_release_sending_to(db_url: &str, smtp_url: &str) -> Self {
        let flags = ["--smtp-url", smtp_url, "--from", "a@example.com"];
        let this = Self::start_program(previous_release(), db_url, &flags, &[]);
        until_ready(&this.http, "/readyz", "the previous release ready").await;
        this
    }

    /// How many messages this replica counted sent, over every series.
    pub async fn sent_total(&self) -> f64 {
        let (_, metrics) = http_get(&self.http, "/metrics").await;
        metrics
            .lines()
            .filter(|line| line.starts_with("outbox_messages_sent_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
