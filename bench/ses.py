#!/usr/bin/env python3
"""A drain through SES's API v2 (`ses://us-east-1`) beside the same drain through SMTP, on
this machine: the SES side is moto's server (tests/support/ses_server.py, a third-party
emulator in one Python process), which sets the pace; the table says what outboxd spends
per message on each path (signing, JSON and base64, HTTP), which is what a real SES
endpoint would see of it.

    python3 bench/ses.py                  # 2 000 messages per path
    python3 bench/ses.py --messages 500

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)


def ses_server(spool):
    port = run.free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(run.ROOT, "tests", "support", "ses_server.py"),
         "--port", str(port), "--spool", spool, "--verify", "example.com"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if proc.stdout.readline().strip() != b"READY":
        raise SystemExit("moto's SES did not start")
    return proc, port


def drain_through_ses(url, messages, flags):
    run.insert_pending(url, messages)
    with tempfile.TemporaryDirectory() as spool:
        moto, port = ses_server(spool)
        env = {"OUTBOXD_SES_ENDPOINT_URL": f"http://127.0.0.1:{port}",
               "AWS_ACCESS_KEY_ID": "AKIDBENCH", "AWS_SECRET_ACCESS_KEY": "bench-secret"}
        moto_before = run.process_cpu_seconds(moto.pid)
        pg_before = run.cpu_by_program(["postgres"])
        started = time.time()
        proc = run.Outboxd(url, None, "--smtp-url", "ses://us-east-1", *flags, env=env)
        polled = run.wait_drained(url, messages)
        wall = time.time() - started
        cpu, rss = proc.cpu_seconds(), proc.peak_rss_mib()
        postgres = run.cpu_by_program(["postgres"]) - pg_before - polled
        moto_cpu = run.process_cpu_seconds(moto.pid) - moto_before
        proc.stop()
        moto.stdin.close()
        moto.wait()
    dead = int(run.psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL"))
    return {"messages": messages, "rate": run.drain_rate(url), "wall": wall, "cpu": cpu, "rss": rss,
            "dead": dead, "others": {"postgres": postgres, "relay": moto_cpu}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--binary", help="an outboxd binary to run instead of target/release/outboxd")
    args = parser.parse_args()
    if args.binary:
        run.BIN = args.binary
    elif not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=run.ROOT, check=True)
    rows = []
    for label in ["SMTP (smtp-sink)", "SES API v2 (moto)"]:
        run.log(f"== {label}")
        with run.database("outboxd_bench_ses") as url:
            if label.startswith("SMTP"):
                r = run.run_drain(url, args.messages, run.TUNED)
                relay_cpu = r["others"]["sink"]
            else:
                r = drain_through_ses(url, args.messages, run.TUNED)
                relay_cpu = r["others"]["relay"]
        n = r["messages"]
        rows.append([label, f"{r['rate']:.0f}", f"{1000 * r['cpu'] / n:.3f}",
                     f"{1000 * r['others']['postgres'] / n:.3f}", f"{1000 * relay_cpu / n:.3f}",
                     f"{r['rss']:.1f}", r["dead"]])
    run.table(f"Through SES's API: {args.messages} pending messages, {' '.join(run.TUNED)}",
              ["path", "msg/s", "outboxd CPU ms/msg", "PostgreSQL CPU ms/msg", "relay CPU ms/msg",
               "peak RSS MiB", "dead"], rows)


if __name__ == "__main__":
    main()
