//! `outboxd demo` on a machine with PostgreSQL's server binaries and no server running: it
//! starts a throwaway cluster of its own, delivers its samples, and removes the cluster
//! when it stops. Run in a network namespace of its own, where nothing listens on
//! 127.0.0.1:5432, as a machine without a server would be.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn the_demo_starts_a_throwaway_postgresql_where_none_answers_and_removes_it_after() {
    let mut child = std::process::Command::new("unshare")
        .args([
            "-n",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\" demo --listen 127.0.0.1:0",
        ])
        .arg(env!("CARGO_BIN_EXE_outboxd"))
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOXD_SMTP_URL")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("unshare (util-linux) and ip (iproute2), as root");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let (mut directory, mut logged) = (None, 0);
    let started = Instant::now();
    while logged < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the demo did not deliver"
        );
        let line = lines.next().expect("the demo's log").expect("a line");
        if line.contains("started a throwaway PostgreSQL") {
            directory = line
                .split("directory=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(std::path::PathBuf::from);
        }
        if line.contains("NOT SENT") {
            logged += 1;
        }
    }
    let directory = directory.expect("the demo said where its cluster is");
    assert!(directory.join("data").is_dir());
    let status = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.wait().expect("the demo ends");
    assert!(exit.success(), "{exit}");
    assert!(
        !directory.exists(),
        "{} was left behind",
        directory.display()
    );
}
