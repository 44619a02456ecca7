#!/usr/bin/env python3
"""A Markdown table of outboxd's cells from the harness's result directories (their
raw.csv): per cell, the completion rate's median in its baseline, stress and recovery
phases, recovery against baseline, the seconds from the stress phase's start until
completion is back to 90% of baseline, insert-to-send p99 in the baseline and stress phases
and the most dead rows `outbox_messages` held (the harness's summary.json), and the ledger
at the end (sent, lost, duplicated, dead-lettered: outboxd's tables and the sinks, by
message id).

    python3 bench/harness/summarize.py RESULT_DIR [RESULT_DIR ...]
"""

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

BASELINE = ("baseline", "clean_1", "clean")
STRESS = ("restart", "kills", "exhaustion", "kill", "repeated", "idle_1", "readers_1", "pressure_1", "chaos_1")
RECOVERY = ("recovery", "recovery_1", "restart_worker")


def cell(run_dir):
    rows = list(csv.DictReader(open(Path(run_dir) / "raw.csv")))
    rows = [r for r in rows if r["system"] == "outboxd" and r["subject_kind"] == "adapter"]
    by_phase = defaultdict(list)  # completion per sample time, summed over replicas
    times = defaultdict(lambda: defaultdict(float))
    phase_of = {}
    ledger = {}
    for r in rows:
        # Each replica samples on its own clock-aligned tick: one time a period, summed.
        period = float(r["window_s"] or 5) if r["metric"] == "completion_rate" else 5.0
        t = round(float(r["elapsed_s"]) / period) * period
        phase_of[t] = r["phase_label"]
        if r["metric"] == "completion_rate":
            times[r["phase_label"]][t] += float(r["value"])
        elif r["metric"].startswith("outboxd_"):
            ledger[r["metric"]] = float(r["value"])
    for phase, samples in times.items():
        by_phase[phase] = list(samples.values())

    def median(names):
        values = [v for name in names for v in by_phase.get(name, [])]
        return statistics.median(values) if values else None

    baseline = median(BASELINE)
    stress = median(STRESS)
    recovery = median(RECOVERY)
    stress_start = min((t for t, p in phase_of.items() if p in STRESS), default=None)
    back = None
    if baseline and stress_start is not None:
        after = sorted((t, v) for p in list(STRESS) + list(RECOVERY) for t, v in times.get(p, {}).items()
                       if t > stress_start)
        dipped = False
        for t, v in after:
            dipped |= v < 0.9 * baseline
            if dipped and v >= 0.9 * baseline:
                back = t - stress_start
                break
        if not dipped:
            back = 0
    return baseline, stress, recovery, back, ledger


def pressure(run_dir):
    """Insert-to-send p99 (median of the samples) in the baseline and stress phases, and the
    most dead rows of outbox_messages in any phase, from the harness's summary.json."""
    phases = json.load(open(Path(run_dir) / "summary.json"))["systems"]["outboxd"]["phases"]

    def p99(names):
        values = [phases[n]["metrics"]["claim_p99_ms"]["median"] for n in names
                  if "claim_p99_ms" in phases.get(n, {}).get("metrics", {})]
        return values[0] if values else None

    dead = [p["metrics"].get("n_dead_tup@public.outbox_messages", {}).get("peak") for p in phases.values()]
    return p99(BASELINE), p99(STRESS), max((d for d in dead if d is not None), default=None)


def main():
    print("| cell | baseline jobs/s | under the fault | recovery | recovery / baseline | s until back at 90% "
          "| p99 ms, baseline | p99 ms, under it | most dead rows | sent | lost | duplicates | dead letters |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run_dir in sys.argv[1:]:
        name = Path(run_dir).name
        baseline, stress, recovery, back, ledger = cell(run_dir)
        fmt = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
        ratio = f"{recovery / baseline:.2f}" if baseline and recovery else "–"
        p99_baseline, p99_stress, dead = pressure(run_dir)
        print(f"| {name} | {fmt(baseline)} | {fmt(stress)} | {fmt(recovery)} | {ratio} | {fmt(back)} "
              f"| {fmt(p99_baseline)} | {fmt(p99_stress)} | {fmt(dead)} "
              f"| {fmt(ledger.get('outboxd_sent'))} | {fmt(ledger.get('outboxd_lost'))} "
              f"| {fmt(ledger.get('outboxd_duplicates'))} | {fmt(ledger.get('outboxd_dead_letters'))} |")


if __name__ == "__main__":
    main()
