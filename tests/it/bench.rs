//! The benchmark, run at a tiny size so that it keeps working. It measures; nothing here
//! asserts a time.

use std::process::Command;

use crate::helpers::python;

#[test]
fn the_benchmark_runs_every_scenario_at_a_tiny_size() {
    let output = Command::new(python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/run.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_outboxd")])
        .args([
            "--messages",
            "300",
            "--baseline-messages",
            "100",
            "--pooled-messages",
            "100",
            "--relay-messages",
            "60",
            "--relay-seconds",
            "10",
            "--lanes-bulk",
            "200",
            "--lanes-seconds",
            "2",
            "--dbcost-messages",
            "100",
            "--dbcost-rate",
            "50",
            "--dbcost-seconds",
            "2",
            "--dbcost-steady-runs",
            "1",
            "--big-rows",
            "2000",
        ])
        .args([
            "--duration",
            "2",
            "--rate",
            "50",
            "--idle",
            "2",
            "--repeat",
            "1",
            "--longtx",
            "2",
            "--longtx-window",
            "1",
        ])
        .output()
        .expect("run bench/run.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for table in [
        "### Drain",
        "### Defaults",
        "### Latency",
        "### Long transaction",
        "### Idle",
        "### Big table",
        "### Replicas",
        "### Pooled",
        "### Pooled latency",
        "### Relay that pushes back",
        "### Lanes",
        "### Database cost",
        "### Database cost in steady traffic",
        "### Statements",
        "### Baseline",
    ] {
        assert!(stdout.contains(table), "no {table:?} table:\n{stdout}");
    }
    // The latency sweep ends with its fit of what a message and a cycle cost.
    assert!(stdout.contains("Fit CPU ms/msg = W + B / n"), "{stdout}");
    // graphile-worker (`npm ci --prefix bench`, which .ci/run does) is measured beside
    // outboxd, in the drain and in steady traffic, where outboxd runs over a table with
    // history and over an empty one.
    for row in [
        "| graphile-worker |",
        "| graphile-worker, its defaults |",
        "| outboxd, 100000 sent rows |",
        "| outboxd, empty table |",
    ] {
        assert!(stdout.contains(row), "no {row:?} row:\n{stdout}");
    }
    // The replicas scenario counts what the sink received: every message, once.
    assert!(
        stdout.contains("| 2 | 8 | ") && stdout.contains("| 300 | 0 |"),
        "{stdout}"
    );
}
