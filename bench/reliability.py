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
  refuse    the relay answers Gmail's 421 4.7.0 to every command for a minute
  reset     the relay takes one message in twenty, then resets the connection before the reply
  pooler    PgBouncer in transaction mode; every backend of the database killed every 5 s
  webhooks  a drain of 10 000 while 8 connections flood the webhook endpoint with forgeries
Each fault scenario also writes a row of the ledger at the top of RELIABILITY.md: each
committed message sent once, twice or more, lost, dead-lettered or still pending.
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


def start_outboxd(url, port, flags, worker, env=None, listen="127.0.0.1:0"):
    return subprocess.Popen([bench.BIN, "run", "--database-url", url, "--listen", listen,
                             "--smtp-url", f"smtp://127.0.0.1:{port}", "--from", "Reliability <r@example.com>",
                             "--worker-id", worker, *flags],
                            env=dict(os.environ, RUST_LOG="warn", **(env or {})),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def insert(url, recipients):
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                "jsonb_build_object('to', %s::text, 'name', 'R', 'verify_url', 'https://x/v'))",
                [(to,) for to in recipients])


def settled(url, scope="true"):
    """Every row (of `scope`, an SQL condition) sent or dead-lettered."""
    return bench.psql(url, "SELECT count(*) FROM outbox_messages "
                           f"WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND ({scope})") == "0"


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


def ledger(url, committed, spools, fault_over, scope="true"):
    """Each committed message's fate, by message id: the copies the relays took (their
    X-Outbox-Id) against its row. `committed` are the recipients the producer's commits
    named (one message each); `fault_over` is when the fault ended, for the time to drain.
    Waits for the rows of `scope` (an SQL condition) to settle, at most ten minutes, before
    counting."""
    try:
        wait_until(lambda: settled(url, scope), 600, "the outbox to settle")
    except SystemExit:
        pass
    drained = time.time() - fault_over
    copies = collections.Counter()
    for spool in spools:
        path = os.path.join(spool, "messages.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    copies[json.loads(line)["outbox_id"]] += 1
    rows = {}
    for line in bench.psql(url, "SELECT payload->>'to', id, CASE WHEN dead_lettered_at IS NOT NULL "
                                "THEN 'dead' WHEN dispatched_at IS NULL THEN 'pending' ELSE 'sent' END "
                                "FROM outbox_messages").splitlines():
        to, id_, state = line.split("|")
        rows[to] = (id_, state)
    fates = collections.Counter()
    for to in committed:
        id_, state = rows.get(to, (None, "missing"))
        taken = copies[id_] if id_ else 0
        if state in ("dead", "pending"):
            fates[state] += 1
        elif taken == 0:
            fates["lost"] += 1
        else:
            fates["once" if taken == 1 else "twice"] += 1
    pending = fates["pending"]
    return {"messages": len(committed), "once": fates["once"], "twice": fates["twice"],
            "lost": fates["lost"], "dead": fates["dead"], "pending": pending,
            "drained": None if pending else round(drained, 1)}


def combined(ledgers):
    """One ledger of several runs of a scenario: counts added, the longest drain."""
    total = {k: sum(f[k] for f in ledgers) for k in ("messages", "once", "twice", "lost", "dead", "pending")}
    drains = [f["drained"] for f in ledgers]
    total["drained"] = None if None in drains else max(drains)
    return total


LEDGER_HEADER = ["scenario", "messages", "sent once", "sent twice or more", "lost", "dead-lettered",
                 "pending at the end", "s to drain after the fault"]


def ledger_row(name, fates):
    drained = "never" if fates["drained"] is None else f"{fates['drained']:.1f}"
    return [f"`{name}`", *(str(fates[k]) for k in ("messages", "once", "twice", "lost", "dead", "pending")),
            drained]


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
        fates = ledger(url, expected, [spool], time.time())
        wall = time.time() - started
        for proc in replicas:
            proc.terminate()
            proc.wait()
        lost, duplicates = tally(expected, received(spool))
    return [[f"{len(expected)}", f"{kills}", f"{lost}", f"{duplicates}",
             f"{duplicates / max(kills, 1):.1f}", f"{wall:.0f}"]], fates


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
        inserted = time.time()
        wait_until(lambda: all(received(spool)[to] for to in slow), 1200, "every slow message")
        # A lease that had been overrun would now run out and its rows go out again.
        time.sleep(6)
        wall = time.time() - started
        # The resets are never taken: those rows retry until their backoff (1 h) is due.
        fates = ledger(url, slow, [spool], inserted, scope="payload->>'to' LIKE 'lag%'")
        lost_leases = bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE attempts > 0 "
                                      "AND payload->>'to' LIKE 'lag%'")
        for proc in replicas:
            proc.terminate()
            proc.wait()
        lost, duplicates = tally(slow, received(spool))
    return [[f"{args.rounds}", f"{len(slow)}", f"{lost}", f"{duplicates}", lost_leases, f"{wall:.0f}"]], fates


def scenario_rowlock(args):
    """Rounds of 4 messages on 2 replicas (10 s leases), the server answering each 1.5 s
    after its body: as soon as the batch is claimed, a transaction locks one of its rows
    (SELECT ... FOR UPDATE) and keeps it locked for a while, shorter than the lease and
    longer."""
    import psycopg
    flags = ["--lease", "10s", "--smtp-timeout", "3s", "--poll-interval", "200ms"]
    rows, ledgers = [], []
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
                released = time.time()
                wait_until(lambda: all(received(spool)[to] for to in batch), 60, "the round's messages")
                mates += batch[1:]
                locked.append(batch[0])
            wait_until(lambda: settled(url), 120, "the row-lock scenario to settle")
            # A batch-mate whose lease ran out unrecorded would now go out again.
            time.sleep(11)
            ledgers.append(ledger(url, mates + locked, [spool], released))
            wall = time.time() - started
            for proc in replicas:
                proc.terminate()
                proc.wait()
            counts = received(spool)
            lost, mates_twice = tally(mates, counts)
            lost_locked, locked_twice = tally(locked, counts)
        rows.append([f"{lock_s}", f"{args.rounds}", f"{recorded_while_locked} of {len(mates)}",
                     f"{mates_twice}", f"{locked_twice}", f"{lost + lost_locked}", f"{wall:.0f}"])
    return rows, combined(ledgers)


def steady_inserts(url, prefix, rate, stop_at):
    """Inserts `rate` messages a second until `stop_at`; returns the recipients."""
    import psycopg
    sent = []
    with psycopg.connect(url, autocommit=True, application_name=PRODUCER) as conn:
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


PRODUCER = "reliability-producer"


def lines_in(spool, name):
    path = os.path.join(spool, name)
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def during_steady_traffic(url, prefix, seconds, fault):
    """Commits 50 messages a second for `seconds` while `fault()` runs beside them; returns
    the recipients committed."""
    import threading
    result = {}
    stop_at = time.time() + seconds
    inserting = threading.Thread(target=lambda: result.setdefault("sent", steady_inserts(url, prefix, 50, stop_at)))
    inserting.start()
    fault()
    inserting.join()
    return result["sent"]


def attempts_and_dead(url):
    return (bench.psql(url, "SELECT coalesce(sum(attempts), 0) FROM outbox_messages"),
            bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL"))


def scenario_refuse(args):
    """The relay answers every command with Gmail's `421 4.7.0 Try again later, closing
    connection.` (tests/support/provider_replies.json) for `--refuse` seconds, then takes mail
    again, while 50 messages a second are committed."""
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    server = ["--refuse-after", "10", "--refuse-for", str(args.refuse)]
    with bench.database("outboxd_reliability_refuse") as url, smtp_server(flags=server) as (port, spool, _, _):
        over = time.time() + 10 + args.refuse
        proc = start_outboxd(url, port, flags, "r0")
        sent = during_steady_traffic(url, "q", 10 + args.refuse + 10, lambda: None)
        fates = ledger(url, sent, [spool], over)
        attempts, dead = attempts_and_dead(url)
        proc.terminate()
        proc.wait()
        refusals = lines_in(spool, "refused.jsonl")
    drained = "never" if fates["drained"] is None else f"{fates['drained']:.1f}"
    return [[f"{args.refuse}", f"{len(sent)}", str(refusals), attempts, dead, drained]], fates


def scenario_reset(args):
    """The relay takes one message in twenty and resets the connection before its reply (the
    client cannot know it was taken, and sends it again), while 50 messages a second are
    committed for `--reset` seconds."""
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    with bench.database("outboxd_reliability_reset") as url, \
            smtp_server(flags=["--reset-share", "0.05"]) as (port, spool, _, _):
        proc = start_outboxd(url, port, flags, "r0")
        sent = during_steady_traffic(url, "x", args.reset, lambda: None)
        fates = ledger(url, sent, [spool], time.time())
        attempts, dead = attempts_and_dead(url)
        proc.terminate()
        proc.wait()
        resets = lines_in(spool, "reset.jsonl")
    return [[f"{len(sent)}", str(resets), str(fates["twice"]), attempts, dead]], fates


def terminate_backends(url):
    """Kills every backend of the database but the producer's (and this query's own)."""
    return bench.psql(url, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           f"WHERE datname = current_database() AND pid <> pg_backend_pid() "
                           f"AND application_name <> '{PRODUCER}'")


def scenario_pooler(args):
    """outboxd through PgBouncer in transaction mode, its LISTEN connection direct
    (OUTBOXD_LISTEN_DATABASE_URL, as the book's Deployment page sets it), 50 messages a
    second committed; every 5 s every backend of the database but the producer's is killed
    (pg_terminate_backend), PgBouncer's server connections and the LISTEN one alike."""
    flags = ["--smtp-timeout", "2s", "--lease", "30s"]
    name = "outboxd_reliability_pooler"
    with bench.database(name) as url, bench.pgbouncer("transaction") as through, \
            smtp_server() as (port, spool, _, _):
        proc = start_outboxd(through(name), port, flags, "r0", env={"OUTBOXD_LISTEN_DATABASE_URL": url})
        killed = []

        def kill_backends():
            for _ in range(args.backend_kills):
                time.sleep(5)
                killed.append(int(terminate_backends(url)))

        sent = during_steady_traffic(url, "p", 5 * args.backend_kills + 5, kill_backends)
        fates = ledger(url, sent, [spool], time.time() - 5)
        attempts, dead = attempts_and_dead(url)
        proc.terminate()
        proc.wait()
    return [[str(len(killed)), str(sum(killed)), f"{len(sent)}", attempts, dead]], fates


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def scenario_webhooks(args):
    """A drain of `--flood-pending` messages into aiosmtpd, alone and then while 8
    connections flood the Standard Webhooks endpoint with well-formed forgeries of 512 KiB
    (bench/intake.py's `wellformed` attack, each costing its body and an HMAC)."""
    import threading
    import intake
    rows, fates = [], None
    for flooded in (False, True):
        with bench.database("outboxd_reliability_webhooks") as url, smtp_server() as (port, spool, _, _):
            recipients = [f"w{i}@example.com" for i in range(args.flood_pending)]
            bench.psql(url, "INSERT INTO outbox_messages (kind, payload) SELECT 'account_verification', "
                            "jsonb_build_object('to', 'w' || i || '@example.com', 'name', 'R', 'verify_url', "
                            f"'https://x/v') FROM generate_series(0, {args.flood_pending - 1}) AS i")
            started = time.time()
            http = bench.free_port()
            proc = start_outboxd(url, port, ["--webhook-secret", intake.SECRET], "r0", listen=f"127.0.0.1:{http}")
            stop, answers = threading.Event(), []
            wait_until(lambda: listening(http), 30, "outboxd to listen")
            signature = " ".join(["v1," + "A" * 43 + "="] * 320)
            threads = [threading.Thread(target=intake.flood, args=(http, signature, stop, answers))
                       for _ in range(8 if flooded else 0)]
            for t in threads:
                t.start()
            wait_until(lambda: settled(url), 600, "the drain")
            drained = time.time() - started
            stop.set()
            for t in threads:
                t.join()
            run_fates = ledger(url, recipients, [spool], time.time())
            proc.terminate()
            proc.wait()
        refused = sum(1 for a in answers if a != b"200")
        rows.append(["8 connections of forgeries" if flooded else "none", f"{args.flood_pending}",
                     f"{drained:.1f}", f"{args.flood_pending / drained:.0f}", str(len(answers)), str(refused)])
        fates = run_fates if flooded else fates
    return rows, fates


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
        fates = ledger(url, result["sent"], [spool], back)
        recovered = time.time() - back
        attempts = bench.psql(url, "SELECT coalesce(sum(attempts), 0) FROM outbox_messages")
        dead = bench.psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL")
        proc.terminate()
        proc.wait()
        lost, duplicates = tally(result["sent"], received(spool))
    return [[f"{args.outage}", f"{len(result['sent'])}", f"{lost}", f"{duplicates}", attempts, dead,
             f"{recovered:.1f}"]], fates


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
        fates = ledger(url, result["sent"], [spool], started + args.throttle)
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
             dead, f"{limit}", f"{lowest:.1f}", f"{wall:.0f}"]], fates


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
        sent = before + after
        fates = ledger(url, sent, [spool], back)
        recovered = time.time() - back
        proc.terminate()
        proc.wait()
        lost, duplicates = tally(sent, received(spool))
    return [[f"{args.db_outage}", f"{len(sent)}", f"{lost}", f"{duplicates}", f"{recovered:.1f}"]], fates


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
    return [[f"{args.pending}", f"{rss:.1f}", f"{wall:.0f}"]], None


def scenario_longtx(args):
    """The benchmark's long-transaction scenario: every message committed was sent, and
    what a transaction held open does to claims and latency."""
    args.rate, args.longtx_window = 200, 60 if not args.small else 10
    _, header, rows = bench.measure_longtx(args)
    return [header] + rows, None


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
        fates = ledger(url, result["sent"], [spool, fallback_spool], back)
        proc.terminate()
        proc.wait()
        through_fallback = received(fallback_spool)
        lost, duplicates = tally(result["sent"], received(spool) + through_fallback)
        failover = first_arrival_after(fallback_spool, down)
        returned = first_arrival_after(spool, back)
    seconds = lambda s: "none" if s is None else f"{s:.1f}"
    return [[f"{args.outage}", f"{len(result['sent'])}", f"{lost}", f"{duplicates}",
             f"{sum(through_fallback.values())}", seconds(failover), seconds(returned)]], fates


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
    "refuse": ("Every command answered `421 4.7.0 Try again later, closing connection.` (Gmail's) for a while, "
               "50 messages a second committed",
               ["refusing s", "messages", "refusals answered", "attempts counted", "dead letters",
                "drained s after it took mail again"], scenario_refuse),
    "reset": ("One message in twenty taken by the relay, then the connection reset before its reply, "
              "50 messages a second committed",
              ["messages", "resets", "messages sent twice or more", "attempts counted", "dead letters"],
              scenario_reset),
    "pooler": ("Through PgBouncer in transaction mode, every backend killed every 5 s, "
               "50 messages a second committed",
               ["backend kills", "backends killed", "messages", "attempts counted", "dead letters"],
               scenario_pooler),
    "webhooks": ("A drain while the Standard Webhooks endpoint is flooded with forgeries (8 connections, "
                 "512 KiB bodies)",
                 ["flood", "pending", "drained in s", "msg/s", "webhook requests answered", "refused"],
                 scenario_webhooks),
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
    bench.add_binary_arguments(parser)
    args = parser.parse_args()
    args.kill_messages, args.kills = (2000, 3) if args.small else (20_000, 20)
    args.rounds = 2 if args.small else 20
    args.outage = 5 if args.small else 30
    args.db_outage = 5 if args.small else 60
    args.pending = 20_000 if args.small else 500_000
    args.longtx = 30 if args.small else 600
    args.throttle = 10 if args.small else 60
    args.refuse = 10 if args.small else 60
    args.reset = 10 if args.small else 60
    args.backend_kills = 2 if args.small else 12
    args.flood_pending = 2000 if args.small else 10_000
    bench.use_binary(args)
    sections = {}
    for name in args.scenarios:
        title, header, scenario = SCENARIOS[name]
        log(f"== {name}")
        rows, fates = scenario(args)
        if header is None:
            header, rows = rows[0], rows[1:]
        sections[name] = "\n".join([
            f"<!-- scenario: {name} -->",
            f"### `{name}`: {title}\n",
            f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n",
            *([f"<!-- ledger: {json.dumps(fates)} -->"] if fates else []),
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows),
            "",
        ])
        print(sections[name], flush=True)
        if fates:
            print("| " + " | ".join(ledger_row(name, fates)) + " |", flush=True)
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
    ledgers = []
    for name in SCENARIOS:
        if "<!-- ledger: " in kept.get(name, ""):
            fates = json.loads(kept[name].split("<!-- ledger: ", 1)[1].split(" -->", 1)[0])
            ledgers.append(ledger_row(name, fates))
    table = "\n".join(["| " + " | ".join(LEDGER_HEADER) + " |", "|" + "---|" * len(LEDGER_HEADER),
                       *("| " + " | ".join(row) + " |" for row in ledgers), "", ""])
    with open(path, "w") as f:
        f.write(HEADER + table + "\n".join(kept[name] for name in SCENARIOS if name in kept))
    log(f"wrote {', '.join(sections)} in RELIABILITY.md")


HEADER = """# Reliability

What outboxd does under faults, measured by `python3 bench/reliability.py` with the release
binary, PostgreSQL and a real SMTP server (aiosmtpd) that misbehaves on cue, on this
project's 2-core machine. The script writes this file; nothing below is typed in. The same
faults, smaller, are tests in `tests/it/` (`reliability.rs`, `failures.rs`, `replicas.rs`).

Delivery is at least once: a send whose outcome was not written (its process died, or the
relay's reply never came) goes out again, with the same `Message-ID`.

## The ledger

Every scenario counts its messages the same way, by message id: each message a producer's
commit created against the copies the relay(s) took (their `X-Outbox-Id`) and its row at the
end. *Sent once* and *sent twice or more* were taken by a relay; *lost* were recorded sent
(or have no row) but no relay took them; *dead-lettered* and *pending at the end* are their
rows' states once the scenario had waited (up to ten minutes) for the outbox to settle; the
drain is timed from the end of the fault to the last message settled.

"""


if __name__ == "__main__":
    main()
