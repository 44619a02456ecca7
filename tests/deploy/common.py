"""What the deployment checks share: paths, outboxd's own defaults read from its source,
YAML loading, running promtool/amtool, and one way to fail.

Each check_*.py runs on its own (`python3 tests/deploy/check_probes.py`) and exits 0, or 1
with a message naming the file and what is wrong. outboxd's defaults are read from
src/config.rs (and src/config/) and src/http/mod.rs; a caller that knows them better (the Rust test, from clap)
passes them: --listen 0.0.0.0:9898 --shutdown-timeout 30s --metrics-path /metrics
--liveness-path /livez --readiness-path /readyz.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose"
# Kubernetes versions the manifests must be valid for: an old supported one and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29", "latest")


class CheckFailed(Exception):
    """A check found something wrong; the message says what and where."""


def fail(message: str) -> None:
    raise CheckFailed(message)


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ---- outboxd's facts ------------------------------------------------------------------------


@dataclass
class Facts:
    """What outboxd serves and how it stops, by default."""

    defaults: dict[str, str]  # OUTBOXD_* variable -> default value, from src/config.rs
    variables: set[str]  # every environment variable outboxd reads (src/config*, src/cli.rs)
    routes: set[str]  # the paths src/http/mod.rs routes on OUTBOXD_LISTEN
    subcommands: set[str]  # outboxd's subcommands, from src/cli.rs
    metrics_path: str
    liveness_path: str
    readiness_path: str

    def unknown_variables(self, env: dict[str, str]) -> list[str]:
        """Names in env that outboxd does not read (OTEL_* is the OpenTelemetry SDK's)."""
        return sorted(n for n in env if n not in self.variables and not n.startswith("OTEL_"))

    def listen(self, env: dict[str, str]) -> str:
        return env.get("OUTBOXD_LISTEN") or self.defaults["OUTBOXD_LISTEN"]

    def shutdown_seconds(self, env: dict[str, str]) -> float:
        return parse_duration(env.get("OUTBOXD_SHUTDOWN_TIMEOUT") or self.defaults["OUTBOXD_SHUTDOWN_TIMEOUT"])


def config_defaults(source: str) -> dict[str, str]:
    """Each `#[arg(..., env = "X", default_value = "v")]` of src/config.rs, as {X: v}."""
    defaults = {}
    for attribute in re.finditer(r"#\[arg\((.*?)\)\]\s*\n\s*pub \w+", source, re.DOTALL):
        body = attribute.group(1)
        env = re.search(r'env\s*=\s*"(\w+)"', body)
        value = re.search(r'default_value\s*=\s*"([^"]*)"', body) or re.search(r"default_value_t\s*=\s*([\w.]+)", body)
        if env and value:
            defaults[env.group(1)] = value.group(1)
    return defaults


def facts(args: argparse.Namespace) -> Facts:
    # The options live in src/config.rs and its rooms under src/config/.
    config = "\n".join(
        path.read_text(encoding="utf-8")
        for path in [ROOT / "src" / "config.rs", *sorted((ROOT / "src" / "config").glob("**/*.rs"))]
    )
    http = (ROOT / "src" / "http" / "mod.rs").read_text(encoding="utf-8")
    cli = (ROOT / "src" / "cli.rs").read_text(encoding="utf-8")
    defaults = config_defaults(config)
    if args.listen:
        defaults["OUTBOXD_LISTEN"] = args.listen
    if args.shutdown_timeout:
        defaults["OUTBOXD_SHUTDOWN_TIMEOUT"] = args.shutdown_timeout
    for name in ("OUTBOXD_LISTEN", "OUTBOXD_SHUTDOWN_TIMEOUT"):
        check(name in defaults, f"src/config.rs: no default found for {name} (pass it as an argument)")
    routes = set(re.findall(r'\.route\("(/[^"]*)"', http))
    enum = re.search(r"pub enum Command \{(.*?)\n\}", cli, re.DOTALL)
    check(enum is not None, "src/cli.rs: no `pub enum Command` found")
    subcommands = {
        re.sub(r"(?<!^)([A-Z])", r"-\1", name).lower()
        for name in re.findall(r"^\s{4}([A-Z]\w*)\s*[({,]", enum.group(1), re.MULTILINE)
    }
    variables = set(re.findall(r'env\s*=\s*"(\w+)"', config + cli)) | {"RUST_LOG"}
    return Facts(
        defaults=defaults,
        variables=variables,
        routes=routes,
        subcommands=subcommands,
        metrics_path=args.metrics_path,
        liveness_path=args.liveness_path,
        readiness_path=args.readiness_path,
    )


def parse_duration(text: str) -> float:
    """humantime's common forms: 30s, 500ms, 2m, 1h30m, 7d."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)\s*(ms|s|m|h|d)", text.strip())
    check(bool(parts) and "".join(n + u for n, u in parts) == text.replace(" ", ""),
          f"cannot read the duration {text!r}")
    return sum(int(n) * units[u] for n, u in parts)


def port_of(address: str) -> int:
    """The port of host:port, [v6]:port or a URL's authority."""
    match = re.search(r":(\d+)$", address.strip())
    check(match is not None, f"no port in the address {address!r}")
    return int(match.group(1))


# ---- files and tools --------------------------------------------------------------------------


def load_documents(path: Path) -> list[dict]:
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except yaml.YAMLError as e:
        fail(f"{rel(path)} is not valid YAML: {e}")
    return [d for d in docs if d is not None]


def load_one(path: Path) -> dict:
    docs = load_documents(path)
    check(len(docs) == 1, f"{rel(path)}: expected one document, found {len(docs)}")
    return docs[0]


def tool(name: str, package: str) -> str:
    found = shutil.which(name)
    check(found is not None, f"`{name}` is not installed (Debian package `{package}`)")
    return found


def run(command: list[str], what: str, cwd: Path | None = None, stdout_only: bool = False) -> str:
    """The command's output (stdout and stderr, or stdout only); fails when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        fail(f"{what} failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    return result.stdout if stdout_only else result.stdout + result.stderr


# ---- running a check --------------------------------------------------------------------------


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--listen", help="OUTBOXD_LISTEN's default (else read from src/config.rs)")
    parser.add_argument("--shutdown-timeout", help="OUTBOXD_SHUTDOWN_TIMEOUT's default (else from src/config.rs)")
    parser.add_argument("--metrics-path", default="/metrics")
    parser.add_argument("--liveness-path", default="/livez")
    parser.add_argument("--readiness-path", default="/readyz")
    parser.add_argument("--outboxd", help="the outboxd binary, for the checks that run it")
    return parser


def main(name: str, body: Callable[[argparse.Namespace], list[str]], description: str) -> None:
    """Runs a check: prints `ok: NAME` and what it checked, or `FAIL: NAME` and why; exits 0 or 1."""
    args = arguments(description).parse_args()
    try:
        notes = body(args)
    except CheckFailed as e:
        print(f"FAIL: {name}: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception:  # a bug in the check itself, or a file it cannot read
        print(f"FAIL: {name}: the check crashed:\n{traceback.format_exc()}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {name}")
    for note in notes:
        print(f"  {note}")
