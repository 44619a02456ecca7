#!/usr/bin/env python3
"""outboxd's benchmark: runs the real binary against the local PostgreSQL and Postfix's
smtp-sink on loopback, and prints a table per scenario.

    python3 bench/run.py                       # every scenario, full size
    python3 bench/run.py drain latency         # some of them
    python3 bench/run.py drain --repeat 5      # the drain five times (median reported; default 3)
    python3 bench/run.py --messages 2000 --big-rows 20000 --duration 5 --idle 5   # tiny, quick

Scenarios: drain, defaults, latency, longtx, idle, bigtable, replicas, pooled, relay, lanes,
dbcost, statements, baseline.
Needs:
cargo, psql, PostgreSQL on 127.0.0.1:5432 (trust), smtp-sink and smtp-source (Debian's
`postfix`), pgbouncer (Debian's, for `pooled`), Node.js with `npm ci --prefix bench`
(graphile-worker, which `dbcost` measures beside outboxd), and psycopg
(`pip install psycopg[binary]`). Every scenario uses a database of its own and drops it
afterwards. Nothing here asserts a time: it measures and prints.
"""

import argparse
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "outboxd")
ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CLK_TCK = os.sysconf("SC_CLK_TCK")
KINDS_SQL = """
    CASE g % 3
      WHEN 0 THEN 'account_verification'
      WHEN 1 THEN 'workspace_invite'
      ELSE 'invoice_notice' END,
    CASE g % 3
      WHEN 0 THEN jsonb_build_object('to', 'user' || g || '@example.com', 'name', 'User ' || g,
                                     'verify_url', 'https://app.example/verify?t=' || md5(g::text))
      WHEN 1 THEN jsonb_build_object('to', 'user' || g || '@example.com', 'inviter_name', 'Ada',
                                     'workspace_name', 'Engines', 'accept_url', 'https://app.example/i/' || g)
      ELSE jsonb_build_object('to', 'billing' || g || '@example.com', 'customer_name', 'Customer ' || g,
                              'invoice_number', 'INV-' || g, 'amount', '120.00', 'currency', 'EUR',
                              'due_date', '2026-12-31', 'invoice_url', 'https://app.example/inv/' || g)
    END
"""


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def db_url(name):
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def psql(url, sql, *flags):
    out = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", *flags, url, "-c", sql],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


@contextmanager
def database(name):
    psql(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    url = db_url(name)
    subprocess.run([BIN, "migrate", "--create-database", "--database-url", url], check=True, capture_output=True)
    try:
        yield url
    finally:
        psql(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# BENCH_TAGS=1: every message carries two tags (a campaign, one of 100 tenants), to measure
# what tags cost the drain (their index is written at the insert, before the drain).
TAGS_SQL = ", ARRAY['campaign:bench', 'tenant:' || (g % 100)]" if os.environ.get("BENCH_TAGS") else ""


def insert_pending(url, count, start=1):
    # Triggers off for the bulk load: outboxd is not running yet, nothing needs waking.
    tags_column = ", tags" if TAGS_SQL else ""
    psql(url, f"""
        SET session_replication_role = replica;
        INSERT INTO outbox_messages (kind, payload, next_attempt_at{tags_column})
        SELECT {KINDS_SQL}, now(){TAGS_SQL} FROM generate_series({start}, {start + count - 1}) g;
        ANALYZE outbox_messages;""")


@contextmanager
def smtp_sink(dump=None):
    port = free_port()
    cmd = ["smtp-sink"]
    if os.geteuid() == 0:
        cmd += ["-u", "postfix"]
    if dump:
        cmd += ["-D", dump]
    cmd += [f"127.0.0.1:{port}", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    if proc.poll() is not None:
        raise SystemExit(f"smtp-sink did not start: {proc.stderr.read().decode()}")
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait()


class Outboxd:
    """The release binary, with /proc readings of its CPU and memory."""

    def __init__(self, url, smtp_port, *flags, env=None):
        self.http = free_port()
        args = [BIN, "run", "--database-url", url, "--listen", f"127.0.0.1:{self.http}",
                "--from", "Bench <bench@example.com>", *flags]
        if smtp_port:
            args += ["--smtp-url", f"smtp://127.0.0.1:{smtp_port}"]
        environment = dict(os.environ, RUST_LOG=os.environ.get("BENCH_RUST_LOG", "warn"))
        environment.update(env or {})
        self.proc = subprocess.Popen(args, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return stat_cpu_seconds(f.read())

    def peak_rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        terminate(self.proc)


def terminate(proc):
    """SIGTERM, and SIGKILL if it has not exited within a minute."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def stat_cpu_seconds(stat):
    """CPU seconds (user and system) in the text of a /proc/<pid>/stat file."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_cpu_seconds(pid):
    """CPU seconds a process has used so far, or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return stat_cpu_seconds(f.read())
    except OSError:
        return 0.0


def cpu_by_program(names):
    """CPU seconds used so far by every process whose command is one of `names`."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if any(comm.startswith(n) for n in names):
            total += stat_cpu_seconds(stat)
    return total


def wait_drained(url, total, timeout=1800, give_up=False):
    """Until no row is pending; after `timeout` seconds, exits, or returns if `give_up`.
    Returns the CPU seconds the PostgreSQL backend answering this wait used, which is the
    benchmark's, not outboxd's: its EXISTS walks the due index from the start, over the
    entries sent rows leave until vacuum, so it costs more as the drain goes on."""
    # One connection and an EXISTS on the pending index's first entry: a psql process and a
    # count(*) every 100 ms would cost PostgreSQL more CPU than some of what is measured.
    import psycopg
    deadline = time.time() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        began = process_cpu_seconds(backend)
        while time.time() < deadline:
            pending = conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_messages "
                                   "WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL)").fetchone()[0]
            if not pending:
                return process_cpu_seconds(backend) - began
            time.sleep(0.1)
    if give_up:
        return process_cpu_seconds(backend) - began
    raise SystemExit(f"not drained within {timeout}s")


def drain_rate(url, after_id=0):
    """Messages per second between the first and the last recorded send (of rows after `after_id`)."""
    count, seconds = psql(url, "SELECT count(*), extract(epoch FROM max(dispatched_at) - min(dispatched_at)) "
                               f"FROM outbox_messages WHERE dispatched_at IS NOT NULL AND id > {after_id}").split("|")
    return int(count) / max(float(seconds), 1e-6)


def run_drain(url, messages, flags, replicas=1, dump=None, env=None, via=None):
    """`via`: the URL outboxd connects to, when not `url` (a pooler in front of it)."""
    insert_pending(url, messages)
    with smtp_sink(dump) as port:
        started = time.time()
        procs = [Outboxd(via or url, port, *flags, "--worker-id", f"bench-{i}", env=env) for i in range(replicas)]
        programs = ["postgres", "smtp-sink", "pgbouncer"]
        before = {name: cpu_by_program([name]) for name in programs}
        polled = wait_drained(url, messages)
        wall = time.time() - started
        # PostgreSQL's backends for outboxd live for the whole run, so none is missed; the
        # backend answering the benchmark's own wait is not outboxd's cost.
        spent = {name: cpu_by_program([name]) - before[name] for name in programs}
        spent["postgres"] -= polled
        others = {"postgres": spent["postgres"], "sink": spent["smtp-sink"], "pgbouncer": spent["pgbouncer"]}
        cpu = sum(p.cpu_seconds() for p in procs)
        rss = max(p.peak_rss_mib() for p in procs)
        for p in procs:
            p.stop()
    dead = int(psql(url, "SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL"))
    return {"messages": messages, "rate": drain_rate(url), "wall": wall, "cpu": cpu, "rss": rss, "dead": dead,
            "others": others}


def smtp_ceiling(messages, sessions, body_bytes=2000):
    with smtp_sink() as port:
        started = time.time()
        subprocess.run(["smtp-source", "-d", "-s", str(sessions), "-m", str(messages), "-l", str(body_bytes),
                        "-f", "bench@example.com", "-t", "user@example.com", f"127.0.0.1:{port}"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return messages / (time.time() - started)


# smtp-source's own headers (From, To, Date, Message-Id), which it sends besides `-l` bytes.
SMTP_SOURCE_HEADER_BYTES = 120


def message_size(sample=300):
    """Mean size on the wire of the messages outboxd sends for this benchmark's mix of kinds,
    read back from a sink that writes them down, so that smtp-source can send the same size."""
    with tempfile.TemporaryDirectory() as tmp, database("outboxd_bench_size") as url:
        os.chmod(tmp, 0o777)  # smtp-sink writes as `postfix` when run as root
        dump = os.path.join(tmp, "sink.mbox")
        run_drain(url, sample, TUNED, dump=dump)
        sizes, in_headers_of_sink = [], False
        with open(dump, "rb") as f:
            for line in f:
                if line.startswith(b"X-Client-Addr:"):
                    sizes.append(0)
                    in_headers_of_sink = True
                    continue
                # The sink's own X-... lines and its folded Received: header come first.
                if in_headers_of_sink and (line.startswith((b"X-", b"Received:", b"\t"))):
                    continue
                in_headers_of_sink = False
                sizes[-1] += len(line.rstrip(b"\r\n")) + 2  # CRLF on the wire
    return round(sum(sizes) / len(sizes))


def add_binary_arguments(parser):
    """`--binary` and `--no-build`, which every benchmark script takes."""
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--binary", help="an outboxd binary to run instead of target/release/outboxd")


def use_binary(args):
    """Runs `--binary` if given, else the release binary, built unless `--no-build`."""
    global BIN
    if args.binary:
        BIN = args.binary
    elif not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=ROOT, check=True)


def table(title, header, rows):
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    sys.stdout.flush()


# OUTBOXD_LINGER's default, marked in the latency table.
DEFAULT_LINGER = "50ms"
TUNED = os.environ.get("BENCH_FLAGS", "--batch-size 400 --smtp-concurrency 16").split()


def scenario_drain(args):
    # The machine is shared: each run measures outboxd and the raw ceiling back to back, and
    # the table shows every run and the one with the median ratio.
    sessions = int(TUNED[TUNED.index("--smtp-concurrency") + 1]) if "--smtp-concurrency" in TUNED else 4
    # The ceiling sends messages of the size outboxd's are (and, for reference, 2 000 bytes).
    size = message_size()
    runs = []
    for _ in range(args.repeat):
        with database("outboxd_bench_drain") as url:
            r = run_drain(url, args.messages, TUNED)
        r["ceiling"] = smtp_ceiling(args.messages, sessions, max(size - SMTP_SOURCE_HEADER_BYTES, 1))
        r["ceiling_2k"] = smtp_ceiling(args.messages, sessions)
        runs.append(r)
    runs.sort(key=lambda r: r["rate"] / r["ceiling"])
    median = runs[len(runs) // 2]

    def row(label, r):
        busy = (r["cpu"] + r["others"]["postgres"] + r["others"]["sink"]) / (r["wall"] * os.cpu_count())
        return [label, f"{r['rate']:.0f}", f"{r['ceiling']:.0f}", f"{r['rate'] / r['ceiling']:.2f}",
                f"{r['ceiling_2k']:.0f}", f"{r['wall']:.1f}",
                f"{r['cpu']:.1f}", f"{1000 * r['cpu'] / r['messages']:.3f}", f"{r['others']['postgres']:.1f}",
                f"{r['others']['sink']:.1f}", f"{100 * busy:.0f}%", f"{r['rss']:.1f}", r["dead"]]

    table(f"Drain: {args.messages} pending messages, {' '.join(TUNED)}, {len(runs)} runs; "
          f"outboxd's messages are {size} bytes on average",
          ["run", "outboxd msg/s", f"smtp-source msg/s, {size} B (same sink)", "ratio",
           "smtp-source msg/s, 2 000 B body", "wall s", "outboxd CPU s", "CPU ms/msg",
           "PostgreSQL CPU s", "smtp-sink CPU s", "machine busy", "peak RSS MiB", "dead letters"],
          [row(f"{i + 1}", r) for i, r in enumerate(runs)] + ([row("**median**", median)] if len(runs) > 1 else []))
    # What the three processes' CPU time per message allows on this machine's cores, even if
    # every core were busy all the time: the bound the drain cannot pass.
    per_msg = {name: 1000 * cpu / median["messages"] for name, cpu in
               [("outboxd", median["cpu"]), ("PostgreSQL", median["others"]["postgres"]),
                ("smtp-sink", median["others"]["sink"])]}
    total = sum(per_msg.values())
    bound = os.cpu_count() * 1000 / total
    table(f"Drain: CPU budget of the median run on {os.cpu_count()} cores",
          ["outboxd ms/msg", "PostgreSQL ms/msg", "smtp-sink ms/msg", "all three ms/msg",
           "msg/s with every core busy", "80% of smtp-source", "drain vs. CPU bound"],
          [[f"{per_msg['outboxd']:.3f}", f"{per_msg['PostgreSQL']:.3f}", f"{per_msg['smtp-sink']:.3f}", f"{total:.3f}",
            f"{bound:.0f}", f"{0.8 * median['ceiling']:.0f}", f"{median['rate'] / bound:.2f}"]])
    return median


def scenario_defaults(args, drain_result):
    """The drain with no flags at all, and outboxd's default log level (info): what a new
    user gets, against the tuned drain."""
    runs = []
    for _ in range(args.repeat):
        with database("outboxd_bench_defaults") as url:
            runs.append(run_drain(url, args.messages, [], env={"RUST_LOG": "info"}))
    runs.sort(key=lambda r: r["rate"])
    median = runs[len(runs) // 2]
    tuned = drain_result["rate"] if drain_result else None
    table(f"Defaults: {args.messages} pending messages, no flags (batch 25 growing to 400, 8 connections), "
          f"RUST_LOG=info, {len(runs)} runs",
          ["run", "msg/s", "outboxd CPU ms/msg", "tuned drain msg/s (median)", "defaults / tuned"],
          [[f"{i + 1}", f"{r['rate']:.0f}", f"{1000 * r['cpu'] / r['messages']:.3f}",
            f"{tuned:.0f}" if tuned else "not run", f"{r['rate'] / tuned:.2f}" if tuned else ""]
           for i, r in enumerate(runs)])


def drain_cpu_per_message(messages):
    """outboxd's CPU ms per message in a drain, for a ratio measured in the same minutes."""
    with database("outboxd_bench_latency_drain") as url:
        r = run_drain(url, messages, TUNED)
    return 1000 * r["cpu"] / r["messages"]


def scenario_latency(args):
    # This machine is shared and its speed drifts by a third within minutes, and a drain
    # (both cores busy) drifts more than a light steady load: a drain runs before the first
    # steady load and after each, and each row's yardstick is the pair around it. Each
    # linger is a row: it trades latency for the batch size that shares a cycle's round
    # trips.
    drain_size = min(args.messages, 30_000)
    drains = [drain_cpu_per_message(drain_size)]
    rows = []
    for linger in args.lingers.split(","):
        rows.append((linger, measure_latency(args, "--linger", linger)))
        drains.append(drain_cpu_per_message(drain_size))
    # On loopback the sink and PostgreSQL run on outboxd's two cores, and each one woken by
    # outboxd's write preempts it; relays and databases on machines of their own would not.
    # One more run at the default linger with them as SCHED_BATCH (no wake-up preemption)
    # shows that share; it needs the right to reschedule them, and is left out without it.
    apart = measure_latency(args, "--linger", DEFAULT_LINGER, peers_batch=True)
    if apart:
        rows.append((f"{DEFAULT_LINGER}, the sink and this database's PostgreSQL backends SCHED_BATCH", apart))
        drains.append(drain_cpu_per_message(drain_size))
    n = rows[0][1]["n"]
    table(f"Latency: {n} messages committed one per transaction at {args.rate}/s for {args.duration} s, "
          f"poll interval 15 s, {' '.join(TUNED)}; drains of {drain_size}, CPU ms/msg, before the first "
          f"row and after each: {', '.join(f'{d:.3f}' for d in drains)}",
          ["linger", "p50 ms", "p99 ms", "max ms", "achieved rate /s", "messages per outcome write",
           "outboxd CPU ms/msg", "drains around it, mean", "steady / drain"],
          [[linger + (" (default)" if linger == DEFAULT_LINGER else ""),
            f"{r['p50']:.1f}", f"{r['p99']:.1f}", f"{r['max']:.1f}", f"{r['n'] / args.duration:.0f}",
            f"{r['per_write']:.1f}", f"{r['cpu_ms']:.3f}", f"{(drains[i] + drains[i + 1]) / 2:.3f}",
            f"{2 * r['cpu_ms'] / (drains[i] + drains[i + 1]):.2f}"]
           for i, (linger, r) in enumerate(rows)])
    print_cycle_fit(rows[:len(args.lingers.split(","))], statistics.median(drains))


def print_cycle_fit(runs, drain):
    """Fits CPU per message = W + B / n over the rows (n: messages per cycle, one outcome
    write each): W is what a message costs however many share its cycle, B what a cycle
    costs. Twice the drain needs n >= B / (2 drain - W), and no n will do once W reaches it."""
    if len(runs) < 2:
        return
    xs = [1 / r["per_write"] for _, r in runs]
    ys = [r["cpu_ms"] for _, r in runs]
    title = "\nFit CPU ms/msg = W + B / n over the rows"
    if len(set(xs)) < 2:
        print(f"{title}: not possible, every row has the same messages per write.")
        return
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    w = my - b * mx
    if w >= 2 * drain:
        need = "more than any batch size"
    elif b <= 0:
        need = "any batch size (no cost per cycle fitted)"
    else:
        need = f"{math.ceil(b / (2 * drain - w))} messages a cycle"
    print(f"{title}: W = {w:.3f} ms ({w / drain:.2f} times the median drain's {drain:.3f}), "
          f"B = {b:.2f} ms per cycle; twice the drain needs {need}.")
    sys.stdout.flush()


def peers_of(conn, sink_port):
    """This run's sink and the PostgreSQL backends of this benchmark's database."""
    sinks = [int(pid) for pid in filter(str.isdigit, os.listdir("/proc"))
             if read_text(f"/proc/{pid}/comm").strip() == "smtp-sink"
             and f"127.0.0.1:{sink_port}" in read_text(f"/proc/{pid}/cmdline").split("\0")]
    return sinks + [row[0] for row in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@contextmanager
def scheduled_as_batch(pids):
    """Runs the body with `pids` as SCHED_BATCH (their wake-ups preempt no running thread),
    then gives each its own policy back, whatever happens. Yields False, with nothing left
    changed, where the right to reschedule them is missing."""
    before = {}
    try:
        allowed = True
        for pid in pids:
            try:
                policy = os.sched_getscheduler(pid)
                os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
            except ProcessLookupError:
                continue
            except PermissionError as e:
                log(f"cannot make the peers SCHED_BATCH here ({e}); that row is left out")
                allowed = False
                break
            before[pid] = policy
        if not allowed:
            restore_policies(before)
            before = {}
        yield allowed
    finally:
        restore_policies(before)


def restore_policies(before):
    for pid, policy in before.items():
        try:
            os.sched_setscheduler(pid, policy, os.sched_param(0))
        except ProcessLookupError:
            pass
        except OSError as e:
            log(f"could not give process {pid} its scheduling policy back: {e}")


def measure_latency(args, *flags, peers_batch=False, via=None, env=None):
    """`via(database)`: the URL outboxd connects to, when not the database's own (a pooler
    in front of it); `env(url)`: outboxd's extra environment."""
    import psycopg
    with database("outboxd_bench_latency") as url, smtp_sink() as port:
        # The default 15 s poll: only NOTIFY explains a fast send.
        proc = Outboxd(via("outboxd_bench_latency") if via else url, port, *TUNED, *flags,
                       env=env(url) if env else None)
        committed = {}
        with psycopg.connect(url, autocommit=True) as conn:
            # One message first, so that outboxd's connections are open (its pool opens
            # them on first use) when the peers are picked, and none is measured.
            warm_up = conn.execute(
                "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                "'{\"to\": \"warm@example.com\", \"name\": \"W\", \"verify_url\": \"https://x/v\"}') "
                "RETURNING id").fetchone()[0]
            wait_drained(url, 1)
            with scheduled_as_batch(peers_of(conn, port) if peers_batch else []) as scheduled:
                if not scheduled:
                    proc.stop()
                    return None
                cpu_before, n = steady_load(args, proc, conn, committed)
        wait_drained(url, n)
        cpu = proc.cpu_seconds() - cpu_before
        proc.stop()
        sent = dict(tuple(line.split("|")) for line in psql(
            url, "SELECT id, extract(epoch FROM dispatched_at) FROM outbox_messages").splitlines())
        latencies = sorted(1000 * (float(sent[str(i)]) - t) for i, t in committed.items())
        # One outcome write per small batch: each stamps its rows with its own now().
        writes = int(psql(url, f"SELECT count(DISTINCT dispatched_at) FROM outbox_messages WHERE id > {warm_up}"))
    q = statistics.quantiles(latencies, n=100)
    return {"n": n, "p50": q[49], "p99": q[98], "max": latencies[-1], "cpu_ms": 1000 * cpu / n,
            "per_write": n / max(writes, 1)}


def steady_load(args, proc, conn, committed):
    """Commits one message per transaction at `args.rate` for `args.duration`, noting each
    commit's time in `committed`; returns outboxd's CPU seconds before it and the count."""
    cpu_before = proc.cpu_seconds()
    interval = 1.0 / args.rate
    start = time.time()
    n = 0
    while time.time() - start < args.duration:
        due = start + n * interval
        now = time.time()
        if due > now:
            time.sleep(due - now)
        row = conn.execute(
            "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
            "jsonb_build_object('to', 'u' || %s || '@example.com', 'name', 'U', 'verify_url', 'https://x/v')) "
            "RETURNING id", (n,)).fetchone()
        committed[row[0]] = time.time()
        n += 1
    return cpu_before, n


@contextmanager
def private_cluster(*settings):
    """A PostgreSQL cluster of our own (default settings, autovacuum on, unlike the CI
    server), on its own port and socket; `settings` are extra `-c name=value` options."""
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    if not os.path.exists(os.path.join(bindir, "initdb")):
        versions = sorted(os.listdir("/usr/lib/postgresql"))
        bindir = f"/usr/lib/postgresql/{versions[-1]}/bin"
    home = tempfile.mkdtemp(prefix="outboxd-cluster-")
    os.chmod(home, 0o777)
    data, port = os.path.join(home, "data"), free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*as_postgres, f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust"],
                   check=True, capture_output=True)
    options = " ".join([f"-p {port} -k {home} -c listen_addresses=127.0.0.1", *(f"-c {s}" for s in settings)])

    def start():
        subprocess.run([*as_postgres, f"{bindir}/pg_ctl", "-D", data, "-o", options, "-l",
                        os.path.join(home, "log"), "-w", "start"], check=True, capture_output=True)

    def stop():
        subprocess.run([*as_postgres, f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
                       check=True, capture_output=True)

    start()
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/outboxd", start, stop
    finally:
        subprocess.run([*as_postgres, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


CLAIM_STATS = """
    SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8,
           coalesce(max(max_exec_time), 0)::float8,
           coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
    FROM pg_stat_statements WHERE query LIKE %s"""


def statement_stats(conn, pattern):
    """(calls, total ms, max ms, buffers) of the statements like `pattern` since the last reset."""
    return conn.execute(CLAIM_STATS, (pattern,)).fetchone()


def scenario_longtx(args):
    table(*measure_longtx(args))


def measure_longtx(args):
    """A REPEATABLE READ transaction, with its snapshot taken, is held open while messages
    are committed one per transaction at --rate/s, on a private cluster with default
    settings (autovacuum on). Minute 0 runs before the transaction opens. Per minute: the
    claim's cost from pg_stat_statements (reset each minute), insert-to-send latency, the
    dead tuples vacuum could not remove, and the sampler's cost."""
    import psycopg
    window = args.longtx_window
    with private_cluster("shared_preload_libraries=pg_stat_statements") as (url, _, _), smtp_sink() as port:
        subprocess.run([BIN, "migrate", "--create-database", "--database-url", url], check=True, capture_output=True)
        psql(url, "CREATE EXTENSION pg_stat_statements")
        # No linger: the latency columns show what the open transaction adds, not the wait
        # that trades latency for CPU (BENCHMARKS.md, Steady traffic).
        proc = Outboxd(url, port, *TUNED, "--linger", "0s")
        committed, rows, n = [], [], 0
        with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url, autocommit=True) as stats, \
                psycopg.connect(url) as holder:
            stats.execute("SELECT pg_stat_statements_reset()")
            start = time.time()
            windows = 1 + args.longtx // window
            for w in range(windows):
                if w == 1:
                    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    holder.execute("SELECT count(*) FROM outbox_messages")  # takes the snapshot
                window_end = start + (w + 1) * window
                while time.time() < window_end:
                    due = start + n / args.rate
                    if due > time.time():
                        time.sleep(due - time.time())
                    row = conn.execute(
                        "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                        "jsonb_build_object('to', 'u' || %s || '@example.com', 'name', 'U', 'verify_url', 'https://x/v')) "
                        "RETURNING id", (n,)).fetchone()
                    committed.append((row[0], time.time(), w))
                    n += 1
                claims = statement_stats(stats, "%regular_head%")
                sampler = statement_stats(stats, "%AS oldest_ready_age%")
                dead = stats.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                                     "WHERE relname = 'outbox_messages'").fetchone()[0]
                stats.execute("SELECT pg_stat_statements_reset()")
                rows.append({"window": w, "claims": claims, "sampler": sampler, "dead": dead})
            holder.rollback()
        wait_drained(url, n)
        proc.stop()
        sent = dict(tuple(line.split("|")) for line in psql(
            url, "SELECT id, extract(epoch FROM dispatched_at) FROM outbox_messages").splitlines())
    by_window = {}
    for message_id, at, w in committed:
        by_window.setdefault(w, []).append(1000 * (float(sent[str(message_id)]) - at))
    table_rows = []
    for r in rows:
        calls, total, peak, buffers = r["claims"]
        s_calls, s_total, _, _ = r["sampler"]
        q = statistics.quantiles(sorted(by_window[r["window"]]), n=100)
        table_rows.append([
            "none" if r["window"] == 0 else f"{r['window'] * window / 60:g}",
            f"{calls}", f"{total / max(calls, 1):.3f}", f"{peak:.1f}", f"{buffers / max(calls, 1):.0f}",
            f"{q[49]:.1f}", f"{q[98]:.1f}", f"{r['dead']}", f"{s_total / max(s_calls, 1):.1f}"])
    return (f"Long transaction: {n} messages at {args.rate}/s, a REPEATABLE READ transaction open for "
            f"{args.longtx} s after the first {window} s; private cluster, default settings (autovacuum on)",
            ["minutes open", "claims", "claim mean ms", "claim max ms", "buffers/claim", "p50 ms", "p99 ms",
             "dead tuples", "sampler ms"], table_rows)


def server_log():
    """PostgreSQL's log file, where `log_statement` writes (Debian's clusters log there)."""
    path = psql(ADMIN_URL, "SELECT coalesce(pg_current_logfile(), '')")
    if path and not path.startswith("/"):
        path = os.path.join(psql(ADMIN_URL, "SHOW data_directory"), path)
    if not path:
        import glob
        logs = sorted(glob.glob("/var/log/postgresql/postgresql-*.log"), key=os.path.getmtime)
        path = logs[-1] if logs else ""
    return path if path and os.access(path, os.R_OK) else None


def scenario_idle(args):
    name = "outboxd_bench_idle"
    with database(name) as url:
        # Every statement outboxd sends to this database, from the server's own log.
        psql(ADMIN_URL, f"ALTER DATABASE {name} SET log_statement = 'all'")
        log_path = server_log()
        proc = Outboxd(url, None)
        time.sleep(2)
        offset = os.path.getsize(log_path) if log_path else 0
        cpu_before = proc.cpu_seconds()
        time.sleep(args.idle)
        cpu_after = proc.cpu_seconds()
        statements = []
        if log_path:
            with open(log_path, errors="replace") as f:
                f.seek(offset)
                statements = [line for line in f if f"@{name} " in line and ("statement: " in line or "execute " in line)]
        proc.stop()
    kinds = {}
    for line in statements:
        text = line.split("statement: ", 1)[-1] if "statement: " in line else line.split(": ", 2)[-1]
        key = " ".join(text.split()[:4])[:60]
        kinds[key] = kinds.get(key, 0) + 1
    per_poll = len(statements) * 15 / args.idle
    table(f"Idle: empty outbox for {args.idle} s, defaults (poll 15 s, sample 15 s)",
          ["statements sent", "per 15 s poll interval", "CPU s", "CPU %", "what they were"],
          [[len(statements) if log_path else "no server log", f"{per_poll:.1f}", f"{cpu_after - cpu_before:.2f}",
            f"{100 * (cpu_after - cpu_before) / args.idle:.2f}",
            "; ".join(f"{n}× {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))]])


def sampler_sql():
    """The sample's statements exactly as outboxd sends them, read from src/store/sql/:
    the totals, and the walk of the pending rows per kind (which gives the oldest pending
    age since migration 22)."""
    return [statement(name) for name in ("sample_totals", "sample_kinds")]


def claim_sql():
    """The claim exactly as outboxd sends it, read from src/store/sql/claim.sql, prepared
    with its parameters, explained on 200 rows and rolled back."""
    return ("SET plan_cache_mode = force_generic_plan;\n"
            "PREPARE claim(int8, float8, text, timestamptz, uuid, int8, timestamptz, text[], timestamptz, text[], int8) AS "
            + statement("claim") + ";\n"
            "BEGIN; EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "
            "EXECUTE claim(200, 60, 'bench', NULL, gen_random_uuid(), 4194304, NULL, '{}', NULL, "
            "'{transactional,bulk}', NULL); ROLLBACK;\n")


def sql_blocks():
    """Every block of src/store/sql/*.sql by kind and name: its text after the header, as
    `store::statement` reads them."""
    blocks = {"name": {}, "fragment": {}}
    folder = os.path.join(ROOT, "src", "store", "sql")
    for file in sorted(os.listdir(folder)):
        text = open(os.path.join(folder, file)).read()
        for kind, name, body in re.findall(r"^-- (name|fragment): (\w+)\n(.*?)(?=^-- (?:name|fragment): |\Z)",
                                           text, re.S | re.M):
            lines = body.split("\n")
            while lines and (lines[0].startswith("--") or not lines[0].strip()):
                lines.pop(0)
            blocks[kind][name] = "\n".join(lines).rstrip()
    return blocks


def statement(name):
    """The statement `name` as outboxd renders it without a schema: `{{schema}}` dropped, each
    `{{fragment}}` or `{{fragment(argument)}}` included (outboxd_producer::template)."""
    blocks = sql_blocks()

    def render(text):
        def include(m):
            marker = m.group(1).strip()
            if marker == "schema":
                return ""
            fragment, _, argument = marker.partition("(")
            body = blocks["fragment"][fragment.strip()]
            if argument:
                body = body.replace("{{argument}}", argument[:-1])
            return render(body)
        return re.sub(r"\{\{(.*?)\}\}", include, text)

    return render(blocks["name"][name])


def timed(url, sql, runs=5):
    out = subprocess.run(["psql", "-X", "-q", url], input="\\timing on\n" + (sql + ";\n") * runs,
                         capture_output=True, text=True, check=True).stdout
    times = [float(t) for t in re.findall(r"Time: ([0-9.]+) ms", out)]
    return statistics.median(times)


def scenario_bigtable(args, drain_result):
    with database("outboxd_bench_big") as url:
        log(f"loading {args.big_rows} dispatched rows...")
        psql(url, f"""
            SET session_replication_role = replica;
            INSERT INTO outbox_messages (kind, payload, created_at, not_before, next_attempt_at, dispatched_at)
            SELECT {KINDS_SQL}, now() - interval '30 days' + g * interval '200 ms',
                   now() - interval '30 days' + g * interval '200 ms', now() - interval '30 days' + g * interval '200 ms',
                   now() - interval '30 days' + g * interval '200 ms' + interval '1 s'
            FROM generate_series(1, {args.big_rows}) g;""")
        insert_pending(url, args.messages, start=args.big_rows + 1)
        # One pending message in a hundred has a priority: the claim reads both tiers.
        psql(url, f"UPDATE outbox_messages SET priority = 5 WHERE id > {args.big_rows} AND id % 100 = 0")
        psql(url, "VACUUM ANALYZE outbox_messages")
        size = psql(url, "SELECT pg_size_pretty(pg_total_relation_size('outbox_messages'))")
        totals_sql, kinds_sql = sampler_sql()
        sampler_ms, kinds_ms = timed(url, totals_sql), timed(url, kinds_sql)
        plan = subprocess.run(["psql", "-X", "-q", url], input=claim_sql(), capture_output=True, text=True,
                              check=True).stdout
        claim_ms = float(re.search(r"Execution Time: ([0-9.]+) ms", plan).group(1))
        uses_index = "outbox_messages_due_idx" in plan and "outbox_messages_priority_due_idx" in plan \
            and "Seq Scan on outbox_messages" not in plan
        print("\n<details><summary>claim plan</summary>\n\n```\n" + plan.strip() + "\n```\n</details>")
        sampler_plan = "\n".join(psql(url, "EXPLAIN (ANALYZE, COSTS OFF) " + sql) for sql in sampler_sql())
        print("\n<details><summary>sampler plan</summary>\n\n```\n" + sampler_plan.strip() + "\n```\n</details>")
        with smtp_sink() as port:
            proc = Outboxd(url, port, *TUNED)
            wait_drained(url, args.messages)
            proc.stop()
        rate = drain_rate(url, after_id=args.big_rows)
    compare = f"{rate / drain_result['rate']:.2f}" if drain_result else "n/a"
    table(f"Big table: {args.big_rows} dispatched rows + {args.messages} pending ({size})",
          ["sampler query ms (median of 5)", "per-kind walk ms", "claim of 200 ms", "claim uses the due and priority indexes only", "drain msg/s", "vs. empty table"],
          [[f"{sampler_ms:.1f}", f"{kinds_ms:.1f}", f"{claim_ms:.1f}", uses_index, f"{rate:.0f}", compare]])


def with_concurrency(flags, concurrency):
    flags = list(flags)
    if "--smtp-concurrency" in flags:
        flags[flags.index("--smtp-concurrency") + 1] = str(concurrency)
    else:
        flags += ["--smtp-concurrency", str(concurrency)]
    return flags


def scenario_replicas(args):
    # The replicas share the tuned run's SMTP connections, as they would share a relay's
    # limit on connections per client: the sink, not outboxd, is what this scenario loads.
    total = int(TUNED[TUNED.index("--smtp-concurrency") + 1]) if "--smtp-concurrency" in TUNED else 4
    rows = []
    for replicas in (1, 2, 4):
        flags = with_concurrency(TUNED, max(1, total // replicas))
        with tempfile.TemporaryDirectory() as tmp, database(f"outboxd_bench_replicas_{replicas}") as url:
            os.chmod(tmp, 0o777)  # smtp-sink writes as `postfix` when run as root
            dump = os.path.join(tmp, "sink.mbox")
            r = run_drain(url, args.messages, flags, replicas=replicas, dump=dump)
            ids = {}
            with open(dump, "rb") as f:
                for line in f:
                    if line.startswith(b"X-Outbox-Id:"):
                        key = line.split(b":", 1)[1].strip()
                        ids[key] = ids.get(key, 0) + 1
            duplicates = sum(n - 1 for n in ids.values() if n > 1)
            busy = (r["cpu"] + r["others"]["postgres"] + r["others"]["sink"]) / (r["wall"] * os.cpu_count())
            rows.append([replicas, max(1, total // replicas), f"{r['rate']:.0f}", f"{r['cpu']:.1f}",
                         f"{r['others']['postgres']:.1f}",
                         f"{r['others']['sink']:.1f}", f"{100 * busy:.0f}%", len(ids), duplicates])
    table(f"Replicas: {args.messages} messages, {' '.join(TUNED)} shared: {total} SMTP connections in all, "
          f"sink writing every message to disk",
          ["replicas", "connections each", "msg/s", "outboxd CPU s (all)", "PostgreSQL CPU s", "smtp-sink CPU s", "machine busy",
           "distinct X-Outbox-Id at the sink", "duplicates"], rows)


@contextmanager
def pgbouncer(mode="transaction", pool_size=20):
    """Debian's PgBouncer on a port of its own in front of the local PostgreSQL; yields the
    URL of `database` through it."""
    home = tempfile.mkdtemp(prefix="outboxd-pgbouncer-")
    os.chmod(home, 0o777)
    port = free_port()
    with open(os.path.join(home, "users.txt"), "w") as f:
        f.write('"postgres" ""\n')
    ini = os.path.join(home, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(f"[databases]\n* = host=127.0.0.1 port=5432\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
                f"listen_port = {port}\nauth_type = trust\nauth_file = {home}/users.txt\n"
                f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 200\n"
                f"unix_socket_dir =\nlogfile = {home}/pgbouncer.log\n")
    as_postgres = ["-u", "postgres"] if os.geteuid() == 0 else []
    proc = subprocess.Popen(["pgbouncer", *as_postgres, ini], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if proc.poll() is not None:
            raise SystemExit(f"pgbouncer did not start: {read_text(os.path.join(home, 'pgbouncer.log'))}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield lambda database: f"postgres://postgres@127.0.0.1:{port}/{database}"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def scenario_pooled(args):
    """The tuned drain with statements kept prepared (directly connected, the default),
    unnamed and each in a transaction of its own (what outboxd does past a transaction
    pooler; here forced on a direct connection by OUTBOXD_LISTEN_DATABASE_URL), and through
    PgBouncer in transaction mode itself. Runs alternate, so that the machine's noise falls
    on each set-up alike."""
    setups = ["prepared, direct", "unnamed, direct", "unnamed, PgBouncer (transaction)"]
    runs = {s: [] for s in setups}
    with pgbouncer() as through:
        for _ in range(args.repeat):
            for setup in setups:
                with database("outboxd_bench_pooled") as url:
                    env = None if setup == setups[0] else {"OUTBOXD_LISTEN_DATABASE_URL": url}
                    via = through("outboxd_bench_pooled") if "PgBouncer" in setup else None
                    runs[setup].append(run_drain(url, args.pooled_messages, TUNED, env=env, via=via))
    base = statistics.median(r["rate"] for r in runs[setups[0]])

    def per_msg(r, cpu):
        return f"{1000 * cpu / r['messages']:.3f}"

    rows = []
    for setup in setups:
        median = sorted(runs[setup], key=lambda r: r["rate"])[len(runs[setup]) // 2]
        rows.append([setup, f"{median['rate']:.0f}", f"{median['rate'] / base:.2f}",
                     per_msg(median, median["cpu"]), per_msg(median, median["others"]["postgres"]),
                     per_msg(median, median["others"]["pgbouncer"]),
                     ", ".join(f"{r['rate']:.0f}" for r in runs[setup])])
    table(f"Pooled: {args.pooled_messages} pending messages, {' '.join(TUNED)}, {args.repeat} runs each, alternated "
          "(medians)",
          ["statements", "msg/s", "vs. prepared", "outboxd CPU ms/msg", "PostgreSQL CPU ms/msg",
           "PgBouncer CPU ms/msg", "each run msg/s"], rows)
    # Commit to send in steady traffic through each pooler set-up of the book's Deployment
    # page: a direct LISTEN connection, none (the 2 s fallback poll), and a session pooler
    # of 4 server connections with a budget of 4.
    listen_direct = lambda url: {"OUTBOXD_LISTEN_DATABASE_URL": url}
    latency = []
    with pgbouncer("transaction") as transaction, pgbouncer("session", pool_size=4) as session:
        for label, via, env in [
            ("transaction mode, OUTBOXD_LISTEN_DATABASE_URL direct", transaction, listen_direct),
            ("transaction mode alone (notifications miss: 2 s poll)", transaction, None),
            ("session mode, 4 server connections, OUTBOXD_DATABASE_MAX_CONNECTIONS=4", session,
             lambda url: {"OUTBOXD_DATABASE_MAX_CONNECTIONS": "4"}),
        ]:
            r = measure_latency(args, via=via, env=env)
            latency.append([label, f"{r['p50']:.1f}", f"{r['p99']:.1f}", f"{r['max']:.1f}",
                            f"{r['n'] / args.duration:.0f}", f"{r['cpu_ms']:.3f}"])
    table(f"Pooled latency: commit to send, one message per transaction at {args.rate}/s for {args.duration} s "
          "through PgBouncer, poll interval 15 s",
          ["set-up", "p50 ms", "p99 ms", "max ms", "achieved rate /s", "outboxd CPU ms/msg"], latency)


@contextmanager
def pushing_back_relay(*flags):
    """The project's test SMTP server on aiosmtpd (`tests/support/smtp_server.py`) as a
    relay that pushes back, unlike smtp-sink: with `--accept-rate N` it takes N messages a
    second and answers `454 4.7.0 Throttling failure` to the rest, as SES does. Yields its
    port and a function that counts what it accepted and refused."""
    spool, port = tempfile.mkdtemp(prefix="outboxd-relay-"), free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "support", "smtp_server.py"),
                             "--port", str(port), "--spool", spool, *flags],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # It stops when its standard input closes, with the process that started it.
    if proc.stdout.readline().strip() != "READY":
        raise SystemExit("the relay did not start (pip install -r tests/requirements.txt)")

    def counts():
        lines = lambda name: len(read_text(os.path.join(spool, name)).splitlines())
        return lines("messages.jsonl"), lines("throttled.jsonl")
    try:
        yield port, counts
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(spool, ignore_errors=True)


def scenario_relay(args):
    """A relay that accepts 40 messages a second and refuses the rest 454, with no
    OUTBOXD_RATE_LIMIT (the common case: the user does not know the relay's limit) and
    with one 2.5 times too high; and RELIABILITY.md's relay that refuses every fourth
    message whatever the rate, under a limit of 50/s."""
    rows = []
    for label, relay_flags, flags, rate in [
        ("40/s relay, no OUTBOXD_RATE_LIMIT", ["--accept-rate", "40"], [], 40),
        ("40/s relay, OUTBOXD_RATE_LIMIT=100/s", ["--accept-rate", "40"], ["--rate-limit", "100/s"], 40),
        ("every 4th refused, OUTBOXD_RATE_LIMIT=50/s", ["--throttle-every", "4", "--throttle-for", "100000"],
         ["--rate-limit", "50/s"], 50),
    ]:
        with database("outboxd_bench_relay") as url, pushing_back_relay(*relay_flags) as (port, counts):
            insert_pending(url, args.relay_messages)
            proc = Outboxd(url, port, *flags)
            # A controller that collapses would take many minutes: each row has a time box.
            wait_drained(url, args.relay_messages, timeout=args.relay_seconds, give_up=True)
            proc.stop()
            accepted, refused = counts()
            rate_seen = drain_rate(url)
            attempts, dead, left = psql(url, "SELECT coalesce(sum(attempts), 0), count(*) FILTER "
                                             "(WHERE dead_lettered_at IS NOT NULL), count(*) FILTER "
                                             "(WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL) "
                                             "FROM outbox_messages").split("|")
        rows.append([label, f"{rate_seen:.1f}", f"{rate_seen / rate:.2f}", accepted, refused,
                     f"{refused / max(accepted, 1):.2f}", attempts, dead, left])
    table(f"Relay that pushes back: {args.relay_messages} pending messages, at most {args.relay_seconds} s "
          "each, defaults otherwise",
          ["set-up", "accepted msg/s", "vs. the relay's rate", "accepted", "throttling replies",
           "replies per accepted", "attempts charged", "dead letters", "still pending"], rows)


def scenario_lanes(args):
    """A bulk run draining under a 40/s limit two replicas share, and transactional messages
    committed one at a time during it, two a second: how long each waits from its commit
    to its send, with the bulk kind in OUTBOXD_BULK_KINDS and with one lane."""
    import psycopg
    bulk, limit = args.lanes_bulk, 40
    rows = []
    for label, flags in [("two lanes (OUTBOXD_BULK_KINDS=workspace_invite)", ["--bulk-kinds", "workspace_invite"]),
                         ("one lane", [])]:
        with database("outboxd_bench_lanes") as url, smtp_sink() as port:
            psql(url, f"""
                INSERT INTO outbox_messages (kind, payload)
                SELECT 'workspace_invite', jsonb_build_object('to', 'reader' || g || '@example.com',
                       'inviter_name', 'Ada', 'workspace_name', 'Engines', 'accept_url', 'https://app.example/i/' || g)
                FROM generate_series(1, {bulk}) g;
                ANALYZE outbox_messages;""")
            procs = [Outboxd(url, port, "--rate-limit", f"{limit}/s", *flags, "--worker-id", f"bench-{i}")
                     for i in range(2)]
            committed = {}
            with psycopg.connect(url, autocommit=True) as conn:
                # Commits start once the bulk run is under way: a drain already running.
                while conn.execute("SELECT count(*) FROM outbox_messages "
                                   "WHERE dispatched_at IS NOT NULL").fetchone()[0] < min(limit, bulk // 4):
                    time.sleep(0.05)
                start = time.time()
                while time.time() - start < args.lanes_seconds:
                    time.sleep(max(0.0, start + len(committed) / 2.0 - time.time()))
                    row = conn.execute(
                        "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
                        "jsonb_build_object('to', 'u' || %s || '@example.com', 'name', 'U', 'verify_url', "
                        "'https://x/v')) RETURNING id", (len(committed),)).fetchone()
                    committed[row[0]] = time.time()
                ended = time.time()
                while conn.execute("SELECT count(*) FROM outbox_messages WHERE kind = 'account_verification' "
                                   "AND dispatched_at IS NOT NULL").fetchone()[0] < len(committed):
                    time.sleep(0.05)
                bulk_sent = conn.execute(
                    "SELECT count(*) FROM outbox_messages WHERE kind = 'workspace_invite' "
                    "AND dispatched_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)", (start, ended)).fetchone()[0]
                left = conn.execute("SELECT count(*) FROM outbox_messages WHERE dispatched_at IS NULL").fetchone()[0]
            for p in procs:
                p.stop()
            sent = dict(tuple(line.split("|")) for line in psql(
                url, "SELECT id, extract(epoch FROM dispatched_at) FROM outbox_messages "
                     "WHERE kind = 'account_verification'").splitlines())
        waits = sorted(float(sent[str(i)]) - t for i, t in committed.items())
        q = statistics.quantiles(waits, n=100, method="inclusive") if len(waits) > 1 else waits * 99
        rows.append([label, len(waits), sum(w <= 3.0 for w in waits), f"{q[49]:.2f}", f"{q[98]:.2f}",
                     f"{waits[-1]:.2f}", f"{bulk_sent / (ended - start):.1f}", left])
    table(f"Lanes: {bulk} bulk messages draining at a {limit}/s limit two replicas share; transactional "
          f"messages committed two a second for {args.lanes_seconds} s once it is under way, smtp-sink",
          ["set-up", "transactional", "sent within 3 s", "commit to send p50 s", "p99 s", "max s",
           "bulk msg/s meanwhile", "bulk left when the last was sent"], rows)


def scenario_baseline(args, drain_result):
    flags = ["--batch-size", "25", "--smtp-concurrency", "1", "--poll-interval", "15s"]
    with database("outboxd_bench_baseline") as url:
        r = run_drain(url, args.baseline_messages, flags)
    tuned = f"{drain_result['rate'] / r['rate']:.1f}x" if drain_result else "n/a"
    table(f"Baseline: the original design's shape ({' '.join(flags)}), {args.baseline_messages} messages",
          ["msg/s", "CPU ms/msg", "outboxd tuned vs. baseline"],
          [[f"{r['rate']:.0f}", f"{1000 * r['cpu'] / r['messages']:.3f}", tuned]])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=["drain", "defaults", "latency", "longtx", "idle", "bigtable", "replicas", "pooled", "relay", "lanes", "dbcost", "statements", "baseline"])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--baseline-messages", type=int, default=20_000)
    parser.add_argument("--pooled-messages", type=int, default=50_000)
    parser.add_argument("--relay-messages", type=int, default=2400)
    parser.add_argument("--relay-seconds", type=int, default=60, help="the most each relay row runs")
    parser.add_argument("--lanes-bulk", type=int, default=2400, help="the lanes scenario's bulk run")
    parser.add_argument("--dbcost-messages", type=int, default=20_000, help="the dbcost scenario's messages")
    parser.add_argument("--dbcost-rate", type=int, default=200, help="the dbcost scenario's steady messages a second")
    parser.add_argument("--dbcost-seconds", type=int, default=60, help="how long the dbcost steady load lasts")
    parser.add_argument("--dbcost-steady-runs", type=int, default=3, help="the dbcost steady load's runs")
    parser.add_argument("--lanes-seconds", type=int, default=30, help="how long transactional messages are committed")
    parser.add_argument("--big-rows", type=int, default=10_000_000)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--lingers", default="50ms,75ms,100ms,200ms,400ms",
                        help="the latency scenario's --linger values, one steady run each")
    parser.add_argument("--idle", type=int, default=60)
    parser.add_argument("--longtx", type=int, default=600, help="seconds the long transaction stays open")
    parser.add_argument("--longtx-window", type=int, default=60, help="seconds per row of the longtx table")
    parser.add_argument("--repeat", type=int, default=3, help="drain runs (the median is reported)")
    add_binary_arguments(parser)
    args = parser.parse_args()
    use_binary(args)
    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read())
    pg = psql(ADMIN_URL, "SHOW server_version")
    print(f"## Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print(f"{os.cpu_count()} cores ({cpu.group(1) if cpu else 'unknown CPU'}), "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, PostgreSQL {pg}, "
          f"smtp-sink on loopback; outboxd, PostgreSQL and the sink share the machine.")
    drain_result = None
    for name in args.scenarios:
        log(f"== {name}")
        if name == "drain":
            drain_result = scenario_drain(args)
        elif name == "defaults":
            scenario_defaults(args, drain_result)
        elif name == "latency":
            scenario_latency(args)
        elif name == "idle":
            scenario_idle(args)
        elif name == "bigtable":
            scenario_bigtable(args, drain_result)
        elif name == "replicas":
            scenario_replicas(args)
        elif name == "longtx":
            scenario_longtx(args)
        elif name == "pooled":
            scenario_pooled(args)
        elif name == "relay":
            scenario_relay(args)
        elif name == "lanes":
            scenario_lanes(args)
        elif name == "dbcost":
            import dbcost  # noqa: E402  (bench/dbcost.py, beside this file)
            dbcost.run(args, sys.modules[__name__])
        elif name == "statements":
            import statements  # noqa: E402  (bench/statements.py, beside this file)
            statements.run(args, sys.modules[__name__])
        elif name == "baseline":
            scenario_baseline(args, drain_result)
        else:
            raise SystemExit(f"unknown scenario {name!r}")


if __name__ == "__main__":
    main()
