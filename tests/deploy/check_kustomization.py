#!/usr/bin/env python3
"""Each kustomization under deploy/ lists every manifest beside it, and everything it lists
exists. With kubectl (or kustomize) installed, each one also renders, and the rendered
objects validate like the files (check_kubernetes.py); without, that part is skipped and
said so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from check_kubernetes import restricted, validate
from common import ROOT, check, fail, rel

# Fields of a kustomization that name files or directories.
FILE_FIELDS = ("resources", "components", "crds", "patchesStrategicMerge", "configurations")


def referenced(kustomization: dict, where: Path) -> list[str]:
    names = []
    for field in FILE_FIELDS:
        names.extend(kustomization.get(field) or [])
    for patch in kustomization.get("patches") or []:
        if "path" in patch:
            names.append(patch["path"])
    for generator in (kustomization.get("configMapGenerator") or []) + (kustomization.get("secretGenerator") or []):
        for entry in (generator.get("files") or []) + (generator.get("envs") or []):
            names.append(entry.split("=", 1)[-1])
    for name in names:
        check(isinstance(name, str), f"{rel(where)}: {name!r} is not a path")
    return names


def check_listing(directory: Path) -> list[str]:
    path = directory / "kustomization.yaml"
    kustomization = common.load_one(path)
    check(kustomization.get("kind") == "Kustomization", f"{rel(path)}: kind is not Kustomization")
    names = referenced(kustomization, path)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    check(not duplicates, f"{rel(path)} lists {', '.join(duplicates)} more than once")
    for name in names:
        if "://" in name:
            fail(f"{rel(path)}: remote resource {name}: the base must build offline")
        target = (directory / name).resolve()
        check(target.exists(), f"{rel(path)} lists {name}, which does not exist")
        if target.is_dir():
            check((target / "kustomization.yaml").is_file(), f"{rel(path)} lists {name}/, which has no kustomization.yaml")
    listed = {(directory / n).resolve() for n in names}
    beside = {
        p.resolve() for p in directory.iterdir()
        if p.is_file() and p.suffix in (".yaml", ".yml", ".json", ".env") and p.name != "kustomization.yaml"
    }
    missing = sorted(p.name for p in beside - listed)
    check(not missing, f"{rel(path)} does not list {', '.join(missing)}: add it to resources (or remove the file)")
    return [f"{rel(path)}: lists all {len(beside)} files beside it; all {len(names)} references exist"]


def renderer() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def count_objects(directory: Path) -> int:
    """Objects in the resources a kustomization lists, those of its bases included, less
    those its patches delete (`$patch: delete`)."""
    kustomization = common.load_one(directory / "kustomization.yaml")
    total = 0
    for name in kustomization.get("resources") or []:
        target = (directory / name).resolve()
        total += count_objects(target) if target.is_dir() else len(common.load_documents(target))
    deleted = sum("$patch: delete" in (p.get("patch") or "") for p in kustomization.get("patches") or [])
    return total - deleted


def check_render(directory: Path, command: list[str]) -> list[str]:
    result = subprocess.run(command + [str(directory)], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)} {rel(directory)} failed:\n{result.stderr}")
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = count_objects(directory)
    check(len(objects) == expected,
          f"{rel(directory)} renders {len(objects)} objects, but its files hold {expected}")
    for doc in objects:
        where = f"{rel(directory)} rendered: {doc['kind']} {doc['metadata']['name']}"
        validate(doc, where)
        restricted(doc, where)
    notes = [f"{' '.join(command)} {rel(directory)}: {len(objects)} objects, each valid"]
    kustomization = common.load_one(directory / "kustomization.yaml")
    if kustomization.get("namespace"):
        stray = [d["metadata"]["name"] for d in objects
                 if d["kind"] != "Namespace" and d["metadata"].get("namespace") != kustomization["namespace"]]
        check(not stray, f"{rel(directory)}: not in namespace {kustomization['namespace']}: {stray}")
    return notes


def body(args) -> list[str]:
    directories = sorted(p.parent for p in (ROOT / "deploy").rglob("kustomization.yaml"))
    check(common.KUBERNETES in directories, "deploy/kubernetes/kustomization.yaml is missing")
    notes = []
    for directory in directories:
        notes.extend(check_listing(directory))
    # The base deploys this release: its image tag follows Cargo.toml's version.
    version = tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))["package"]["version"]
    images = {i["name"]: i for i in common.load_one(common.KUBERNETES / "kustomization.yaml").get("images", [])}
    check(images.get("outboxd", {}).get("newTag") == version,
          f"deploy/kubernetes/kustomization.yaml: the outboxd image's newTag is not {version} (Cargo.toml)")
    for name in ("deployment.yaml", "job-migrate.yaml"):
        for container in common.load_one(common.KUBERNETES / name)["spec"]["template"]["spec"]["containers"]:
            check(container["image"] == f"outboxd:{version}",
                  f"deploy/kubernetes/{name}: image {container['image']}, not outboxd:{version} (Cargo.toml)")
    notes.append(f"the image is outboxd:{version}, Cargo.toml's version")
    command = renderer()
    if command is None:
        notes.append("skipped rendering: neither kustomize nor kubectl is installed")
        return notes
    for directory in directories:
        notes.extend(check_render(directory, command))
    # The overlay for kube-prometheus-stack labels the objects its Prometheus selects.
    overlay = ROOT / "deploy" / "kube-prometheus-stack"
    if overlay in directories:
        rendered = subprocess.run(command + [str(overlay)], capture_output=True, text=True, check=True).stdout
        for doc in yaml.safe_load_all(rendered):
            if doc and doc["kind"] in ("ServiceMonitor", "PrometheusRule"):
                check("release" in doc["metadata"].get("labels", {}),
                      f"{rel(overlay)}: the {doc['kind']} has no `release` label for kube-prometheus-stack")
    return notes


if __name__ == "__main__":
    common.main("kustomizations list every file and render", body, __doc__)
