#!/usr/bin/env python3
"""Runs outboxd through hardbyte/postgresql-job-queue-benchmarking, the queue harness other
PostgreSQL queues publish their figures from, without Docker and without editing it:

    python3 bench/harness/run.py -- --phase warmup=warmup:60s --phase clean_1=clean:120s

It fetches the harness beside this repository (../postgresql-job-queue-benchmarking, at the
commit this runner was written for) unless `--harness DIR` names a copy, makes it a Python
3.12 virtualenv with its dependencies, registers outboxd (bench/harness/outboxd_adapter.py,
bench/harness/adapter.json) in its adapter table, and replaces, from the outside and at run
time, the functions that would start, stop and restart PostgreSQL with Docker Compose by
ones that do it with `pg_ctl` on a private cluster (port 15555, role `bench`, the
harness's own postgres.conf). Everything after `--` goes to the harness's `run` command;
`--systems outboxd` is added. Results land in the harness's `results/`.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HARNESS_URL = "https://github.com/hardbyte/postgresql-job-queue-benchmarking"
HARNESS_COMMIT = "93677ca"
DEPENDENCIES = ["psycopg[binary]>=3.2", "matplotlib>=3.9", "pandas>=2.2", "numpy>=2.0", "pydantic>=2"]


def harness_at(path, source):
    """The harness checked out at HARNESS_COMMIT, fetched when missing."""
    if not (path / "bench_harness").is_dir():
        # Its published results (plots, raw CSVs) are left out: the code is all it needs.
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", source, str(path)], check=True)
        git = ["git", "-C", str(path)]
        subprocess.run([*git, "sparse-checkout", "set", "--no-cone", "/*", "!/results/"], check=True)
        subprocess.run([*git, "checkout", "--quiet", HARNESS_COMMIT], check=True)
    return path


def python312():
    """A Python 3.12 that runs: $HARNESS_PYTHON, python3.12 on PATH, or pyenv's."""
    candidates = [os.environ.get("HARNESS_PYTHON"), shutil.which("python3.12"),
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    sys.exit("the harness needs Python 3.12: set HARNESS_PYTHON to one")


def virtualenv(harness):
    """A Python 3.12 virtualenv beside the harness with its dependencies."""
    venv = harness / ".venv-outboxd"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([python312(), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *DEPENDENCIES], check=True)
    return python


class Cluster:
    """A private PostgreSQL where the harness expects its container: 127.0.0.1:15555, role
    `bench`, the harness's postgres.conf."""

    def __init__(self, harness, bindir=None):
        if bindir and not os.path.exists(os.path.join(bindir, "initdb")):
            sys.exit(f"--pg-bindir {bindir}: no initdb there")
        bindir = bindir or subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if not os.path.exists(os.path.join(bindir, "initdb")):
            versions = sorted(os.listdir("/usr/lib/postgresql"), key=int)
            bindir = f"/usr/lib/postgresql/{versions[-1]}/bin"
        self.bindir, self.home = bindir, Path(tempfile.mkdtemp(prefix="outboxd-harness-pg-"))
        os.chmod(self.home, 0o777)
        self.data, self.conf = self.home / "data", harness / "postgres.conf"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*self.as_postgres, f"{bindir}/initdb", "-D", str(self.data), "-U", "bench",
                        "-A", "trust"], check=True, capture_output=True)
        shutil.copy(self.conf, self.data / "harness.conf")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("include 'harness.conf'\nport = 15555\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.home}'\n")
        if self.as_postgres:
            subprocess.run(["chown", "-R", "postgres", str(self.data)], check=True)

    def pg_ctl(self, *args):
        subprocess.run([*self.as_postgres, f"{self.bindir}/pg_ctl", "-D", str(self.data), "-l",
                        str(self.home / "log"), "-w", *args], check=True, capture_output=True)

    def version(self):
        out = subprocess.run([f"{self.bindir}/postgres", "--version"], capture_output=True, text=True)
        return out.stdout.strip()


def inside(args, rest):
    """In the harness's virtualenv: patch, register, run."""
    harness = Path(args.harness).resolve()
    sys.path.insert(0, str(harness))
    from bench_harness import adapters, orchestrator  # the harness's own modules

    cluster = Cluster(harness, args.pg_bindir)

    def start(_image=None):
        cluster.pg_ctl("start")

    def stop(_image=None):
        cluster.pg_ctl("-m", "fast", "stop")

    def restart(_image=None):
        stop()
        start()

    def down(_image=None):
        subprocess.run([*cluster.as_postgres, f"{cluster.bindir}/pg_ctl", "-D", str(cluster.data),
                        "-m", "immediate", "stop"], capture_output=True)

    orchestrator.start_postgres = start
    orchestrator._compose_stop_postgres = stop
    orchestrator._compose_start_postgres = start
    orchestrator._restart_postgres = restart
    orchestrator.stop_postgres = down

    def build(skip):
        if not skip:
            subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=ROOT, check=True)

    def launch(manifest, overrides):
        env = adapters._base_env(manifest, overrides)
        env["OUTBOXD_BIN"] = str(ROOT / "target" / "release" / "outboxd")
        return adapters.LaunchSpec(argv=[args.adapter_python, str(HERE / "outboxd_adapter.py")], env=env)

    adapters.ADAPTERS["outboxd"] = adapters.AdapterEntry(bench_dir=HERE, builder=build, launcher=launch)
    print(f"[outboxd] PostgreSQL for the harness: {cluster.version()}, data in {cluster.data}",
          file=sys.stderr, flush=True)
    sys.argv = ["bench", "run", "--systems", "outboxd", *rest]
    try:
        return orchestrator.main()
    finally:
        down()
        shutil.rmtree(cluster.home, ignore_errors=True)
        # The adapters' spools hold every message their sinks took (gigabytes a cell), read
        # for the ledger, which is in raw.csv by now.
        for spool in glob.glob(os.path.join(tempfile.gettempdir(), "outboxd-harness-*")):
            shutil.rmtree(spool, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", default=str(ROOT.parent / "postgresql-job-queue-benchmarking"))
    parser.add_argument("--harness-source", default=HARNESS_URL, help="where to clone it from")
    parser.add_argument("--pg-bindir", help="the PostgreSQL server's binaries (initdb, pg_ctl, postgres) "
                        "to run the harness on; by default pg_config's, else the newest under /usr/lib/postgresql")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--adapter-python", default=sys.executable, help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.inside:
        return inside(args, rest)
    harness = harness_at(Path(args.harness).resolve(), args.harness_source)
    python = virtualenv(harness)
    # The adapter runs on this Python (it needs psycopg only), the harness on its own.
    command = [str(python), __file__, "--inside", "--harness", str(harness),
               "--adapter-python", sys.executable,
               *(["--pg-bindir", str(Path(args.pg_bindir).resolve())] if args.pg_bindir else []), "--", *rest]
    return subprocess.run(command, cwd=harness).returncode


if __name__ == "__main__":
    sys.exit(main())
