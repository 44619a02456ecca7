#!/usr/bin/env python3
"""Kinds of one's own in Kubernetes (deploy/own-templates/): the overlay mounts its ConfigMap
where OUTBOXD_TEMPLATES points, maps every key to a KIND/FILE path (a ConfigMap's keys
cannot hold a `/`), the ConfigMap validates, and, given --outboxd BINARY, the kinds laid
out as the volume lays them load and render with `outboxd preview`.

    python3 tests/deploy/check_templates.py [--outboxd target/debug/outboxd]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.dont_write_bytecode = True

import common
from check_kubernetes import validate
from common import ROOT, check

OVERLAY = ROOT / "deploy" / "own-templates"
# A payload for each kind the overlay's ConfigMap defines.
PAYLOADS = {"password_reset": {"to": "ada@example.com", "name": "Ada", "reset_url": "https://app.example/r/1"}}


def deployment_patch() -> dict:
    kustomization = common.load_one(OVERLAY / "kustomization.yaml")
    for patch in kustomization.get("patches") or []:
        if patch.get("target", {}).get("kind") == "Deployment":
            return yaml.safe_load(patch["patch"])
    common.fail("deploy/own-templates/kustomization.yaml: no patch of the Deployment")


def body(args) -> list[str]:
    config_map = common.load_one(OVERLAY / "templates-configmap.yaml")
    validate(config_map, "deploy/own-templates/templates-configmap.yaml")
    pod = deployment_patch()["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    check("templates" in volumes and "templates" in mounts, "the patch mounts no `templates` volume")
    mount = mounts["templates"]
    check(env.get("OUTBOXD_TEMPLATES") == mount["mountPath"],
          f"OUTBOXD_TEMPLATES is {env.get('OUTBOXD_TEMPLATES')}, the volume is at {mount['mountPath']}")
    check(mount.get("readOnly") is True, "the templates volume is not read-only")
    source = volumes["templates"]["configMap"]
    check(source["name"] == config_map["metadata"]["name"], "the volume names another ConfigMap")
    items = {i["key"]: i["path"] for i in source.get("items", [])}
    keys = set(config_map["data"])
    check(set(items) == keys, f"the volume's items {sorted(items)} are not the ConfigMap's keys {sorted(keys)}")
    for key, path in items.items():
        kind, _, file = key.partition(".")
        check(path == f"{kind}/{file}", f"key {key} is mounted at {path}, not {kind}/{file}")
    kinds = sorted({p.split("/")[0] for p in items.values()})
    notes = [f"{len(items)} files of {', '.join(kinds)} at {mount['mountPath']} = OUTBOXD_TEMPLATES"]
    if not args.outboxd:
        return notes + ["skipped rendering: no --outboxd"]
    with tempfile.TemporaryDirectory() as directory:
        for key, path in items.items():
            target = Path(directory) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(config_map["data"][key])
        for kind in kinds:
            check(kind in PAYLOADS, f"no payload to render {kind} with: add one to PAYLOADS")
            result = subprocess.run(
                [args.outboxd, "preview", "--templates", directory, "--kind", kind,
                 "--payload", json.dumps(PAYLOADS[kind])],
                capture_output=True, text=True)
            check(result.returncode == 0, f"outboxd preview of {kind} failed: {result.stderr}")
            subject = config_map["data"][f"{kind}.subject.txt"].strip()
            check(f"Subject: {subject}" in result.stdout, f"{kind} renders without its subject:\n{result.stdout}")
    return notes + [f"outboxd preview renders {', '.join(kinds)} from the volume's layout"]


if __name__ == "__main__":
    common.main("kinds of one's own load from the ConfigMap volume", body, __doc__)
