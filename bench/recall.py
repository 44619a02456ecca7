#!/usr/bin/env python3
"""Recall by filter on a big backlog while delivery goes on: 100 000 pending messages of one
tag cancelled by `cancel_pending` (the statement `outboxd cancel --tag T --yes`, the API and
the admin page send, read from src/store/sql/cancel.sql), a batch of 1 000 a transaction,
while a replica drains 100 000 messages of another kind into smtp-sink. The table gives each
statement's time (the longest is what any lock was held for) and the drain's rate beside a
drain with nothing cancelled.

    python3 bench/recall.py
    python3 bench/recall.py --tagged 10000 --others 10000

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink). Nothing
here asserts a time.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

TAG = "campaign:bench"
BATCH = 1000


def insert_tagged(url, count):
    run.psql(url, f"""INSERT INTO outbox_messages (kind, payload, tags, not_before)
        SELECT 'workspace_invite', jsonb_build_object('to', 'tagged' || g || '@example.com',
               'name', 'Ada', 'workspace', 'Bench', 'invite_url', 'https://app.example/i'),
               ARRAY['{TAG}'], now() + interval '1 hour'
        FROM generate_series(1, {count}) g""")


def cancel_all(url):
    """Runs cancel_pending, keyset by keyset, as `store::cancel::cancel_pending` does; the
    time of each statement, in milliseconds, and the rows it cancelled."""
    sql = run.statement("cancel_pending")
    prepare = ("PREPARE cancel(text, text, timestamptz, timestamptz, text, int8, timestamptz, int8, text) AS "
               + sql + ";\n")
    times, cancelled = [], 0
    after = "NULL, NULL"
    while True:
        out = subprocess.run(
            ["psql", "-X", "-q", "-At", "-F", "|", url],
            input=prepare + "\\timing on\n"
            f"EXECUTE cancel(NULL, '{TAG}', NULL, NULL, NULL, {BATCH}, {after}, 'bench');\n",
            capture_output=True, text=True, check=True).stdout
        row, timing = [line for line in out.splitlines() if line.strip()][:2]
        last_due, last_id, scanned, done, _in_flight = row.split("|")
        times.append(float(timing.split()[1]))
        cancelled += int(done)
        if int(scanned) < BATCH:
            return times, cancelled
        after = f"'{last_due}', {last_id}"


def wait_others_sent(url, timeout=1800):
    """Until no message due within the hour is pending (the tagged ones are due later)."""
    import psycopg
    deadline = time.time() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.time() < deadline:
            if not conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE dispatched_at IS NULL "
                                "AND dead_lettered_at IS NULL AND next_attempt_at < now() + interval '30 minutes')"
                                ).fetchone()[0]:
                return
            time.sleep(0.1)
    raise SystemExit(f"not drained within {timeout}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tagged", type=int, default=100000)
    parser.add_argument("--others", type=int, default=100000)
    run.add_binary_arguments(parser)
    args = parser.parse_args()
    run.use_binary(args)
    rows = []
    for recall in (False, True):
        with run.database("outboxd_bench_recall") as url:
            insert_tagged(url, args.tagged)
            run.insert_pending(url, args.others)
            with run.smtp_sink() as port:
                started = time.time()
                proc = run.Outboxd(url, port, *run.TUNED)
                times, cancelled, took = [], 0, 0.0
                if recall:
                    begun = time.time()
                    times, cancelled = cancel_all(url)
                    took = time.time() - begun
                wait_others_sent(url)
                wall = time.time() - started
                proc.stop()
            rate = run.drain_rate(url)
            left = int(run.psql(url, f"SELECT count(*) FROM outbox_messages WHERE '{TAG}' = ANY(tags) "
                                     "AND dispatched_at IS NULL AND dead_lettered_at IS NULL"))
        rows.append(["cancel by tag meanwhile" if recall else "drain alone", f"{rate:.0f}", f"{wall:.1f}",
                     str(cancelled) if recall else "–", str(len(times)) if recall else "–",
                     f"{statistics.median(times):.0f}" if times else "–",
                     f"{max(times):.0f}" if times else "–", f"{took:.1f}" if recall else "–", str(left)])
    run.table(f"Recall by filter: {args.tagged} pending messages tagged {TAG} (due in an hour) cancelled "
              f"{BATCH} a statement while {args.others} others drain, {' '.join(run.TUNED)}",
              ["run", "others msg/s", "wall s", "cancelled", "statements", "median ms", "longest ms",
               "cancel s", "tagged left pending"], rows)


if __name__ == "__main__":
    main()
