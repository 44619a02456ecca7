#!/usr/bin/env python3
"""The runbook's commands work on the shipped Kubernetes set-up (alerts/RUNBOOK.md against
deploy/kubernetes/): every URL to /api/v1 or /admin uses the admin container port, every URL
to the probes or /metrics the http one, and the admin token is read from the Secret the
Deployment takes its environment from, under the variable outboxd reads.

    python3 tests/deploy/check_runbook.py
"""

from __future__ import annotations

import re

import common
from common import KUBERNETES, ROOT, check

RUNBOOK = ROOT / "alerts" / "RUNBOOK.md"


def container_ports() -> dict[str, int]:
    deployment = common.load_one(KUBERNETES / "deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def secret_names() -> set[str]:
    deployment = common.load_one(KUBERNETES / "deployment.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}


def body(args) -> list[str]:
    text = RUNBOOK.read_text()
    ports = container_ports()
    check({"http", "admin"} <= set(ports), f"deployment.yaml: ports {ports} lack http or admin")
    urls = re.findall(r"https?://[^/\s'\"]+:(\d+)(/[^\s'\"]*)", text)
    check(urls, "alerts/RUNBOOK.md: no URL with a port")
    for port, path in urls:
        wanted = ports["admin"] if path.startswith(("/api/v1", "/admin")) else ports["http"]
        check(int(port) == wanted,
              f"alerts/RUNBOOK.md: {path} on port {port}; the shipped set-up serves it on {wanted}")
    forwards = re.findall(r"kubectl port-forward deploy/(\S+) ([\d: ]+)", text)
    for _, mapping in forwards:
        for pair in mapping.split():
            check(int(pair.split(":")[-1]) in ports.values(),
                  f"alerts/RUNBOOK.md: port-forward to {pair}, which no container port is")
    secrets = re.findall(r"kubectl get secret (\S+) -o jsonpath='\{\.data\.(\w+)\}'", text)
    check(secrets, "alerts/RUNBOOK.md: never says where $TOKEN comes from")
    for name, key in secrets:
        check(name in secret_names(), f"alerts/RUNBOOK.md: reads Secret {name}; the Deployment's are {secret_names()}")
        secret = common.load_one(KUBERNETES / "secret.yaml")
        check(key in secret.get("stringData", {}) or key in secret.get("data", {}),
              f"alerts/RUNBOOK.md: reads {key}, which Secret {name} does not hold")
    check("kubectl exec deploy/outboxd -- outboxd" in text, "alerts/RUNBOOK.md: no `kubectl exec` form")
    return [f"{len(urls)} URLs on the ports of deployment.yaml ({ports}); "
            f"the token from Secret {', '.join(sorted(n for n, _ in secrets))}"]


if __name__ == "__main__":
    common.main("the runbook's commands fit the shipped manifests", body, __doc__)
