#!/usr/bin/env python3
"""The monitoring mixin (mixin/) is the source of the rules, the dashboards and their
Kubernetes objects:

- `mixin/generate.py --check`: every committed generated file equals the mixin's output.
- Rendered with another selector (job="mail-dispatcher"), every rule selects it and none
  the default, the down alert carries the new job, the dashboard defaults to it, the
  PrometheusRule holds the same rules; promtool accepts them and the rules' unit tests pass
  with their series relabelled to the new job.
- A threshold in the config changes its rule.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from common import ROOT, check, fail

GENERATE = ROOT / "mixin" / "generate.py"
DEFAULT_JOB = "outboxd"
OTHER_JOB = "mail-dispatcher"


def generate(*args: str) -> str:
    result = subprocess.run([sys.executable, str(GENERATE), *args], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"mixin/generate.py {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result.stdout


def rules_of(path: Path) -> list[dict]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def relabelled_tests(job: str) -> dict:
    """tests/alerts/outboxd.rules.test.yml as a scrape job named `job` would see it: its
    series' job="outboxd" becomes job="<job>", and so do the expected alerts' job label and
    the job in their descriptions (the word outboxd there, which is $labels.job or the down
    alert's job; a description that names the program itself would need its own case here)."""
    tests = yaml.safe_load((ROOT / "tests" / "alerts" / "outboxd.rules.test.yml").read_text(encoding="utf-8"))
    word = re.compile(rf"(?<![\w/.-]){re.escape(DEFAULT_JOB)}(?![\w/'-])")
    for case in tests["tests"]:
        for series in case.get("input_series", []):
            series["series"] = series["series"].replace(f'job="{DEFAULT_JOB}"', f'job="{job}"')
        for alert_test in case.get("alert_rule_test", []):
            for alert in alert_test.get("exp_alerts") or []:
                labels = alert.get("exp_labels") or {}
                if labels.get("job") == DEFAULT_JOB:
                    labels["job"] = job
                annotations = alert.get("exp_annotations") or {}
                if "description" in annotations:
                    annotations["description"] = word.sub(job, annotations["description"])
    return tests


def check_other_selector(tmp: Path) -> list[str]:
    selector = f'job="{OTHER_JOB}"'
    generate("--selector", selector, "--out", str(tmp))
    rules = rules_of(tmp / "alerts" / "outboxd.rules.yml")
    check(len(rules) == len(rules_of(ROOT / "alerts" / "outboxd.rules.yml")), "another selector changed the number of rules")
    for rule in rules:
        name = rule.get("alert") or rule.get("record")
        check(selector in rule["expr"], f"{name}: rendered with {selector}, its expr does not use it:\n{rule['expr']}")
        check(f'job="{DEFAULT_JOB}"' not in rule["expr"], f"{name}: still selects job=\"{DEFAULT_JOB}\"")
        for field in ("labels", "annotations"):
            for key, value in (rule.get(field) or {}).items():
                check(value != DEFAULT_JOB and f'"{DEFAULT_JOB}"' not in value,
                      f"{name}: {field}.{key} still names the default job: {value!r}")
    down = next(r for r in rules if r.get("alert") == "OutboxDispatcherDown")
    check(down["labels"].get("job") == OTHER_JOB, f"OutboxDispatcherDown's job label is {down['labels'].get('job')!r}")

    prometheus_rule = yaml.safe_load((tmp / "deploy" / "kubernetes" / "prometheusrule.yaml").read_text(encoding="utf-8"))
    check(prometheus_rule["spec"] == yaml.safe_load((tmp / "alerts" / "outboxd.rules.yml").read_text(encoding="utf-8")),
          "the rendered PrometheusRule's spec differs from the rendered rules file")

    dashboards = sorted((tmp / "dashboards").glob("*.json"))
    check(bool(dashboards), "no dashboard rendered")
    for path in dashboards:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        job_variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "job")
        check(job_variable.get("current", {}).get("value") == OTHER_JOB,
              f"{path.name}: the job variable's default is {job_variable.get('current')}, not {OTHER_JOB}")
    configmap = yaml.safe_load((tmp / "deploy" / "kubernetes" / "dashboards-configmap.yaml").read_text(encoding="utf-8"))
    for path in dashboards:
        check(json.loads(configmap["data"][path.name]) == json.loads(path.read_text(encoding="utf-8")),
              f"the rendered dashboard ConfigMap's {path.name} differs from the rendered dashboard")

    promtool = common.tool("promtool", "prometheus")
    rules_file = tmp / "alerts" / "outboxd.rules.yml"
    common.run([promtool, "check", "rules", str(rules_file)], f"promtool check rules on the {selector} rendering")
    tests = relabelled_tests(OTHER_JOB)
    tests["rule_files"] = [str(rules_file)]
    test_file = tmp / "relabelled.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    common.run([promtool, "test", "rules", str(test_file)], f"the rules' unit tests, relabelled to job {OTHER_JOB}")
    return [f"with {selector}: all {len(rules)} rules select it, none job=\"{DEFAULT_JOB}\"; "
            f"OutboxDispatcherDown labels job={OTHER_JOB}; the dashboard's job defaults to {OTHER_JOB}; "
            "promtool check rules and the relabelled unit tests pass"]


def check_threshold(tmp: Path) -> list[str]:
    generate("--config", json.dumps({"stalledReadyAgeSeconds": 600}), "--out", str(tmp))
    stalled = next(r for r in rules_of(tmp / "alerts" / "outboxd.rules.yml") if r.get("alert") == "OutboxDispatcherStalled")
    check(stalled["expr"].rstrip().endswith("> 600"), f"stalledReadyAgeSeconds=600 did not reach the rule: {stalled['expr']}")
    return ["_config.stalledReadyAgeSeconds=600 makes OutboxDispatcherStalled's threshold 600"]


def body(args) -> list[str]:
    notes = [generate("--check").strip()]
    promtool = common.tool("promtool", "prometheus")
    common.run([promtool, "check", "rules", str(ROOT / "alerts" / "outboxd.rules.yml")], "promtool check rules")
    common.run([promtool, "test", "rules", "tests/alerts/outboxd.rules.test.yml"], "promtool test rules", cwd=ROOT)
    notes.append("the committed alerts/outboxd.rules.yml passes promtool check rules and its unit tests")
    with tempfile.TemporaryDirectory() as tmp:
        notes += check_other_selector(Path(tmp) / "selector")
        notes += check_threshold(Path(tmp) / "threshold")
    return notes


if __name__ == "__main__":
    common.main("the generated files are the mixin's output, and its config reaches them", body, __doc__)
