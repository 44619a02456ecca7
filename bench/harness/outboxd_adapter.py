#!/usr/bin/env python3
"""outboxd as a system of hardbyte/postgresql-job-queue-benchmarking (the cross-system queue
harness): one process per replica that speaks the harness's adapter contract
(CONTRIBUTING_ADAPTERS.md there), fetched by whoever runs it, never copied here.

- Environment in: DATABASE_URL, SCENARIO, PRODUCER_MODE (fixed or depth-target),
  PRODUCER_RATE, PRODUCER_PACING (harness: `ENQUEUE n` lines on standard input),
  PRODUCER_BATCH_MAX, TARGET_DEPTH, WORKER_COUNT (outboxd's SMTP connections),
  PRODUCER_RATE_CONTROL_FILE (the rate a high-load phase offers: the harness's tokens,
  which stay at the base rate, are scaled by it),
  JOB_PAYLOAD_BYTES, SAMPLE_EVERY_S, BENCH_INSTANCE_ID; OUTBOXD_BIN (the binary, default
  target/release/outboxd).
- It runs `outboxd migrate`, an smtp-sink of its own (writing every message to a file, so
  that deliveries are counted by Message-ID) and `outboxd run` against it. A job is an
  `account_verification` row; it is done when its row is recorded sent.
- Standard output: one `descriptor` line, then every SAMPLE_EVERY_S (aligned on the clock)
  the required metrics (claim_p50_ms, claim_p95_ms, claim_p99_ms: insert to recorded send,
  over 30 s, which is at least the pickup; enqueue_rate; completion_rate: this replica's
  sends, by `sent_by`) and, from replica 0 only (the harness's observer), queue_depth and
  a ledger by message id from outboxd's own tables and every replica's sink:
  outboxd_sent, outboxd_dead_letters, outboxd_delivered, outboxd_duplicates (a Message-ID
  taken twice, by any sinks), outboxd_lost (rows recorded sent that no sink took).
- SIGTERM: outboxd and the sink stopped, the last samples written, exit 0 within 5 s.
  SIGKILL (the harness's crash cells): outboxd and the sink die with it (PDEATHSIG), as a
  crashed worker would.
"""

import ctypes
import datetime as dt
import glob
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("OUTBOXD_BIN", os.path.join(ROOT, "target", "release", "outboxd"))
SYSTEM = "outboxd"
EVENT_TABLES = ["public.outbox_messages", "public.outbox_message_events"]
WINDOW_S = 30.0
# The latencies kept for the percentiles: a bounded reservoir, whatever the rate.
RESERVOIR = 20_000
MESSAGE_ID = re.compile(rb"^Message-I[Dd]:\s*(<[^>]+>)", re.MULTILINE)


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


def now_iso():
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log(*args):
    print(f"[{SYSTEM}]", *args, file=sys.stderr, flush=True)


class Emitter:
    def __init__(self, instance):
        self.instance, self.lock = instance, threading.Lock()

    def emit(self, record):
        record.setdefault("instance_id", self.instance)
        with self.lock:
            print(json.dumps(record), flush=True)

    def sample(self, metric, value, window_s):
        self.emit({"t": now_iso(), "system": SYSTEM, "kind": "adapter", "subject_kind": "adapter",
                   "subject": "", "metric": metric, "value": value, "window_s": window_s})


def die_with_parent():
    """In a child: killed when the adapter dies, however it dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(url):
    """A connection, tried again while the database is away (a chaos cell restarts it)."""
    while True:
        try:
            return psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError as e:
            log("database unreachable, again in 0.5 s:", e)
            time.sleep(0.5)


class Sink:
    """smtp-sink writing every message to a file in the run's spool (one a replica, all
    read by replica 0's ledger), and the Message-IDs read from them."""

    def __init__(self, spool, instance):
        self.port, self.spool = free_port(), spool
        dump = os.path.join(spool, f"sink-{instance}-{os.getpid()}.mbox")
        cmd = ["smtp-sink"] + (["-u", "postfix"] if os.geteuid() == 0 else [])
        cmd += ["-D", dump, f"127.0.0.1:{self.port}", "1024"]
        # A session of its own: a signal to the adapter's group is the adapter's to pass on.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=die_with_parent)
        self.read_to, self.seen, self.deliveries = {}, set(), 0

    def tally(self):
        """Deliveries and distinct Message-IDs so far, in every replica's file (reading only
        what each file added since)."""
        for path in glob.glob(os.path.join(self.spool, "sink-*.mbox")):
            with open(path, "rb") as f:
                f.seek(self.read_to.get(path, 0))
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            self.read_to[path] = self.read_to.get(path, 0) + cut
            for found in MESSAGE_ID.finditer(chunk[:cut]):
                self.deliveries += 1
                self.seen.add(found.group(1))
        return self.deliveries, len(self.seen)

    def stop(self):
        self.proc.terminate()


class Adapter:
    def __init__(self):
        self.url = os.environ["DATABASE_URL"]
        self.instance = env_int("BENCH_INSTANCE_ID", 0)
        self.out = Emitter(self.instance)
        self.mode = os.environ.get("PRODUCER_MODE", "fixed")
        self.rate = env_int("PRODUCER_RATE", 100)
        self.pacing = os.environ.get("PRODUCER_PACING", "adapter")
        # The harness's high-load phases write the offered rate here (base × multiplier);
        # its pacer keeps sending tokens at the base rate, so the adapter scales them.
        self.control = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
        self.offered, self.offered_read_at, self.carry = float(self.rate), 0.0, 0.0
        self.batch_max = env_int("PRODUCER_BATCH_MAX", 128)
        self.target_depth = env_int("TARGET_DEPTH", 1000)
        self.workers = env_int("WORKER_COUNT", 16)
        self.payload_bytes = env_int("JOB_PAYLOAD_BYTES", 256)
        self.every = env_int("SAMPLE_EVERY_S", 5)
        self.stop = threading.Event()
        self.tokens = queue.Queue(maxsize=4096)
        self.enqueued, self.depth, self.depth_read_at = 0, 0, 0.0
        self.latencies, self.latency_lock = [], threading.Lock()
        self.worker = f"harness-{self.instance}"
        # Ids of sends counted in the last seconds: a late commit is counted once.
        self.counted = {}

    def start(self):
        subprocess.run([BIN, "migrate", "--database-url", self.url], check=True,
                       stdout=subprocess.DEVNULL)
        # The run's spool, by the installation's tag: the harness makes a database a cell.
        with connect(self.url) as conn:
            tag = conn.execute("SELECT tag FROM outbox_installation").fetchone()[0]
        spool = os.path.join(tempfile.gettempdir(), f"outboxd-harness-{tag}")
        os.makedirs(spool, mode=0o777, exist_ok=True)
        os.chmod(spool, 0o777)
        self.sink = Sink(spool, self.instance)
        http = free_port()
        self.outboxd = subprocess.Popen(
            [BIN, "run", "--database-url", self.url, "--listen", f"127.0.0.1:{http}",
             "--smtp-url", f"smtp://127.0.0.1:{self.sink.port}", "--from", "Bench <bench@example.com>",
             "--worker-id", self.worker, "--batch-size", "400",
             "--smtp-concurrency", str(max(1, self.workers))],
            env=dict(os.environ, RUST_LOG=os.environ.get("OUTBOXD_LOG", "warn")),
            stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip()
        self.out.emit({"kind": "descriptor", "system": SYSTEM, "event_tables": EVENT_TABLES,
                       "extensions": [], "version": version, "schema_version": version,
                       "db_name": self.url.rsplit("/", 1)[-1], "started_at": now_iso()})
        threads = [self.producer, self.sampler]
        if self.pacing == "harness" and self.mode == "fixed":
            threads.append(self.read_tokens)
        for target in threads:
            threading.Thread(target=target, daemon=True).start()

    def read_tokens(self):
        for line in sys.stdin:
            if line.startswith("ENQUEUE "):
                try:
                    n = int(line.split(" ", 1)[1])
                except ValueError:
                    continue
                if n > 0:
                    self.tokens.put(n)
            if self.stop.is_set():
                return

    def offered_rate(self):
        """The rate the harness offers now: its control file's, read every half second."""
        if self.control and time.monotonic() - self.offered_read_at >= 0.5:
            self.offered_read_at = time.monotonic()
            try:
                with open(self.control) as f:
                    self.offered = float(f.read().strip())
            except (OSError, ValueError):
                pass
        return self.offered

    def next_batch(self, credit, conn):
        """How many to insert now, and the credit left, by the producer's mode. In
        depth-target mode the depth is read here, every 50 ms at most: the sampler's, every
        SAMPLE_EVERY_S, would let the producer overshoot the target many times over."""
        if self.mode == "depth-target":
            if time.monotonic() - self.depth_read_at >= 0.05:
                self.depth = conn.execute(
                    "SELECT count(*) FROM outbox_messages "
                    "WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL").fetchone()[0]
                self.depth_read_at = time.monotonic()
            wanted = min(self.batch_max, max(0, self.target_depth - self.depth))
            self.depth += wanted
            return wanted, credit
        if self.pacing == "harness":
            try:
                tokens = self.tokens.get(timeout=0.05)
            except queue.Empty:
                return 0, credit
            self.carry += tokens * self.offered_rate() / max(1, self.rate)
            whole = int(self.carry)
            self.carry -= whole
            return whole, credit
        whole = int(credit)
        return min(whole, self.batch_max), credit - min(whole, self.batch_max)

    def producer(self):
        conn, credit, last = connect(self.url), 0.0, time.monotonic()
        pad = "x" * max(0, self.payload_bytes - 120)
        insert = ("INSERT INTO outbox_messages (kind, payload) "
                  "SELECT 'account_verification', jsonb_build_object('to', 'u' || g || '@example.com', "
                  "'name', 'Bench', 'verify_url', 'https://app.example/v/' || g, 'pad', %s::text) "
                  "FROM generate_series(1, %s) AS g")
        while not self.stop.is_set():
            now = time.monotonic()
            credit += self.offered_rate() * (now - last)  # credited on the clock's elapsed time
            last = now
            try:
                n, credit = self.next_batch(credit, conn)
                if n <= 0:
                    time.sleep(0.01)
                    continue
                conn.execute(insert, (pad, n))
                self.enqueued += n
            except psycopg.Error as e:
                log("insert failed, reconnecting:", e)
                conn = connect(self.url)

    def sampler(self):
        conn, last_at = connect(self.url), None
        first = (time.time() // self.every + 1) * self.every
        time.sleep(max(0.0, first - time.time()))
        enqueued_before = self.enqueued
        while not self.stop.is_set():
            tick = time.time()
            try:
                last_at, done = self.read_sends(conn, last_at)
                self.depth = conn.execute(
                    "SELECT count(*) FROM outbox_messages "
                    "WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL").fetchone()[0]
                ledger = self.ledger(conn) if self.instance == 0 else {}
            except psycopg.Error as e:
                log("sample failed, reconnecting:", e)
                conn = connect(self.url)
                continue
            enqueued, enqueued_before = self.enqueued - enqueued_before, self.enqueued
            p50, p95, p99 = self.percentiles(tick)
            for metric, value in [("claim_p50_ms", p50), ("claim_p95_ms", p95), ("claim_p99_ms", p99)]:
                self.out.sample(metric, value, WINDOW_S)
            self.out.sample("enqueue_rate", enqueued / self.every, self.every)
            self.out.sample("completion_rate", done / self.every, self.every)
            if self.instance == 0:
                self.out.sample("queue_depth", self.depth, 0)
            for metric, value in ledger.items():
                self.out.sample(metric, value, 0)
            time.sleep(max(0.0, tick + self.every - time.time()))

    def read_sends(self, conn, since):
        """Rows this replica recorded sent since the last sample (its completions), and
        their insert-to-send times into the reservoir. A send's time is its statement's
        start, so a transaction that commits after a sample may carry a time before it: the
        read goes back a few seconds, and ids already counted are not counted again."""
        rows = conn.execute(
            "SELECT id, dispatched_at, extract(epoch FROM dispatched_at - created_at) * 1000 "
            "FROM outbox_messages WHERE dispatched_at > coalesce(%s, now()) - interval '5 seconds' "
            "AND sent_by = %s ORDER BY dispatched_at", (since, self.worker)).fetchall()
        now = time.time()
        fresh = [(at, ms) for id_, at, ms in rows if id_ not in self.counted]
        for id_, at, _ in rows:
            self.counted.setdefault(id_, at)
        if rows:
            horizon = rows[-1][1] - dt.timedelta(seconds=10)
            self.counted = {i: at for i, at in self.counted.items() if at >= horizon}
        with self.latency_lock:
            keep = RESERVOIR / max(len(fresh), 1)
            self.latencies += [(now, ms) for _, ms in fresh if random.random() < keep]
            self.latencies = [(t, ms) for t, ms in self.latencies if t >= now - WINDOW_S][-RESERVOIR:]
        return (rows[-1][1] if rows else since), len(fresh)

    def percentiles(self, now):
        with self.latency_lock:
            values = sorted(ms for t, ms in self.latencies if t >= now - WINDOW_S)
        if not values:
            return 0.0, 0.0, 0.0

        def q(p):
            return float(values[min(len(values) - 1, int(round(p * (len(values) - 1))))])
        return q(0.50), q(0.95), q(0.99)

    def ledger(self, conn):
        sent, dead = conn.execute(
            "SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL), "
            "count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) FROM outbox_messages").fetchone()
        deliveries, distinct = self.sink.tally()
        return {"outboxd_sent": sent, "outboxd_dead_letters": dead, "outboxd_delivered": distinct,
                "outboxd_duplicates": deliveries - distinct, "outboxd_lost": max(0, sent - distinct)}

    def shutdown(self):
        self.stop.set()
        self.outboxd.send_signal(signal.SIGTERM)
        try:
            self.outboxd.wait(timeout=4)
        except subprocess.TimeoutExpired:
            self.outboxd.kill()
        self.sink.stop()


def main():
    if os.environ.get("SCENARIO", "long_horizon") != "long_horizon":
        log("only SCENARIO=long_horizon is implemented")
        return 2
    adapter = Adapter()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    adapter.start()
    done.wait()
    adapter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
