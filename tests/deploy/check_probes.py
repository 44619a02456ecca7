#!/usr/bin/env python3
"""The Kubernetes base agrees with what outboxd serves: the probes' paths and ports, the
container and Service ports, the ServiceMonitor's port, path and job, the shutdown bound
against terminationGracePeriodSeconds, the subcommands, and every variable it sets is one
outboxd reads. outboxd's defaults come from its source (or the arguments, see common.py).
"""

from __future__ import annotations

import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from common import KUBERNETES, check, fail

DEPLOYMENT = KUBERNETES / "deployment.yaml"


def objects() -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in common.load_documents(path):
            if doc.get("kind") != "Kustomization":
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def get(objs: dict, kind: str, name: str, why: str) -> dict:
    check((kind, name) in objs, f"deploy/kubernetes: no {kind} {name} ({why})")
    return objs[(kind, name)]


def container_env(objs: dict, container: dict) -> dict[str, str]:
    """The variables a container gets: envFrom ConfigMaps and Secrets, then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = get(objs, "ConfigMap", source["configMapRef"]["name"], "envFrom").get("data", {})
        else:
            secret = get(objs, "Secret", source["secretRef"]["name"], "envFrom")
            data = {**secret.get("data", {}), **secret.get("stringData", {})}
        env.update({k: str(v) for k, v in data.items()})
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = str(variable["value"])
        else:
            ref = variable["valueFrom"].get("configMapKeyRef") or variable["valueFrom"].get("secretKeyRef")
            kind = "ConfigMap" if "configMapKeyRef" in variable["valueFrom"] else "Secret"
            source = get(objs, kind, ref["name"], f"{variable['name']}'s valueFrom")
            data = {**source.get("data", {}), **source.get("stringData", {})}
            check(ref["key"] in data, f"{kind} {ref['name']} has no key {ref['key']} ({variable['name']})")
            env[variable["name"]] = str(data[ref["key"]])
    return env


def container_port(container: dict, port, where: str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return declared["containerPort"]
    fail(f"{where}: the port {port!r} is not a port of container {container['name']}")


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def rules_job() -> str:
    """The job the generated alert rules select (their `job="..."` matcher)."""
    rule = common.load_one(KUBERNETES / "prometheusrule.yaml")["spec"]["groups"][0]["rules"][0]
    match = re.search(r'job="([^"]+)"', rule["expr"])
    check(match is not None, f"prometheusrule.yaml: no job=\"...\" in {rule['expr']!r}")
    return match.group(1)


def check_probes(facts: common.Facts, container: dict, env: dict[str, str]) -> list[str]:
    listen_port = common.port_of(facts.listen(env))
    where = f"{common.rel(DEPLOYMENT)}: container {container['name']}"
    wanted = {
        "startupProbe": facts.liveness_path,
        "livenessProbe": facts.liveness_path,
        "readinessProbe": facts.readiness_path,
    }
    for probe, path in wanted.items():
        check(probe in container, f"{where}: no {probe}")
        http = container[probe].get("httpGet")
        check(http is not None, f"{where}: {probe} is not an httpGet probe")
        check(http["path"] == path, f"{where}: {probe} asks {http['path']}, outboxd answers it on {path}")
        check(path in facts.routes, f"src/http/mod.rs routes no {path} (routes: {sorted(facts.routes)})")
        port = container_port(container, http["port"], f"{where}: {probe}")
        check(port == listen_port,
              f"{where}: {probe} asks port {port}, but outboxd serves {path} on {facts.listen(env)} (OUTBOXD_LISTEN)")
    return [f"probes: {facts.liveness_path} (startup, liveness) and {facts.readiness_path} (readiness) "
            f"on port {listen_port} = OUTBOXD_LISTEN {facts.listen(env)}"]


def service_to(objs: dict, pod_labels: dict, container: dict, name: str, file: str, port: int,
               variable: str) -> tuple[str, dict]:
    """The Service `name` selects the pods and sends its one port to `port`, where `variable` listens:
    a note saying so, and the Service."""
    service = get(objs, "Service", name, f"the Service {name}")
    check(matches(service["spec"]["selector"], pod_labels), f"{file}: its selector does not select the pods")
    (service_port,) = service["spec"]["ports"]
    target = container_port(container, service_port.get("targetPort", service_port["port"]), file)
    check(target == port, f"{file}: targets port {target}, {variable} is port {port}")
    return f"Service {name}: port {service_port['name']} -> {target} = {variable}", service


def check_services(objs: dict, facts: common.Facts, pod_labels: dict, container: dict, env: dict) -> list[str]:
    notes = []
    listen_port = common.port_of(facts.listen(env))
    note, metrics = service_to(objs, pod_labels, container, "outboxd", "service.yaml", listen_port,
                               "OUTBOXD_LISTEN")
    notes.append(note)
    metrics_port = metrics["spec"]["ports"][0]["name"]

    admin_listen = env.get("OUTBOXD_ADMIN_LISTEN")
    if admin_listen:
        admin_port = common.port_of(admin_listen)
        check(admin_port != listen_port, "OUTBOXD_ADMIN_LISTEN must differ from OUTBOXD_LISTEN")
        check(env.get("OUTBOXD_ADMIN_TOKEN"), "OUTBOXD_ADMIN_LISTEN is set without OUTBOXD_ADMIN_TOKEN: outboxd refuses to start")
        declared = {p["containerPort"] for p in container.get("ports", [])}
        check(admin_port in declared, f"deployment.yaml: no container port {admin_port} (OUTBOXD_ADMIN_LISTEN)")
        note, _ = service_to(objs, pod_labels, container, "outboxd-admin", "service-admin.yaml", admin_port,
                             "OUTBOXD_ADMIN_LISTEN")
        notes.append(note)

    monitor = get(objs, "ServiceMonitor", "outboxd", "scraping")
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = [name for (kind, name), o in objs.items()
               if kind == "Service" and matches(selector, o["metadata"].get("labels", {}))]
    check(scraped == ["outboxd"], f"servicemonitor.yaml selects the Services {scraped}, not just outboxd")
    for endpoint in monitor["spec"]["endpoints"]:
        check(endpoint["port"] == metrics_port,
              f"servicemonitor.yaml: port {endpoint['port']!r} is not the Service's {metrics_port!r}")
        path = endpoint.get("path", "/metrics")
        check(path == facts.metrics_path and path in facts.routes,
              f"servicemonitor.yaml: path {path}, outboxd serves metrics on {facts.metrics_path}")
    job_label = monitor["spec"].get("jobLabel")
    job = metrics["metadata"]["labels"].get(job_label) if job_label else metrics["metadata"]["name"]
    check(job == rules_job(),
          f"the ServiceMonitor gives the job {job!r}, but the alerts select job=\"{rules_job()}\"")
    notes.append(f"ServiceMonitor: {facts.metrics_path} on port {metrics_port}, job=\"{job}\" as the alerts select")
    return notes


def body(args) -> list[str]:
    facts = common.facts(args)
    objs = objects()
    deployment = get(objs, "Deployment", "outboxd", "the dispatcher")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = container_env(objs, container)
    unknown = facts.unknown_variables(env)
    check(not unknown, f"deployment.yaml: outboxd reads no variable {', '.join(unknown)}")
    # The base spells these out (for the ports and the grace period that depend on them) but
    # keeps outboxd's defaults, which the README documents; an overlay may change them.
    for name in ("OUTBOXD_LISTEN", "OUTBOXD_SHUTDOWN_TIMEOUT"):
        if name in env:
            check(env[name] == facts.defaults[name],
                  f"configmap.yaml sets {name}={env[name]}, outboxd's default is {facts.defaults[name]}: "
                  "keep the base on the defaults (change them in an overlay)")
    notes = check_probes(facts, container, env)
    notes.extend(check_services(objs, facts, pod["metadata"]["labels"], container, env))

    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    shutdown = facts.shutdown_seconds(env)
    check(grace > shutdown,
          f"deployment.yaml: terminationGracePeriodSeconds {grace} is not above OUTBOXD_SHUTDOWN_TIMEOUT ({shutdown:g}s)")
    notes.append(f"terminationGracePeriodSeconds {grace} > OUTBOXD_SHUTDOWN_TIMEOUT {shutdown:g}s")

    check(container.get("args") == ["run"] and "run" in facts.subcommands, "deployment.yaml: the container does not run `outboxd run`")
    job = get(objs, "Job", "outboxd-migrate", "the migration")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    check(migrate.get("args") == ["migrate"] and "migrate" in facts.subcommands, "job-migrate.yaml: does not run `outboxd migrate`")
    check(migrate["image"] == container["image"], "job-migrate.yaml: not the Deployment's image")
    migrate_env = container_env(objs, migrate)
    check("DATABASE_URL" in migrate_env, "job-migrate.yaml: no DATABASE_URL")
    unknown = facts.unknown_variables(migrate_env)
    check(not unknown, f"job-migrate.yaml: outboxd reads no variable {', '.join(unknown)}")
    notes.append("`outboxd run` in the Deployment, `outboxd migrate` in the Job, same image")

    pdb = get(objs, "PodDisruptionBudget", "outboxd", "disruptions")
    check(matches(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]), "poddisruptionbudget.yaml selects no pod")
    check(deployment["spec"]["replicas"] >= 2, "deployment.yaml: fewer than 2 replicas")
    return notes


if __name__ == "__main__":
    common.main("the Kubernetes base matches outboxd's ports, paths and options", body, __doc__)
