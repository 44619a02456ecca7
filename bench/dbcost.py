"""The `dbcost` scenario of bench/run.py: what outboxd costs the application's database.

Each part runs on a fresh private cluster with default settings (autovacuum on). First, N
messages are inserted one transaction each, as producers do, then drained with the
dispatcher's defaults into smtp-sink: WAL per email for the insert and for the drain (each
measured from a checkpoint, so full-page images are counted as production would see them
after one), `pg_walinspect`'s breakdown of each by record type, dead tuples, and the CPU
time of the PostgreSQL backends serving the dispatcher per email. Then a steady load of one
message per commit at 200 a second for a minute: the backends' CPU per email there, the
dispatcher's own, and commit-to-send latency; for outboxd over a table that already holds
100 000 sent messages, analyzed, and over an empty one.

Where `npm ci --prefix bench` has installed graphile-worker and nodemailer (bench/package.json),
graphile-worker runs the same parts beside it with its own defaults
(bench/graphile_worker.js): the same email to the same relay.
"""

import statistics
import subprocess
import time
from contextlib import contextmanager

from dbcost_systems import GraphileWorker, Outboxd

# Messages already sent when the steady load starts, for outboxd: a table as production
# has it, outboxd keeping what it sent until retention deletes it, analyzed as autovacuum
# would have. Over an empty table outboxd's statements get plans that read all of it (a
# hash join; they are cached per connection), until autovacuum's first ANALYZE, about a
# minute in: the steady part runs both ways. graphile-worker deletes a job once done.
HISTORIES = (100_000, 0)

# Record types shown, largest first.
RECORDS_SHOWN = 8


def lsn(conn):
    return conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]


def wait_flushed(conn, end):
    """Waits until WAL is flushed past `end`: pg_walinspect reads only flushed WAL, and
    the WAL writer flushes asynchronous commits within a fraction of a second."""
    for _ in range(100):
        if conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,)).fetchone()[0]:
            return
        time.sleep(0.05)
    raise RuntimeError(f"WAL not flushed past {end} after 5 s")


def wal_between(conn, start, end):
    return conn.execute("SELECT pg_wal_lsn_diff(%s, %s)::bigint", (end, start)).fetchone()[0]


def wal_records(conn, start, end):
    """(record type, count, bytes with full-page images, of which full-page images)."""
    wait_flushed(conn, end)
    return conn.execute(
        "SELECT \"resource_manager/record_type\", count, record_size + fpi_size, fpi_size "
        "FROM pg_get_wal_stats(%s, %s, per_record => true) WHERE count > 0 "
        "ORDER BY record_size + fpi_size DESC", (start, end)).fetchall()


class BackendCpu:
    """CPU seconds of the backends of this database serving `application`, from a start:
    each backend is read at every `sample()`, so one that closes between samples (an idle
    pool connection) loses at most what it used since the last."""

    def __init__(self, bench, conn, application):
        self.bench, self.conn, self.application = bench, conn, application
        self.start, self.last = self.read(), {}

    def read(self):
        seen = {}
        for (pid,) in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = %s", (self.application,)):
            stat = self.bench.read_text(f"/proc/{pid}/stat")
            if stat:
                seen[pid] = self.bench.stat_cpu_seconds(stat)
        return seen

    def sample(self):
        self.last.update(self.read())

    def seconds(self):
        self.sample()
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.last.items())


def wait_until_done(system, conn, cpu, timeout=1800):
    deadline = time.time() + timeout
    while system.pending(conn):
        if time.time() > deadline:
            raise SystemExit(f"{system.name}: not drained within {timeout}s")
        cpu.sample()
        time.sleep(0.1)


@contextmanager
def fresh_database(bench, system):
    """A private cluster with the system's schema; yields its URL."""
    with bench.private_cluster() as (url, _start, _stop):
        admin = url.rsplit("/", 1)[0] + "/postgres"
        subprocess.run(["psql", "-X", "-q", admin, "-c", "CREATE DATABASE outboxd"], check=True)
        system.prepare(url)
        yield url


def measure_drain(bench, system, count):
    """Insert `count` one transaction each, then drain them."""
    import psycopg
    with fresh_database(bench, system) as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute("CHECKPOINT")
        start = lsn(conn)
        for g in range(count):
            system.insert(conn, g)
        end = lsn(conn)
        insert_wal, insert_records = wal_between(conn, start, end), wal_records(conn, start, end)
        conn.execute("CHECKPOINT")
        start = lsn(conn)
        with bench.smtp_sink() as port:
            # From before the start: the dispatcher drains as soon as it is up.
            cpu = BackendCpu(bench, conn, system.application)
            began = time.time()
            proc = system.start(url, port)
            try:
                wait_until_done(system, conn, cpu)
                wall = time.time() - began
                pg_cpu = cpu.seconds()
                own_cpu = proc.cpu_seconds()
            finally:
                proc.stop()
        end = lsn(conn)
        drain_wal, drain_records = wal_between(conn, start, end), wal_records(conn, start, end)
        dead = system.dead_tuples(conn)
    return {"insert": insert_wal / count, "drain": drain_wal / count,
            "insert_records": insert_records, "drain_records": drain_records,
            "dead": dead / count, "pg_cpu_ms": 1000 * pg_cpu / count,
            "cpu_ms": 1000 * own_cpu / count, "rate": count / wall}


def measure_steady(bench, system, rate, seconds, history):
    """One message per commit at `rate` a second for `seconds`, the dispatcher running, over
    a table holding `history` sent messages."""
    import psycopg
    with fresh_database(bench, system) as url, psycopg.connect(url, autocommit=True) as conn:
        with bench.smtp_sink() as port:
            system.history(conn, history)
            proc = system.start(url, port)
            try:
                # One message first, so that the dispatcher's connections are open.
                system.insert(conn, 0)
                wait_until_done(system, conn, BackendCpu(bench, conn, system.application))
                cpu = BackendCpu(bench, conn, system.application)
                own_before = proc.cpu_seconds()
                committed, began, n = {}, time.time(), 0
                while time.time() - began < seconds:
                    wait = began + n / rate - time.time()
                    if wait > 0:
                        time.sleep(wait)
                    n += 1
                    system.insert(conn, n)
                    committed[n] = time.time()
                    if n % rate == 0:
                        cpu.sample()
                wait_until_done(system, conn, cpu)
                pg_cpu = cpu.seconds()
                own_cpu = proc.cpu_seconds() - own_before
                sent = system.sent_times(conn, proc)
            finally:
                proc.stop()
    latencies = sorted(1000 * (sent[g] - t) for g, t in committed.items() if g in sent)
    q = statistics.quantiles(latencies, n=100)
    return {"n": n, "pg_cpu_ms": 1000 * pg_cpu / n, "cpu_ms": 1000 * own_cpu / n,
            "p50": q[49], "p99": q[98]}


def systems(bench):
    if GraphileWorker.installed():
        return [Outboxd(bench), GraphileWorker(bench)]
    bench.log("dbcost: graphile-worker is not installed (npm ci --prefix bench); outboxd alone")
    return [Outboxd(bench)]


def run(args, bench):
    count = args.dbcost_messages
    drains = [(s, measure_drain(bench, s, count)) for s in systems(bench)]
    steadies = [(f"{s.name}, {s.history_said(history)}",
                 [measure_steady(bench, s, args.dbcost_rate, args.dbcost_seconds, history)
                  for _ in range(args.dbcost_steady_runs)])
                for s, _ in drains for history in s.histories(HISTORIES)]
    bench.table(
        f"Database cost: {count} messages inserted one transaction each, then drained with "
        "each dispatcher's defaults into smtp-sink; private cluster, default settings, each "
        "part from a checkpoint",
        ["dispatcher", "WAL B/email, insert", "drain", "insert + drain",
         "index leaf inserts/email, drain", "dead tuples/email",
         "PostgreSQL CPU ms/email, drain", "dispatcher CPU ms/email", "drain msg/s"],
        [[s.name, f"{r['insert']:.0f}", f"{r['drain']:.0f}", f"{r['insert'] + r['drain']:.0f}",
          f"{leaf_inserts(r['drain_records']) / count:.2f}", f"{r['dead']:.2f}",
          f"{r['pg_cpu_ms']:.3f}", f"{r['cpu_ms']:.3f}", f"{r['rate']:.0f}"] for s, r in drains])
    for part in ("insert", "drain"):
        for s, r in drains:
            bench.table(
                f"Database cost: {s.name}'s {part} WAL by record type (pg_walinspect), largest first",
                ["record type", "records/email", "B/email", "of which full-page images B/email"],
                [[name, f"{c / count:.2f}", f"{size / count:.0f}", f"{fpi / count:.0f}"]
                 for name, c, size, fpi in r[f"{part}_records"][:RECORDS_SHOWN]])
    bench.table(
        f"Database cost in steady traffic: one message per commit at {args.dbcost_rate}/s for "
        f"{args.dbcost_seconds} s, into smtp-sink, each dispatcher's defaults; outboxd over a "
        "table of sent rows (analyzed, as autovacuum leaves it) and over an empty one; "
        f"{args.dbcost_steady_runs} runs each, each on a fresh private cluster",
        ["dispatcher", "PostgreSQL CPU ms/email", "dispatcher CPU ms/email",
         "commit-to-send p50 ms (outboxd: to the outcome's commit)", "p99 ms"],
        [[name, spread(runs, "pg_cpu_ms", 3), spread(runs, "cpu_ms", 3),
          spread(runs, "p50", 1), spread(runs, "p99", 1)] for name, runs in steadies])


def leaf_inserts(records):
    return sum(c for name, c, _, _ in records if name in ("Btree/INSERT_LEAF", "Gin/INSERT"))


def spread(runs, key, digits):
    low, high = min(r[key] for r in runs), max(r[key] for r in runs)
    return f"{low:.{digits}f}" if len(runs) == 1 else f"{low:.{digits}f} to {high:.{digits}f}"
