//! A PostgreSQL cluster of the test's own, which a test may stop and start.

use std::path::PathBuf;
use std::process::Command;

use super::*;

/// A PostgreSQL cluster of the test's own, on its own port, that the test may stop and
/// start: what a database restart looks like to outboxd.
pub struct PrivateCluster {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

impl PrivateCluster {
    pub fn start() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .max()
            .expect("initdb");
        let dir =
            std::env::temp_dir().join(format!("outboxd-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let cluster = Self {
            port: free_port(),
            dir,
            bin,
        };
        if cluster.as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .expect("chown");
            assert!(status.success());
        }
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        cluster.resume();
        cluster
    }

    fn as_root(&self) -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// PostgreSQL refuses to run as root, so as root the tools run as `postgres`.
    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let program = self.bin.join(tool);
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args);
        command
    }

    fn run(&self, tool: &str, args: &[&str]) {
        succeeds(&mut self.command(tool, args), tool);
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    pub fn resume(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl", &["-D", &data, "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
