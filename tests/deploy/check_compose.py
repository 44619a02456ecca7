#!/usr/bin/env python3
"""deploy/compose/compose.yaml, checked offline (no image can be pulled here): it parses; the
services are there and start in order (PostgreSQL healthy, `outboxd migrate` completed, then
`outboxd run`); every mounted file exists; the Prometheus configuration with its mounted
rules passes `promtool check config` and the Alertmanager one `amtool check-config`, with the
example's routes; and ports, paths and the scrape job agree with outboxd's options and rules.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import yaml

sys.dont_write_bytecode = True  # no __pycache__ beside the checks

import common
from common import COMPOSE, ROOT, check, rel

COMPOSE_FILE = COMPOSE / "compose.yaml"
SERVICES = ("postgres", "migrate", "outboxd", "mailpit", "prometheus", "alertmanager", "grafana")
MAILPIT_SMTP_PORT = 1025  # Mailpit's defaults: SMTP on 1025, the web UI on 8025
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def mounts(name: str, service: dict) -> dict[str, Path]:
    """Container path -> host file or directory, for the bind mounts of a service."""
    found = {}
    for volume in service.get("volumes") or []:
        source, _, rest = volume.partition(":")
        if not source.startswith((".", "/")):
            continue  # a named volume
        target = rest.split(":")[0]
        host = (COMPOSE / source).resolve()
        check(host.exists(), f"{rel(COMPOSE_FILE)}: {name} mounts {source}, which does not exist")
        found[target] = host
    return found


def published(service: dict) -> dict[int, str]:
    """Container port -> the published "host:port" mapping."""
    ports = {}
    for mapping in service.get("ports") or []:
        parts = str(mapping).split(":")
        ports[int(parts[-1].split("/")[0])] = str(mapping)
    return ports


def depends(service: dict, on: str) -> str | None:
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        return "service_started" if on in depends_on else None
    entry = depends_on.get(on)
    return None if entry is None else (entry or {}).get("condition", "service_started")


def check_order(services: dict, facts: common.Facts) -> list[str]:
    check(services["migrate"].get("command") == ["migrate"] and "migrate" in facts.subcommands,
          "compose: the migrate service does not run `outboxd migrate`")
    check(services["outboxd"].get("command") == ["run"] and "run" in facts.subcommands,
          "compose: the outboxd service does not run `outboxd run`")
    check(depends(services["migrate"], "postgres") == "service_healthy",
          "compose: migrate must wait for postgres to be healthy")
    check("healthcheck" in services["postgres"], "compose: postgres has no healthcheck")
    check(depends(services["outboxd"], "migrate") == "service_completed_successfully",
          "compose: outboxd must wait for migrate to complete successfully")
    check(services["outboxd"].get("image") == services["migrate"].get("image"),
          "compose: migrate and outboxd run different images")
    check(services["outboxd"].get("build", {}).get("context") is not None, "compose: outboxd is not built here")
    context = (COMPOSE / services["outboxd"]["build"]["context"]).resolve()
    dockerfile = context / services["outboxd"]["build"].get("dockerfile", "Dockerfile")
    check(dockerfile.is_file(), f"compose: no {rel(dockerfile)}")
    return ["postgres (healthy) -> outboxd migrate (completed) -> outboxd run, built from " + rel(dockerfile)]


def check_outboxd(services: dict, facts: common.Facts) -> tuple[list[str], int]:
    env = environment(services["outboxd"])
    unknown = facts.unknown_variables(env) + facts.unknown_variables(environment(services["migrate"]))
    check(not unknown, f"compose: outboxd reads no variable {', '.join(unknown)}")
    listen_port = common.port_of(facts.listen(env))
    ports = published(services["outboxd"])
    check(listen_port in ports, f"compose: outboxd does not publish OUTBOXD_LISTEN's port {listen_port}")
    notes = [f"outboxd publishes {ports[listen_port]} = OUTBOXD_LISTEN {facts.listen(env)}"]
    if "OUTBOXD_ADMIN_LISTEN" in env:
        admin = common.port_of(env["OUTBOXD_ADMIN_LISTEN"])
        check(admin in ports, f"compose: outboxd does not publish OUTBOXD_ADMIN_LISTEN's port {admin}")
        check(len(env.get("OUTBOXD_ADMIN_TOKEN", "")) >= 16,
              "compose: OUTBOXD_ADMIN_LISTEN needs an OUTBOXD_ADMIN_TOKEN of 16 characters or more")
        notes.append(f"outboxd publishes {ports[admin]} = OUTBOXD_ADMIN_LISTEN")
    smtp = urlsplit(env.get("OUTBOXD_SMTP_URL", ""))
    check(smtp.hostname == "mailpit" and smtp.port == MAILPIT_SMTP_PORT,
          f"compose: OUTBOXD_SMTP_URL should be smtp://mailpit:{MAILPIT_SMTP_PORT}, is {env.get('OUTBOXD_SMTP_URL')}")
    check(env.get("OUTBOXD_FROM"), "compose: OUTBOXD_SMTP_URL is set without OUTBOXD_FROM: outboxd refuses to start")
    for name in ("migrate", "outboxd"):
        database = urlsplit(environment(services[name]).get("DATABASE_URL", ""))
        check(database.hostname == "postgres" and database.port == 5432,
              f"compose: {name}'s DATABASE_URL does not point at postgres:5432")
    notes.append(f"outboxd sends to mailpit:{MAILPIT_SMTP_PORT}; both outboxd services use postgres:5432")
    return notes, listen_port


def rules_job() -> str:
    rules = yaml.safe_load((ROOT / "alerts" / "outboxd.rules.yml").read_text(encoding="utf-8"))
    match = re.search(r'job="([^"]+)"', rules["groups"][0]["rules"][0]["expr"])
    check(match is not None, "alerts/outboxd.rules.yml: no job=\"...\" in the first rule")
    return match.group(1)


def check_prometheus(services: dict, facts: common.Facts, listen_port: int) -> list[str]:
    promtool = common.tool("promtool", "prometheus")
    files = mounts("prometheus", services["prometheus"])
    config_path = files.get("/etc/prometheus/prometheus.yml")
    check(config_path is not None, "compose: prometheus does not mount /etc/prometheus/prometheus.yml")
    config = common.load_one(config_path)
    # Lay out the mounts under /etc/prometheus as the container sees them, so that promtool
    # resolves rule_files as Prometheus will.
    with tempfile.TemporaryDirectory() as tmp:
        for target, host in files.items():
            inside = PurePosixPath(target)
            check(inside.is_relative_to("/etc/prometheus"), f"compose: prometheus mounts {target} outside /etc/prometheus")
            destination = Path(tmp, *inside.relative_to("/etc/prometheus").parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if host.is_dir() else shutil.copyfile)(host, destination)
        out = common.run([promtool, "check", "config", str(Path(tmp, "prometheus.yml"))], "promtool check config")
    found = re.search(r"SUCCESS: (\d+) rule files found", out)
    check(found is not None and int(found.group(1)) >= 1,
          f"promtool check config found no rule file: rule_files {config.get('rule_files')} match no mounted file")
    rules = re.findall(r"SUCCESS: (\d+) rules found", out)
    check(bool(rules), f"promtool checked no rules:\n{out}")

    jobs = {job["job_name"]: job for job in config.get("scrape_configs", [])}
    job = rules_job()
    check(job in jobs, f"prometheus.yml has no scrape job {job!r}, which the alerts select")
    scrape = jobs[job]
    check(scrape.get("metrics_path", "/metrics") == facts.metrics_path and facts.metrics_path in facts.routes,
          f"prometheus.yml: job {job} scrapes {scrape.get('metrics_path', '/metrics')}, outboxd serves {facts.metrics_path}")
    targets = [t for static in scrape.get("static_configs", []) for t in static.get("targets", [])]
    check(targets == [f"outboxd:{listen_port}"],
          f"prometheus.yml: job {job} scrapes {targets}, outboxd listens on outboxd:{listen_port}")
    alertmanagers = [t for am in config.get("alerting", {}).get("alertmanagers", [])
                     for static in am.get("static_configs", []) for t in static.get("targets", [])]
    check(alertmanagers == [f"alertmanager:{ALERTMANAGER_PORT}"],
          f"prometheus.yml: alerts go to {alertmanagers}, not alertmanager:{ALERTMANAGER_PORT}")
    return [f"promtool check config: {found.group(1)} rule file ({rules[0]} rules) mounted from "
            f"{rel(files['/etc/prometheus/rules/outboxd.rules.yml'])}",
            f"scrape job {job} (as the alerts select) -> outboxd:{listen_port}{facts.metrics_path}"]


def check_alertmanager(services: dict) -> list[str]:
    amtool = common.tool("amtool", "prometheus-alertmanager")
    files = mounts("alertmanager", services["alertmanager"])
    config_path = files.get("/etc/alertmanager/alertmanager.yml")
    check(config_path is not None, "compose: alertmanager does not mount /etc/alertmanager/alertmanager.yml")
    common.run([amtool, "check-config", str(config_path)], f"amtool check-config {rel(config_path)}")
    config = common.load_one(config_path)
    example = common.load_one(ROOT / "alerts" / "alertmanager.example.yml")
    for key in ("route", "inhibit_rules"):
        check(config.get(key) == example.get(key),
              f"{rel(config_path)}: its {key} differs from alerts/alertmanager.example.yml's")
    for labels, receiver in ((["severity=critical", "alertname=OutboxDispatcherDown"], "pager"),
                             (["severity=warning", "alertname=OutboxDeadLetters"], "ticket")):
        routed = common.run([amtool, "config", "routes", "test", f"--config.file={config_path}", *labels],
                            "amtool config routes test", stdout_only=True).strip()
        check(routed == receiver, f"{rel(config_path)}: {labels} goes to {routed}, not {receiver}")
    smarthost = config.get("global", {}).get("smtp_smarthost", "")
    check(smarthost == f"mailpit:{MAILPIT_SMTP_PORT}", f"{rel(config_path)}: smtp_smarthost is not mailpit:{MAILPIT_SMTP_PORT}")
    return [f"amtool check-config {rel(config_path)}; routes and inhibit rules = alerts/alertmanager.example.yml's; "
            "critical -> pager, warning -> ticket, mailed to Mailpit"]


def check_grafana(services: dict) -> list[str]:
    files = mounts("grafana", services["grafana"])
    datasources = [h for t, h in files.items() if t.startswith("/etc/grafana/provisioning/datasources/")]
    providers = [h for t, h in files.items() if t.startswith("/etc/grafana/provisioning/dashboards/")]
    check(len(datasources) == 1 and len(providers) == 1, "compose: grafana must mount one datasource and one dashboard provisioning file")
    prometheus = [d for d in common.load_one(datasources[0])["datasources"] if d["type"] == "prometheus"]
    check(len(prometheus) == 1 and prometheus[0].get("isDefault"), f"{rel(datasources[0])}: no default Prometheus data source")
    url = urlsplit(prometheus[0]["url"])
    check(url.hostname == "prometheus" and url.port == PROMETHEUS_PORT,
          f"{rel(datasources[0])}: Prometheus is at prometheus:{PROMETHEUS_PORT}, not {prometheus[0]['url']}")
    notes = [f"Grafana's default data source: {prometheus[0]['url']}"]
    for provider in common.load_one(providers[0])["providers"]:
        path = provider["options"]["path"]
        check(path in files, f"compose: grafana does not mount anything at {path} ({rel(providers[0])})")
        dashboards = sorted(p.name for p in files[path].glob("*.json"))
        check(dashboards, f"compose: no dashboard JSON in {rel(files[path])}")
        notes.append(f"Grafana provisions {', '.join(dashboards)} from {rel(files[path])} at {path}")
    check(8025 in published(services["mailpit"]), "compose: Mailpit's web UI (8025) is not published")
    return notes


def body(args) -> list[str]:
    facts = common.facts(args)
    compose = common.load_one(COMPOSE_FILE)
    services = compose.get("services", {})
    missing = [s for s in SERVICES if s not in services]
    check(not missing, f"{rel(COMPOSE_FILE)}: no service {', '.join(missing)}")
    for name, service in services.items():
        check("image" in service or "build" in service, f"compose: {name} has neither image nor build")
        if name not in ("migrate", "outboxd"):
            check(":" in service.get("image", "") and not service["image"].endswith(":latest"),
                  f"compose: {name}'s image {service.get('image')!r} has no pinned tag")
        for other in (service.get("depends_on") or {}):
            check(other in services, f"compose: {name} depends on {other}, which is no service")
        mounts(name, service)
    for name in (compose.get("volumes") or {}):
        check(any(str(v).startswith(f"{name}:") for s in services.values() for v in s.get("volumes") or []),
              f"compose: the volume {name} is not used")
    notes = check_order(services, facts)
    outboxd_notes, listen_port = check_outboxd(services, facts)
    notes += outboxd_notes
    notes += check_prometheus(services, facts, listen_port)
    notes += check_alertmanager(services)
    notes += check_grafana(services)
    return notes


if __name__ == "__main__":
    common.main("the compose stack is consistent", body, __doc__)
