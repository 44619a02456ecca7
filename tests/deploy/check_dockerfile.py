#!/usr/bin/env python3
"""The Dockerfile, checked without Docker (no daemon and no base images here): a multi-stage
build whose build step is `cargo build --release --locked`; everything the build reads at
compile time (include_str!, sqlx::migrate!) is copied and not excluded by .dockerignore,
while target/ and .git are; the runtime stage runs the binary as a numeric non-root user,
the same user the Kubernetes pods and the compose services run as, with `run` by default,
and exposes OUTBOXD_LISTEN's port.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from common import KUBERNETES, ROOT, check, fail

DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore: the last pattern that matches the path or a parent wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            result = not negated
    return result


def compile_time_inputs() -> list[str]:
    """Files the Rust build reads besides the sources: include_str!/include_bytes!
    (relative to the including file) and sqlx::migrate! (relative to the crate). A unit
    test module of its own file (`tests.rs`, declared under `#[cfg(test)]`) is not built by
    the release build."""
    inputs = []
    for source in sorted((ROOT / "src").rglob("*.rs")):
        if source.name == "tests.rs":
            continue
        text = source.read_text(encoding="utf-8")
        for path in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)', text):
            inputs.append((source.parent / path).resolve())
        for path in re.findall(r'migrate!\(\s*"([^"]+)"\s*\)', text):
            inputs.append((ROOT / path).resolve())
    return sorted({str(p.relative_to(ROOT)) for p in inputs})


def body(args) -> list[str]:
    facts = common.facts(args)
    text = DOCKERFILE.read_text(encoding="utf-8")
    steps = instructions(text)
    stages = [rest for keyword, rest in steps if keyword == "FROM"]
    check(len(stages) >= 2, "Dockerfile: not a multi-stage build")
    runtime = stages[-1].split()[0]
    check(runtime.startswith(("gcr.io/distroless/cc-debian12", "debian:bookworm-slim")),
          f"Dockerfile: the runtime image is {runtime}, not distroless/cc-debian12 or debian:bookworm-slim")
    check("cannot be pulled" in text, "Dockerfile: the comment that images cannot be pulled here is missing")
    check(any(k == "RUN" and "cargo build --release --locked" in r for k, r in steps),
          "Dockerfile: no `cargo build --release --locked` step")

    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    for excluded in ("target/release/outboxd", ".git/HEAD", "tests/it/main.rs"):
        check(ignored(excluded, patterns), f".dockerignore lets {excluded} into the build context")
    copied = []
    for keyword, rest in steps:
        if keyword == "COPY" and "--from=" not in rest:
            sources = rest.split()[:-1]
            for source in sources:
                check((ROOT / source).exists(), f"Dockerfile: COPY {source}, which does not exist")
                check(not ignored(source.strip("/").rstrip("."), patterns) or source in ("./",),
                      f"Dockerfile: COPY {source}, which .dockerignore excludes")
                copied.append(source.strip("./") or ".")
    for needed in ["Cargo.toml", "Cargo.lock", "src/lib.rs", "src/main.rs", *compile_time_inputs()]:
        check(any(needed == c or needed.startswith(c.rstrip("/") + "/") for c in copied),
              f"Dockerfile: the build reads {needed}, which no COPY brings in")
        check(not ignored(needed, patterns), f".dockerignore excludes {needed}, which the build reads")
    check(not (ROOT / "build.rs").exists() or "build.rs" in copied, "Dockerfile: build.rs is not copied")

    runtime_steps = steps[[i for i, (k, _) in enumerate(steps) if k == "FROM"][-1]:]
    users = [rest for keyword, rest in runtime_steps if keyword == "USER"]
    check(bool(users) and re.fullmatch(r"\d+(:\d+)?", users[-1]) is not None,
          "Dockerfile: the runtime stage has no numeric USER (Kubernetes' runAsNonRoot needs one)")
    uid = int(users[-1].split(":")[0])
    check(uid != 0, "Dockerfile: runs as root")
    entrypoint = [json.loads(rest) for keyword, rest in runtime_steps if keyword == "ENTRYPOINT"]
    check(bool(entrypoint) and Path(entrypoint[-1][0]).name == "outboxd", "Dockerfile: the ENTRYPOINT is not outboxd")
    cmd = [json.loads(rest) for keyword, rest in runtime_steps if keyword == "CMD"]
    check(cmd and cmd[-1] == ["run"] and "run" in facts.subcommands, "Dockerfile: CMD is not [\"run\"]")
    exposed = {int(p.split("/")[0]) for keyword, rest in runtime_steps if keyword == "EXPOSE" for p in rest.split()}
    listen_port = common.port_of(facts.defaults["OUTBOXD_LISTEN"])
    check(listen_port in exposed, f"Dockerfile: does not EXPOSE {listen_port} (OUTBOXD_LISTEN's default)")

    for name in ("deployment.yaml", "job-migrate.yaml"):
        pod = common.load_one(KUBERNETES / name)["spec"]["template"]["spec"]
        check(pod.get("securityContext", {}).get("runAsUser") == uid,
              f"deploy/kubernetes/{name}: runAsUser is not the image's user {uid}")
    compose = common.load_one(common.COMPOSE / "compose.yaml")["services"]
    for name in ("migrate", "outboxd"):
        user = str(compose[name].get("user", ""))
        if user and int(user.split(":")[0]) != uid:
            fail(f"deploy/compose/compose.yaml: {name} runs as {user}, the image's user is {uid}")
    return [
        f"{len(stages)} stages, runtime {runtime}, `cargo build --release --locked`",
        f"copies {', '.join(copied)}: all {len(compile_time_inputs())} compile-time inputs included; "
        ".dockerignore keeps target/, .git and tests out",
        f"runs as {users[-1]} (= the pods' runAsUser), ENTRYPOINT outboxd, CMD run, EXPOSE {listen_port}",
    ]


if __name__ == "__main__":
    common.main("the Dockerfile builds what the tests test", body, __doc__)
