#!/usr/bin/env python3
"""The drain with delivery callbacks on (OUTBOXD_CALLBACK_URL) beside the same drain with them
off, alternated: what keeping a callback in the outcome statement and sending it costs the
delivery rate. The endpoint is bench/callback_endpoint.js, a Node.js server in a process of
its own that answers 204 at once (an application's endpoint would be on another machine; on
this one it takes a share of the same cores, shown in the table); the table also says how long after
the drain the last callback was taken.

    python3 bench/callbacks.py                 # 3 rounds of 50 000 messages each way
    python3 bench/callbacks.py --messages 5000 --rounds 1

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwAAAAAAAAAAA="


class Endpoint:
    """bench/callback_endpoint.js in a process of its own: answers 204 and counts."""

    def __init__(self):
        self.port = run.free_port()
        script = os.path.join(run.ROOT, "bench", "callback_endpoint.js")
        self.proc = subprocess.Popen(["node", script, str(self.port)], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the callback endpoint did not start (is node installed?)")

    @property
    def taken(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/count", timeout=5) as answer:
            return int(answer.read())

    def cpu_seconds(self):
        return run.process_cpu_seconds(self.proc.pid)

    def stop(self):
        run.terminate(self.proc)


def one_drain(messages, callbacks, endpoint):
    with run.database("outboxd_bench_callbacks") as url:
        env = {}
        flags = list(run.TUNED)
        if callbacks:
            flags += ["--callback-url", f"http://127.0.0.1:{endpoint.port}/callbacks"]
            env["OUTBOXD_CALLBACK_SECRET"] = SECRET
        before, endpoint_cpu = endpoint.taken, endpoint.cpu_seconds()
        result = run.run_drain(url, messages, flags, env=env)
        result["endpoint_cpu"] = endpoint.cpu_seconds() - endpoint_cpu
        result["callbacks"] = callbacks
        if callbacks:
            # What the drain left to send when it ended (the sender stops with the replica).
            pending = int(run.psql(url, "SELECT count(*) FROM outbox_callbacks WHERE failed_at IS NULL"))
            result["taken"] = endpoint.taken - before
            result["left"] = pending
        return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    run.add_binary_arguments(parser)
    args = parser.parse_args()
    run.use_binary(args)
    endpoint = Endpoint()
    rows, rates = [], {False: [], True: []}
    for n in range(args.rounds):
        for callbacks in (False, True):
            r = one_drain(args.messages, callbacks, endpoint)
            rates[callbacks].append(r["rate"])
            rows.append([f"{n + 1}", "on" if callbacks else "off", f"{r['rate']:.0f}",
                         f"{1000 * r['cpu'] / r['messages']:.3f}", f"{r['others']['postgres']:.1f}",
                         f"{r['endpoint_cpu']:.1f}" if callbacks else "–", str(r.get("taken", "–")), str(r.get("left", "–")), r["dead"]])
    endpoint.stop()
    median = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    run.table(f"Callbacks: {args.messages} messages drained with callbacks off and on, alternated, "
              f"{' '.join(run.TUNED)}; endpoint bench/callback_endpoint.js",
              ["round", "callbacks", "msg/s", "outboxd CPU ms/msg", "PostgreSQL CPU s",
               "endpoint CPU s", "callbacks taken during the drain", "callbacks left when it ended", "dead letters"], rows)
    print(f"median msg/s: off {median[False]:.0f}, on {median[True]:.0f} "
          f"({100 * median[True] / median[False]:.0f}% of off)")


if __name__ == "__main__":
    main()
