#!/usr/bin/env python3
"""outboxd under faults: runs the release binary against PostgreSQL and a real SMTP server
(aiosmtpd, tests/support/smtp_server.py) that misbehaves on cue, and writes what it
measured to RELIABILITY.md. Nothing here is typed in: every figure comes from a run.

    python3 bench/reliability.py                 # every scenario, full size; rewrites RELIABILITY.md
    python3 bench/reliability.py kill lease      # some of them; rewrites their sections only
    python3 bench/reliability.py --small         # a quick run at a small size (prints)

Scenarios:
  kill      kill -9 replicas again and again while they drain; lost and duplicated messages
  lease     the lease-overrun reproduction (5 s leases, 1 s SMTP timeout, a server slow to
            greet and to answer, a connection reset after the body), two replicas, N rounds
  smtp      the SMTP server dies for a while under steady traffic, then comes back
  throttle  the relay answers 454 4.7.0 to every fourth message for a minute, 2 replicas, 50/s
  database  a private PostgreSQL cluster stops for 60 s under steady traffic, then restarts
  rowlock   a transaction locks one row of each batch while it is being sent, for 4 s and
            for 15 s (past the 10 s lease), 2 replicas
  longtx    a REPEATABLE READ transaction held open for 10 minutes under 200 messages/s
  memory    peak memory draining 500 000 pending messages
Needs what bench/run.py needs, plus aiosmtpd (tests/requirements.txt) and initdb/pg_ctl.
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (the benchmark's helpers: databases, the binary, smtp-sink)

ROOT = bench.ROOT
SERVER = os.path.join(ROOT, "tests", "support", "smtp_server.py")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


@contextmanager
def smtp_server(port=None, flags=()):
    """aiosmtpd on loopback, spooling every accepted message; yields (port, spool dir, restart)."""
    port = port or bench.free_port()
    spool = tempfile.mkdtemp(prefix="outboxd-reliability-")
    state = {}

    def start():
        proc = subprocess.Popen([sys.executable, SERVER, "--port", str(port), "--spool", spool, *flags],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if proc.stdout.readline().strip() != "READY":
            raise SystemExit("the SMTP server did not start")
        state["proc"] = proc

    def stop():
        proc = state.pop("proc", None)
        if proc:
            proc.kill()
            proc.wait()

    start()
    try:
        yield port, spool, start, stop
    finally:
        stop()
        shutil.rmtree(spool, ignore_errors=True)


def received(spool):
    """How many times each recipient was delivered."""
    counts = collections.Counter()
    path = os.path.join(spool, "messages.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                for to in json.loads(line)["rcpt_tos"]:
                    counts[to] += 1
    return counts


def start_outboxd(url, port, flags, worker):
    return subprocess.Popen([bench.BIN, "run", "--database-url", url, "--listen", "127.0.0.1:0",
                             "--smtp-url", f"smtp://127.0.0.1:{port}", "--from", "Reliability <r@example.com>",
                             "--worker-id", worker, *flags],
                            env=dict(os.environ, RUST_LOG="warn"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def insert(url, recipients):
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                "jsonb_build_object('to', %s::text, 'name', 'R', 'verify_url', 'https://x/v'))",
                [(to,) for to in recipients])


def settled(url):
    """Every row sent or dead-lettered."""
    return bench.psql(url, "SELECT count(*) FROM outbox_messages "
                           "WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL") == "0"


def wait_until(condition, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def tally(expected, counts):
    lost = sum(1 for to in expected if counts[to] == 0)
    duplicates = sum(counts[to] - 1 for to in expected if counts[to] > 1)
    return lost, duplicates


def scenario_kill(args):
    """Two replicas drain; every couple of seconds one is killed with SIGKILL and restarted."""
    flags = ["--batch-size", "50", "--smtp-concurrency", "4", "--lease", "10s", "--smtp-timeout", "2s",
             "--poll-interval", "1s"]
    expected = [f"k{i}@example.com" for i in range(args.kill_messages)]
    with bench.database("outboxd_reliability_kill") as url, smtp_server() as (port, spool, _, _):
        insert(url, expected)
        replicas = [start_outboxd(url, port, flags, f"r{i}") for i in range(2)]
        kills = 0
        started = time.time()
        while kills < args.kills and not settled(url):
            time.sleep(random.uniform(0.5, 2.0))
            victim = random.randrange(2)
            replicas[victim].send_signal(signal.SIGKILL)
            replicas[victim].wait()
            kills += 1
            replicas[victim] = start_outboxd(url, port, flags, f"r{victim}-{kills}")
        wait_until(lambda: settled(url), 600, "the kill scenario to settle")
        wall = time.time() - started
        for proc in replicas:
            proc.terminate()
            proc.wait()
        lost, duplicates = tally(expected, received(spool))
    return [[f"{len(expected)}", f"{kills}", f"{lost}", f"{duplicates}",
             f"{duplicates / max(kills, 1):.1f}", f"{wall:.0f}"]]


def scenario_lease(args):
    """The issue's reproduction, N rounds of 4 slow messages and one reset after its body."""
    flags = ["--lease", "5s", "--smtp-timeout", "1s", "--batch-size", "4", "--smtp-concurrency", "1",
             "--poll-interval", "200ms", "--retry-backoff", "1h"]
    slow = [f"lag900-r{r}-{i}@example.com" for r in range(args.rounds) for i in range(4)]
    with bench.database("outboxd_reliability_lease") as url, \
            smtp_server(flags=["--greeting-delay", "0.9"]) as (port, spool, _, _):
        replicas = [start_outboxd(url, port, flags, f"r{i}") for i in range(2)]
        started = time.time()
        for r in range(args.rounds):
            insert(url, slow[4 * r:4 * r + 4] + [f"resetafter-r{r}@example.com"])
        wait_until(lambda: all(received(spool)[to] for to in slow), 1200, "every slow message")
        # A lease that had been overrun would now run out and its rows go out again.
        time.sleep(6)
        wall = time.time() - started
        lost_leases = bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE attempts > 0 "
                                      "AND payload->>'to' LIKE 'lag%'")
        for proc in replicas:
            proc.terminate()
            proc.wait()
        lost, duplicates = tally(slow, received(spool))
    return [[f"{args.rounds}", f"{len(slow)}", f"{lost}", f"{duplicates}", lost_leases, f"{wall:.0f}"]]


def scenario_rowlock(args):
    """Rounds of 4 messages on 2 replicas (10 s leases), the server answering each 1.5 s
    after its body: as soon as the batch is claimed, a transaction locks one of its rows
    (SELECT ... FOR UPDATE) and keeps it locked for a while, shorter than the lease and
    longer."""
    import psycopg
    flags = ["--lease", "10s", "--smtp-timeout", "3s", "--poll-interval", "200ms"]
    rows = []
    for lock_s in (4, 15):
        with bench.database(f"outboxd_reliability_rowlock_{lock_s}") as url, \
                smtp_server() as (port, spool, _, _), psycopg.connect(url) as conn:
            replicas = [start_outboxd(url, port, flags, f"r{i}") for i in range(2)]
            mates, locked, recorded_while_locked = [], [], 0
            started = time.time()
            for r in range(args.rounds):
                batch = [f"lag1500-l{lock_s}-r{r}-{i}@example.com" for i in range(4)]
                insert(url, batch)
                while not conn.execute("SELECT claim_token IS NOT NULL FROM outbox_messages "
                                       "WHERE payload->>'to' = %s", (batch[0],)).fetchone()[0]:
                    conn.rollback()
                    time.sleep(0.02)
                conn.execute("SELECT 1 FROM outbox_messages WHERE payload->>'to' = %s FOR UPDATE", (batch[0],))
                time.sleep(lock_s)
                recorded_while_locked += int(bench.psql(
                    url, "SELECT count(*) FROM outbox_messages WHERE dispatched_at IS NOT NULL "
                         f"AND payload->>'to' LIKE 'lag1500-l{lock_s}-r{r}-%'"))
                conn.commit()
                wait_until(lambda: all(received(spool)[to] for to in batch), 60, "the round's messages")
                mates += batch[1:]
                locked.append(batch[0])
            wait_until(lambda: settled(url), 120, "the row-lock scenario to settle")
            # A batch-mate whose lease ran out unrecorded would now go out again.
            time.sleep(11)
            wall = time.time() - started
            for proc in replicas:
                proc.terminate()
                proc.wait()
            counts = received(spool)
            lost, mates_twice = tally(mates, counts)
            lost_locked, locked_twice = tally(locked, counts)
        rows.append([f"{lock_s}", f"{args.rounds}", f"{recorded_while_locked} of {len(mates)}",
                     f"{mates_twice}", f"{locked_twice}", f"{lost + lost_locked}", f"{wall:.0f}"])
    return rows


def steady_inserts(url, prefix, rate, stop_at):
    """Inserts `rate` messages a second until `stop_at`; returns the recipients."""
    import psycopg
    sent = []
    with psycopg.connect(url, autocommit=True) as conn:
        n = 0
        start = time.time()
        while time.time() < stop_at:
            due = start + n / rate
            if due > time.time():
                time.sleep(due - time.time())
            to = f"{prefix}{n}@example.com"
            conn.execute("INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                         "jsonb_build_object('to', %s::text, 'name', 'R', 'verify_url', 'https://x/v'))", (to,))
            sent.append(to)
            n += 1
    return sent


def scenario_smtp(args):
    """The SMTP server dies for `--outage` seconds while 50 messages a second are committed."""
    import threading
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    with bench.database("outboxd_reliability_smtp") as url, \
            smtp_server() as (port, spool, start_server, stop_server):
        proc = start_outboxd(url, port, flags, "r0")
        result = {}
        stop_at = time.time() + 10 + args.outage + 10
        inserting = threading.Thread(target=lambda: result.setdefault("sent", steady_inserts(url, "s", 50, stop_at)))
        inserting.start()
        time.sleep(10)
        stop_server()
        time.sleep(args.outage)
        back = time.time()
        start_server()
        inserting.join()
        wait_until(lambda: settled(url), 600, "the SMTP outage to drain")
        recovered = time.time() - back
        attempts = bench.psql(url, "SELECT coalesce(sum(attempts), 0) FROM outbox_messages")
        dead = bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL")
        proc.terminate()
        proc.wait()
        lost, duplicates = tally(result["sent"], received(spool))
    return [[f"{args.outage}", f"{len(result['sent'])}", f"{lost}", f"{duplicates}", attempts, dead,
             f"{recovered:.1f}"]]


def scenario_throttle(args):
    """A relay that answers `454 4.7.0 Throttling failure` to every fourth message for a
    minute, under a 50/s limit shared by two replicas, while 40 messages a second are
    committed: nothing lost, no attempt spent, the pace cut and recovered."""
    import threading
    limit = 50
    flags = ["--rate-limit", f"{limit}/s"]
    with bench.database("outboxd_reliability_throttle") as url, \
            smtp_server(flags=["--throttle-every", "4", "--throttle-for", str(args.throttle)]) as (port, spool, _, _):
        procs = [start_outboxd(url, port, flags, f"r{i}") for i in range(2)]
        result, paces = {}, []
        started = time.time()
        stop_at = started + args.throttle + 20
        inserting = threading.Thread(target=lambda: result.setdefault("sent", steady_inserts(url, "t", 40, stop_at)))
        inserting.start()
        while inserting.is_alive():
            pace = bench.psql(url, "SELECT coalesce(min(pace), 0) FROM outbox_send_rate")
            paces.append(float(pace or 0))
            time.sleep(1)
        inserting.join()
        wait_until(lambda: settled(url), 600, "the throttled backlog to drain")
        wall = time.time() - started
        attempts = bench.psql(url, "SELECT coalesce(sum(attempts), 0) FROM outbox_messages")
        dead = bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL")
        for proc in procs:
            proc.terminate()
            proc.wait()
        throttled_path = os.path.join(spool, "throttled.jsonl")
        throttled = sum(1 for _ in open(throttled_path)) if os.path.exists(throttled_path) else 0
        lost, duplicates = tally(result["sent"], received(spool))
    lowest = min((p for p in paces if p > 0), default=0)
    return [[f"{args.throttle}", f"{len(result['sent'])}", f"{throttled}", f"{lost}", f"{duplicates}", attempts,
             dead, f"{limit}", f"{lowest:.1f}", f"{wall:.0f}"]]


def scenario_database(args):
    """A private cluster stops for 60 s while 50 messages a second are committed (inserts
    fail meanwhile, as the application's would); outboxd rides it out."""
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    with bench.private_cluster() as (url, start_db, stop_db), smtp_server() as (port, spool, _, _):
        subprocess.run([bench.BIN, "migrate", "--create-database", "--database-url", url], check=True, capture_output=True)
        proc = start_outboxd(url, port, flags, "r0")
        before = steady_inserts(url, "before", 50, time.time() + 10)
        stop_db()
        time.sleep(args.db_outage)
        back = time.time()
        start_db()
        after = steady_inserts(url, "after", 50, time.time() + 10)
        wait_until(lambda: settled(url), 600, "the database outage to drain")
        recovered = time.time() - back
        proc.terminate()
        proc.wait()
        sent = before + after
        lost, duplicates = tally(sent, received(spool))
    return [[f"{args.db_outage}", f"{len(sent)}", f"{lost}", f"{duplicates}", f"{recovered:.1f}"]]


def scenario_memory(args):
    """Peak memory while draining a large backlog into smtp-sink."""
    with bench.database("outboxd_reliability_memory") as url:
        bench.insert_pending(url, args.pending)
        with bench.smtp_sink() as port:
            proc = bench.Outboxd(url, port, "--batch-size", "400", "--smtp-concurrency", "16")
            started = time.time()
            bench.wait_drained(url, args.pending)
            wall = time.time() - started
            rss = proc.peak_rss_mib()
            proc.stop()
    return [[f"{args.pending}", f"{rss:.1f}", f"{wall:.0f}"]]


def scenario_longtx(args):
    """The benchmark's long-transaction scenario: every message committed was sent, and
    what a transaction held open does to claims and latency."""
    args.rate, args.longtx_window = 200, 60 if not args.small else 10
    _, header, rows = bench.measure_longtx(args)
    return [header] + rows


def first_arrival_after(spool, since):
    """Seconds from `since` to the first message the server took after it, or None."""
    path = os.path.join(spool, "messages.jsonl")
    times = []
    if os.path.exists(path):
        with open(path) as f:
            times = [json.loads(line)["received_at"] for line in f]
    later = [t for t in times if t >= since]
    return min(later) - since if later else None


def scenario_failover(args):
    """The first relay dies for `--outage` seconds while 50 messages a second are committed; a
    second relay is its fallback (OUTBOXD_SMTP_FALLBACK_URLS)."""
    import threading
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    with bench.database("outboxd_reliability_failover") as url, \
            smtp_server() as (port, spool, start_first, stop_first), \
            smtp_server() as (fallback_port, fallback_spool, _, _):
        fallback = ["--smtp-fallback-urls", f"smtp://127.0.0.1:{fallback_port}"]
        proc = start_outboxd(url, port, flags + fallback, "r0")
        result = {}
        stop_at = time.time() + 10 + args.outage + 10
        inserting = threading.Thread(target=lambda: result.setdefault("sent", steady_inserts(url, "f", 50, stop_at)))
        inserting.start()
        time.sleep(10)
        down = time.time()
        stop_first()
        time.sleep(args.outage)
        back = time.time()
        start_first()
        inserting.join()
        wait_until(lambda: settled(url), 600, "the failover run to drain")
        proc.terminate()
        proc.wait()
        through_fallback = received(fallback_spool)
        lost, duplicates = tally(result["sent"], received(spool) + through_fallback)
        failover = first_arrival_after(fallback_spool, down)
        returned = first_arrival_after(spool, back)
    seconds = lambda s: "none" if s is None else f"{s:.1f}"
    return [[f"{args.outage}", f"{len(result['sent'])}", f"{lost}", f"{duplicates}",
             f"{sum(through_fallback.values())}", seconds(failover), seconds(returned)]]


SCENARIOS = {
    "kill": ("kill -9 while draining (2 replicas, batch 50, 10 s leases)",
             ["messages", "kills", "lost", "duplicates", "duplicates per kill", "wall s"], scenario_kill),
    "lease": ("Slow server against short leases (the lease-overrun reproduction, 2 replicas)",
              ["rounds", "slow messages", "lost", "sent twice", "slow messages that lost an attempt", "wall s"],
              scenario_lease),
    "smtp": ("SMTP server down under 50 messages a second",
             ["outage s", "messages", "lost", "duplicates", "attempts counted", "dead letters",
              "drained s after it came back"], scenario_smtp),
    "failover": ("The first of two relays down under 50 messages a second (OUTBOXD_SMTP_FALLBACK_URLS)",
                 ["outage s", "messages", "lost", "duplicates", "through the fallback",
                  "s from the outage to the fallback's first message",
                  "s from the first's return to its first message"], scenario_failover),
    "throttle": ("A relay throttling every fourth message under a 50/s limit shared by 2 replicas, "
                 "40 messages a second committed",
                 ["throttling s", "messages", "throttling replies", "lost", "duplicates", "attempts counted",
                  "dead letters", "limit /s", "lowest pace /s", "wall s"], scenario_throttle),
    "database": ("Database stopped under 50 messages a second (private cluster, default settings)",
                 ["outage s", "messages", "lost", "duplicates", "drained s after it came back"],
                 scenario_database),
    "rowlock": ("One row of each batch locked by another transaction (SELECT ... FOR UPDATE) as soon as "
                "it is claimed, the server answering 1.5 s after each message, 2 replicas, 10 s leases",
                ["lock held s", "rounds", "batch-mates recorded while locked", "batch-mates sent twice",
                 "locked rows sent twice", "lost", "wall s"], scenario_rowlock),
    "longtx": ("A REPEATABLE READ transaction held open under 200 messages a second (private cluster, "
               "default settings, autovacuum on); minute 0 is before it opens", None, scenario_longtx),
    "memory": ("Memory draining a backlog (batch 400, 16 connections, smtp-sink)",
               ["pending", "peak RSS MiB", "wall s"], scenario_memory),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--small", action="store_true", help="a quick run at a small size; prints only")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--binary", help="an outboxd binary to run instead of target/release/outboxd")
    args = parser.parse_args()
    if args.binary:
        bench.BIN = args.binary
    args.kill_messages, args.kills = (2000, 3) if args.small else (20_000, 20)
    args.rounds = 2 if args.small else 20
    args.outage = 5 if args.small else 30
    args.db_outage = 5 if args.small else 60
    args.pending = 20_000 if args.small else 500_000
    args.longtx = 30 if args.small else 600
    args.throttle = 10 if args.small else 60
    if not args.no_build and not args.binary:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=ROOT, check=True)
    sections = {}
    for name in args.scenarios:
        title, header, scenario = SCENARIOS[name]
        log(f"== {name}")
        rows = scenario(args)
        if header is None:
            header, rows = rows[0], rows[1:]
        sections[name] = "\n".join([
            f"<!-- scenario: {name} -->",
            f"### {title}\n",
            f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows),
            "",
        ])
        print(sections[name], flush=True)
    if not args.small:
        write_sections(sections)


def write_sections(sections):
    """Rewrites the sections of the scenarios that ran, keeping the others as they were."""
    path = os.path.join(ROOT, "RELIABILITY.md")
    kept = {}
    if os.path.exists(path):
        text = open(path).read()
        for part in text.split("<!-- scenario: ")[1:]:
            name, body = part.split(" -->", 1)
            kept[name] = f"<!-- scenario: {name} -->{body}".rstrip() + "\n"
    kept.update(sections)
    with open(path, "w") as f:
        f.write(HEADER + "\n".join(kept[name] for name in SCENARIOS if name in kept))
    log(f"wrote {', '.join(sections)} in RELIABILITY.md")


HEADER = """# Reliability

What outboxd does under faults, measured by `python3 bench/reliability.py` with the release
binary, PostgreSQL and a real SMTP server (aiosmtpd) that misbehaves on cue, on this
project's 2-core machine. The script writes this file; nothing below is typed in. The same
faults, smaller, are tests in `tests/it/` (`reliability.rs`, `failures.rs`, `replicas.rs`).

Reading the tables: *lost* counts messages never delivered; *duplicates* counts extra
deliveries of the same message (delivery is at least once: a send whose outcome was not yet
written when its process died goes out again after its lease, with the same `Message-ID`).

"""


if __name__ == "__main__":
    main()
