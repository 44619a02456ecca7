#!/usr/bin/env python3
"""Runs every deployment check (tests/deploy/check_*.py), each in its own process, and exits 1
if any failed. Arguments are passed to each check (see common.py: outboxd's defaults, for a
caller that knows them from clap):

    python3 tests/deploy/check_all.py [--listen 0.0.0.0:9898] [--shutdown-timeout 30s] ...

Needs python3 with PyYAML, jsonnet and kubernetes-validate (tests/requirements.txt), and
promtool and amtool (Debian's prometheus and prometheus-alertmanager); kubectl or kustomize
is used when installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKS = (
    "check_mixin.py",  # (e) the generated files are the mixin's output; its config reaches them
    "check_kubernetes.py",  # (a) every object validates; the PrometheusRule passes promtool
    "check_kustomization.py",  # (b) the kustomizations list every file, and render
    "check_probes.py",  # (c) probes, ports and paths match outboxd's
    "check_compose.py",  # (d) the compose stack parses, promtool/amtool accept its configs
    "check_dockerfile.py",  # the image builds what CI tests
    "check_runbook.py",  # the runbook's commands fit the shipped manifests
    "check_templates.py",  # kinds of one's own load from a ConfigMap volume
)


def missing_modules() -> list[str]:
    missing = []
    for module, package in (("yaml", "PyYAML"), ("_jsonnet", "jsonnet"), ("kubernetes_validate", "kubernetes-validate")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    return missing


def main() -> int:
    missing = missing_modules()
    if missing:
        print(f"FAIL: python3 lacks {', '.join(missing)}: "
              "python3 -m pip install -r tests/requirements.txt", file=sys.stderr)
        return 1
    failed = []
    for check in CHECKS:
        result = subprocess.run([sys.executable, str(HERE / check), *sys.argv[1:]])
        if result.returncode != 0:
            failed.append(check)
    print(f"deploy checks: {len(CHECKS) - len(failed)} passed, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
