//! `outboxd demo` on a machine where no PostgreSQL answers at the demo's address: a
//! throwaway cluster of its own, from the PostgreSQL server binaries installed here, in a
//! temporary directory and on a free port, stopped and removed when the demo ends. With no
//! binaries, one line of what to install.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tracing::info;

/// Where PostgreSQL's server binaries are put by the usual packages, newest first when
/// several versions are there: Debian and Ubuntu, Red Hat, Homebrew, the source build.
const SEARCHED: &[&str] = &[
    "/usr/lib/postgresql",
    "/usr/pgsql",
    "/opt/homebrew/opt",
    "/usr/local/opt",
    "/usr/local/pgsql/bin",
];

/// What to run to get PostgreSQL, said when none is installed.
const INSTALL_HINT: &str = "install PostgreSQL and run the demo again: \
    `sudo apt-get install postgresql` (Debian, Ubuntu), `brew install postgresql@17` (macOS), \
    or `docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17`";

/// A cluster of the demo's own; stopped and removed when dropped.
pub struct DemoCluster {
    server: Child,
    pub port: u16,
    /// Removed last, when dropped, and on every early return of [`Self::start`].
    _dir: Removed,
}

/// A directory removed when dropped.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl DemoCluster {
    /// Starts one, or says why it cannot.
    pub fn start() -> anyhow::Result<Self> {
        let Some(bin) = server_binaries() else {
            bail!(
                "no PostgreSQL answers at the demo's address, and none is installed here: {INSTALL_HINT}"
            );
        };
        let dir =
            std::env::temp_dir().join(format!("outboxd-demo-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).context("cannot make the demo cluster's directory")?;
        let removed = Removed(dir.clone());
        let root = give_to_postgres_user_if_root(&dir)?;
        let as_user = |program: &Path| server_command(root, program);
        let data = dir.join("data");
        let status = as_user(&bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .context("cannot run initdb")?;
        if !status.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&status.stderr).trim()
            );
        }
        // The demo's own address when it is free, so that its DATABASE_URL works as the
        // README says; any free port otherwise.
        let port = free_port(5432).or_else(|_| free_port(0))?;
        let server = as_user(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args([
                "-p",
                &port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-k",
            ])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C in the terminal reaches outboxd, which stops
            // the server after it has drained, not the server under it.
            .process_group(0)
            .spawn()
            .context("cannot start postgres")?;
        info!(directory = %dir.display(), port, bin = %bin.display(), "started a throwaway PostgreSQL for the demo; it is removed when the demo ends");
        Ok(Self {
            server,
            port,
            _dir: removed,
        })
    }

    /// The demo's database in it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/outboxd", self.port)
    }

    /// Waits until the server takes connections.
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        for _ in 0..100 {
            if let Some(exit) = self.server.try_wait()? {
                bail!("the demo's PostgreSQL stopped at start: {exit}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the demo's PostgreSQL did not take connections within 10s")
    }
}

impl Drop for DemoCluster {
    fn drop(&mut self) {
        // SIGINT to the server's process group (runuser and postgres when root): a "fast"
        // shutdown, which ends its sessions; SIGTERM's "smart" one would wait for them.
        // The directory goes after, when `dir` is dropped.
        let group = format!("-{}", self.server.id());
        let _ = Command::new("kill").args(["-INT", "--", &group]).status();
        for _ in 0..100 {
            if matches!(self.server.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.server.wait();
    }
}

/// The directory of `initdb` and `postgres`: on the `PATH`, or under a usual place.
fn server_binaries() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>());
    let mut candidates: Vec<PathBuf> = on_path.collect();
    for place in SEARCHED {
        let place = Path::new(place);
        candidates.push(place.to_path_buf());
        let mut versions: Vec<PathBuf> = std::fs::read_dir(place)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .collect();
        // Newest first, by version number: 17 before 9.6.
        versions.sort_by_key(|bin| std::cmp::Reverse(version_of(bin)));
        candidates.extend(versions);
    }
    candidates
        .into_iter()
        .map(|dir| {
            std::fs::canonicalize(dir.join("initdb")).map_or(dir, |initdb| {
                initdb.parent().map(Path::to_path_buf).unwrap_or_default()
            })
        })
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

/// Whether this runs as root, in which case PostgreSQL (which refuses to run as root) runs
/// as the `postgres` user the packages create, which is given the directory.
fn give_to_postgres_user_if_root(dir: &Path) -> anyhow::Result<bool> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    if root {
        let owned = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .context("cannot give the demo cluster's directory to the postgres user")?;
        if !owned.success() {
            bail!("running as root, the demo needs a `postgres` user to run PostgreSQL as");
        }
    }
    Ok(root)
}

/// A server binary run as this user, or as `postgres` when this is root.
fn server_command(root: bool, program: &Path) -> Command {
    if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// The version numbers in a versioned directory's name (`postgresql@17/bin`: [17]).
fn version_of(bin: &Path) -> Vec<u32> {
    let name = bin
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

/// `wanted` when it is free (0: any free port).
fn free_port(wanted: u16) -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", wanted)).context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}
