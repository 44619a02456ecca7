#!/usr/bin/env python3
"""The intake under attack: steady mail (one commit per transaction) while unauthenticated
clients flood the Standard Webhooks endpoint, and /livez probed all along. The webhooks are
on OUTBOXD_LISTEN beside the probes, as they are without OUTBOXD_ADMIN_LISTEN.

    python3 bench/intake.py                       # every attack, 15 s each
    python3 bench/intake.py --duration 5 stuffed  # one of them, shorter

Attacks (none of them knows the secret):
- none: the steady mail alone, the yardstick;
- stuffed: 8 connections posting 512 KiB bodies with a fresh timestamp and a
  webhook-signature of 3 500 empty `v1,` entries (what once cost a second of CPU each);
- wellformed: the same with as many 32-byte `v1,` tags as fit in the 16 KiB head, which
  passes every check made before the body, so each request costs its body and one HMAC;
- trickle: 300 connections sending a body a byte a second (past the listener's 256).

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import base64
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
BODY = b"{" + b" " * (512 * 1024 - 2) + b"}"


def head(port, signature):
    return (f"POST /webhooks/standard HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"webhook-id: msg_flood\r\nwebhook-timestamp: {int(time.time())}\r\n"
            f"webhook-signature: {signature}\r\nContent-Length: {len(BODY)}\r\n\r\n").encode()


def flood(port, signature, stop, counts):
    """One connection posting the signed-looking request again and again until `stop`."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                while not stop.is_set():
                    s.sendall(head(port, signature))
                    s.sendall(BODY)
                    answer = s.recv(65536)
                    if not answer:
                        break
                    counts.append(answer.split(b" ", 2)[1])
                    if b"Connection: close" in answer or b"connection: close" in answer:
                        break
        except OSError:
            time.sleep(0.01)


def trickler(port):
    """A connection that has sent a request head and the first byte of its body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(head(port, "v1," + "A" * 43 + "=") + b"{")
    return s


def trickle(port, stop, opened):
    """300 connections sending a byte a second; one evicted or cut off is opened again."""
    sockets = []
    for _ in range(300):
        try:
            sockets.append(trickler(port))
        except OSError:
            pass
    opened.append(len(sockets))
    while not stop.wait(1.0):
        for s in list(sockets):
            try:
                s.sendall(b" ")
            except OSError:
                sockets.remove(s)
                s.close()
                try:
                    sockets.append(trickler(port))
                except OSError:
                    pass
    for s in sockets:
        s.close()


def probe_livez(port, stop, latencies):
    while not stop.wait(0.2):
        start = time.time()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                ok = s.recv(100).startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
        latencies.append((time.time() - start) * 1000 if ok else float("inf"))


def measure(args, attack):
    import psycopg
    with run.database("outboxd_bench_intake") as url, run.smtp_sink() as smtp:
        proc = run.Outboxd(url, smtp, *run.TUNED, "--webhook-secret", SECRET)
        stop = threading.Event()
        counts, opened, livez = [], [], []
        threads = [threading.Thread(target=probe_livez, args=(proc.http, stop, livez))]
        if attack == "stuffed":
            signature = " ".join(["v1,"] * 3500)
        elif attack == "wellformed":
            signature = " ".join(["v1," + "A" * 43 + "="] * 320)
        if attack in ("stuffed", "wellformed"):
            threads += [threading.Thread(target=flood, args=(proc.http, signature, stop, counts))
                        for _ in range(8)]
        if attack == "trickle":
            threads.append(threading.Thread(target=trickle, args=(proc.http, stop, opened)))
        committed = {}
        with psycopg.connect(url, autocommit=True) as conn:
            for t in threads:
                t.start()
            time.sleep(1)
            cpu_before, n = run.steady_load(args, proc, conn, committed)
            stop.set()
            for t in threads:
                t.join()
        run.wait_drained(url, n)
        cpu = proc.cpu_seconds() - cpu_before
        proc.stop()
        sent = dict(tuple(line.split("|")) for line in run.psql(
            url, "SELECT id, extract(epoch FROM dispatched_at) FROM outbox_messages").splitlines())
    latencies = sorted(1000 * (float(sent[str(i)]) - t) for i, t in committed.items())
    q = statistics.quantiles(latencies, n=100)
    answered = {}
    for status in counts:
        answered[status.decode()] = answered.get(status.decode(), 0) + 1
    return [attack, f"{q[49]:.0f}", f"{q[98]:.0f}", f"{statistics.median(livez):.1f}",
            f"{max(livez):.1f}", str(sum(1 for l in livez if l == float('inf'))),
            ", ".join(f"{k}: {v}" for k, v in sorted(answered.items())) or (f"{opened[0]} open" if opened else "-"),
            f"{1000 * cpu / n:.2f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attacks", nargs="*", default=["none", "stuffed", "wellformed", "trickle"])
    parser.add_argument("--rate", type=int, default=50, help="steady commits a second")
    parser.add_argument("--duration", type=int, default=15)
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    if not args.no_build:
        import subprocess
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=run.ROOT, check=True)
    rows = [measure(args, attack) for attack in args.attacks]
    run.table(f"The intake under attack: {args.rate} commits a second for {args.duration} s, "
              f"/livez probed every 200 ms",
              ["attack", "commit-to-send p50 ms", "p99 ms", "/livez median ms", "/livez max ms",
               "/livez failed", "flood answers", "outboxd CPU ms per email (attack included)"], rows)


if __name__ == "__main__":
    main()
