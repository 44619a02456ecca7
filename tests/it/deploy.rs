//! The deployment artifacts (Dockerfile, deploy/kubernetes, deploy/compose, the monitoring
//! mixin and the files generated from it) checked offline by tests/deploy/check_all.py,
//! given outboxd's own defaults, so that a changed default the manifests do not follow
//! fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory as _;
use outboxd::cli::Cli;

use crate::helpers::python;
use crate::helpers::succeeds;

fn manifest(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The default of `outboxd run --<long>`, as the command line has it.
fn run_default(long: &str) -> String {
    let command = Cli::command();
    let run = command.find_subcommand("run").expect("a `run` subcommand");
    let arg = run
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .unwrap_or_else(|| panic!("`outboxd run` has no --{long}"));
    arg.get_default_values()
        .first()
        .unwrap_or_else(|| panic!("--{long} has no default"))
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_deployment_artifacts_validate_offline_and_agree_with_what_outboxd_serves() {
    succeeds(
        Command::new(python())
            .arg(manifest("tests/deploy/check_all.py"))
            .args(["--listen", &run_default("listen")])
            .args(["--shutdown-timeout", &run_default("shutdown-timeout")])
            .args(["--outboxd", env!("CARGO_BIN_EXE_outboxd")]),
        "tests/deploy/check_all.py",
    );
}

#[tokio::test]
async fn the_deployments_probe_paths_answer_200_on_a_running_outboxd() {
    let deployment =
        std::fs::read_to_string(manifest("deploy/kubernetes/deployment.yaml")).unwrap();
    let paths: Vec<&str> = deployment
        .lines()
        .filter_map(|line| line.trim().strip_prefix("path: "))
        .collect();
    assert!(
        paths.contains(&"/livez") && paths.contains(&"/readyz"),
        "{paths:?}"
    );
    let db = crate::helpers::TestDb::new().await;
    let mut app = crate::helpers::app(&db, None, &[]).await;
    app.spawn_background(tokio_util::sync::CancellationToken::new());
    let addr = app.http_addr().to_string();
    for path in paths {
        crate::helpers::eventually(std::time::Duration::from_secs(30), path, || async {
            crate::helpers::http_get(&addr, path).await.0 == 200
        })
        .await;
    }
}
