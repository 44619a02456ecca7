#!/usr/bin/env python3
"""Every Kubernetes object in deploy/ validates offline.

- Built-in kinds: against the Kubernetes OpenAPI schemas that kubernetes-validate bundles,
  strictly (an unknown field is an error), for an old supported version and the newest.
- The Prometheus Operator's ServiceMonitor and PrometheusRule, which it has no schema for:
  against the small schemas below (the fields outboxd uses, nothing unknown), and the
  PrometheusRule's rules through `promtool check rules` and the rules' unit tests.
- Pods meet the "restricted" Pod Security Standard (what deploy/kube-prometheus-stack enforces).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from common import ROOT, check, fail, rel

DURATION = {"type": "string", "pattern": r"^(\d+(ms|s|m|h|d|w|y))+$"}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": LABELS,
        "annotations": LABELS,
    },
    "additionalProperties": False,
}
SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": LABELS, "matchExpressions": {"type": "array"}},
    "additionalProperties": False,
}



def custom_resource(kind: str, spec: dict) -> dict:
    """A monitoring.coreos.com/v1 object of `kind` whose spec `spec` describes."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


# monitoring.coreos.com/v1, the parts of the CRDs' schemas that outboxd's objects use.
SCHEMAS = {
    "ServiceMonitor": custom_resource("ServiceMonitor", {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "jobLabel": {"type": "string"},
            "selector": SELECTOR,
            "namespaceSelector": {"type": "object"},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": DURATION,
                        "scrapeTimeout": DURATION,
                        "honorLabels": {"type": "boolean"},
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    }),
    "PrometheusRule": custom_resource("PrometheusRule", {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": DURATION,
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["expr"],
                                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                "properties": {
                                    "alert": {"type": "string"},
                                    "record": {"type": "string"},
                                    "expr": {"type": "string"},
                                    "for": DURATION,
                                    "keep_firing_for": DURATION,
                                    "labels": LABELS,
                                    "annotations": LABELS,
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    }),
}


def manifests() -> list[Path]:
    """Every YAML file of deploy/ that holds Kubernetes objects (compose's files excluded)."""
    files = []
    for path in sorted((ROOT / "deploy").rglob("*.y*ml")):
        if path.suffix in (".yaml", ".yml") and "compose" not in path.relative_to(ROOT / "deploy").parts:
            files.append(path)
    return files


def validate(doc: dict, where: str) -> str:
    """Validates one object; returns what it was validated against."""
    check(isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc, f"{where}: not a Kubernetes object")
    kind = doc["kind"]
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        check(kind in SCHEMAS, f"{where}: no schema here for {doc['apiVersion']} {kind}")
        errors = sorted(jsonschema.Draft202012Validator(SCHEMAS[kind]).iter_errors(doc), key=str)
        if errors:
            fail(f"{where}: {kind} is invalid: " + "; ".join(
                f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors))
        return f"{kind} (monitoring.coreos.com/v1 schema of tests/deploy)"
    for version in common.KUBERNETES_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(doc, wanted, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            fail(f"{where}: kubernetes-validate has no schema for {doc['apiVersion']} {kind} in {wanted}")
        except kubernetes_validate.ValidationError as e:
            fail(f"{where}: {kind} is invalid for Kubernetes {wanted}: {e.message} "
                 f"(at {'/'.join(map(str, e.path)) or 'the top'})")
    return f"{kind} (Kubernetes {' and '.join(common.KUBERNETES_VERSIONS)}, strict)"


def pod_spec(doc: dict) -> dict | None:
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec["template"]["spec"]
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec if doc["kind"] == "Pod" else None


def restricted(doc: dict, where: str) -> None:
    """The "restricted" Pod Security Standard, and a read-only root file system."""
    pod = pod_spec(doc)
    if pod is None:
        return
    pod_context = pod.get("securityContext", {})
    check(pod.get("hostNetwork") is not True and pod.get("hostPID") is not True, f"{where}: host namespaces")
    check(pod.get("automountServiceAccountToken") is False, f"{where}: mounts a service account token it does not need")
    for container in pod.get("initContainers", []) + pod["containers"]:
        name = f"{where}: container {container['name']}"
        context = container.get("securityContext", {})

        def setting(key: str):
            return context.get(key, pod_context.get(key))

        check(setting("runAsNonRoot") is True, f"{name}: runAsNonRoot is not true")
        check(setting("runAsUser") not in (0, None) or context.get("runAsNonRoot") is True,
              f"{name}: runs as root")
        check(context.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation is not false")
        check(context.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem is not true")
        check(context.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities are not drop [ALL]")
        check(not context.get("capabilities", {}).get("add"), f"{name}: adds capabilities")
        check(context.get("privileged") is not True, f"{name}: privileged")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        check(seccomp in ("RuntimeDefault", "Localhost"), f"{name}: seccompProfile is not RuntimeDefault")
        resources = container.get("resources", {})
        check(resources.get("requests") and resources.get("limits"), f"{name}: no resource requests and limits")


def promtool_rules(doc: dict, where: str) -> list[str]:
    """The PrometheusRule's embedded rules pass promtool, and so do the rules' unit tests."""
    promtool = common.tool("promtool", "prometheus")
    tests = yaml.safe_load((ROOT / "tests" / "alerts" / "outboxd.rules.test.yml").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "prometheusrule.rules.yml"
        rules.write_text(yaml.safe_dump(doc["spec"], sort_keys=False), encoding="utf-8")
        common.run([promtool, "check", "rules", str(rules)], f"promtool check rules on {where}'s spec")
        tests["rule_files"] = [str(rules)]
        test_file = Path(tmp) / "test.yml"
        test_file.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
        common.run([promtool, "test", "rules", str(test_file)],
                   f"tests/alerts/outboxd.rules.test.yml against {where}'s spec")
    count = sum(len(g["rules"]) for g in doc["spec"]["groups"])
    return [f"{where}: its {count} rules pass promtool check rules and tests/alerts/outboxd.rules.test.yml"]


def network_policy_ports(docs: list[tuple[dict, str]]) -> list[str]:
    """The NetworkPolicy admits each port the Deployment declares, by the names it declares,
    so that renaming a port cannot leave the webhooks or the scrape unreachable."""
    policies = [(doc, where) for doc, where in docs if doc["kind"] == "NetworkPolicy"]
    deployments = [doc for doc, _ in docs if doc["kind"] == "Deployment"]
    check(bool(policies), "deploy/kubernetes has no NetworkPolicy for outboxd's ports")
    declared = {p["name"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]
                for p in c.get("ports", [])}
    notes = []
    for policy, where in policies:
        admitted = {p["port"] for rule in policy["spec"].get("ingress", []) for p in rule.get("ports", [])}
        check(admitted == declared, f"{where}: admits ports {sorted(admitted)}, the Deployment declares {sorted(declared)}")
        notes.append(f"{where}: admits exactly the Deployment's ports {sorted(declared)}")
    return notes


def body(args) -> list[str]:
    notes = []
    base_docs = []
    files = manifests()
    check(bool(files), "no manifests found under deploy/")
    seen = 0
    for path in files:
        for index, doc in enumerate(common.load_documents(path)):
            where = rel(path) if index == 0 else f"{rel(path)} (document {index + 1})"
            if str(doc.get("apiVersion", "")).startswith("kustomize.config.k8s.io/"):
                continue
            what = validate(doc, where)
            restricted(doc, where)
            notes.append(f"{where}: {what}")
            seen += 1
            if rel(path).startswith("deploy/kubernetes/"):
                base_docs.append((doc, where))
            if doc["kind"] == "PrometheusRule":
                notes.extend(promtool_rules(doc, where))
    check(seen > 0, "no Kubernetes objects found under deploy/")
    notes.extend(network_policy_ports(base_docs))
    return notes


if __name__ == "__main__":
    common.main("Kubernetes objects validate offline", body, __doc__)
