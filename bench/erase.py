#!/usr/bin/env python3
"""Erasure by recipient on a big table: `outboxd erase` of an address with ERASED messages
among TOTAL sent ones (10 000 among 10 million by default), while a replica drains DRAIN
pending messages to others. Measures how long the erasure takes, its longest transaction
(sampled every 20 ms from pg_stat_activity: the longest any of its row locks is held), the
drain's rate beside it and alone, and searches every text column of outboxd's tables for
the address afterwards.

    python3 bench/erase.py                         # 10 million rows, 10 000 to erase
    python3 bench/erase.py --total 200000 --erased 2000 --drain 20000

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

ADDRESS = "ada@example.com"
# The erasure's statements, as pg_stat_activity shows them: each writes `payload_removed_at`.
ERASE_STATEMENT = "%payload_removed_at = now()%"


def load(url, total, erased):
    """`total` sent messages, every (total / erased)th to ADDRESS, each with an event."""
    every = total // erased
    run.log(f"loading {total} sent messages ({erased} to {ADDRESS})")
    step = 1_000_000
    for start in range(1, total + 1, step):
        end = min(start + step - 1, total)
        run.psql(url, f"""
            SET session_replication_role = replica;
            INSERT INTO outbox_messages (kind, payload, next_attempt_at, dispatched_at, smtp_reply)
            SELECT 'account_verification',
                   jsonb_build_object('to', CASE WHEN g % {every} = 0 THEN '{ADDRESS}'
                                                 ELSE 'user' || g || '@example.com' END,
                                      'name', 'User ' || g, 'verify_url', 'https://app.example/v/' || g),
                   now(), now() - interval '2 days' + g * interval '10 ms',
                   '250 2.0.0 <' || CASE WHEN g % {every} = 0 THEN '{ADDRESS}' ELSE 'u' || g END || '> queued'
            FROM generate_series({start}, {end}) g""")
    run.psql(url, f"""
        INSERT INTO outbox_message_events (message_id, event, detail)
        SELECT id, 'retry', '450 4.2.0 <{ADDRESS}>: mailbox busy' FROM outbox_messages
        WHERE payload->>'to' = '{ADDRESS}'""")
    # VACUUM runs outside a transaction: a statement of its own each.
    run.psql(url, "VACUUM ANALYZE outbox_messages")
    run.psql(url, "VACUUM ANALYZE outbox_message_events")


class Sampler:
    """The longest erase transaction, from pg_stat_activity every 20 ms."""

    def __init__(self, url):
        self.url, self.longest, self.stop = url, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        sql = ("SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
               f"FROM pg_stat_activity WHERE query LIKE '{ERASE_STATEMENT}' AND state <> 'idle'")
        with subprocess.Popen(["psql", "-X", "-q", "-A", "-t", self.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, bufsize=1) as psql:
            while not self.stop.is_set():
                psql.stdin.write(sql + ";\n")
                psql.stdin.flush()
                self.longest = max(self.longest, float(psql.stdout.readline().strip() or 0))
                time.sleep(0.02)
            psql.stdin.close()

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.longest


def traces(url):
    """The text columns of outboxd's tables, but the suppression lists', that hold ADDRESS."""
    columns = run.psql(url, """
        SELECT table_name || '.' || column_name FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name LIKE 'outbox\\_%'
          AND data_type IN ('text', 'jsonb', 'ARRAY')
          AND table_name NOT IN ('outbox_suppressions', 'outbox_lane_suppressions')""").split()
    found = 0
    for column in columns:
        table, name = column.split(".")
        found += int(run.psql(url, f"SELECT count(*) FROM {table} WHERE \"{name}\"::text ILIKE '%{ADDRESS}%'"))
    return len(columns), found


def drain_beside(url, count, erase):
    """Drains `count` pending messages; with `erase`, runs the erasure meanwhile."""
    start = int(run.psql(url, "SELECT coalesce(max(id), 0) FROM outbox_messages")) + 1
    run.insert_pending(url, count, start=start)
    with run.smtp_sink() as port:
        proc = run.Outboxd(url, port, *run.TUNED, "--worker-id", "bench-erase")
        erased = None
        if erase:
            time.sleep(1)  # the drain under way
            sampler = Sampler(url)
            began = time.time()
            out = subprocess.run([run.BIN, "erase", "--database-url", url, "--recipient", ADDRESS, "--yes"],
                                 check=True, capture_output=True, text=True).stdout
            erased = {"seconds": time.time() - began, "longest": sampler.done(), "said": out}
        run.wait_drained(url, count)
        proc.stop()
    return run.drain_rate(url, after_id=start - 1), erased


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total", type=int, default=10_000_000)
    parser.add_argument("--erased", type=int, default=10_000)
    parser.add_argument("--drain", type=int, default=50_000)
    run.add_binary_arguments(parser)
    args = parser.parse_args()
    run.use_binary(args)
    with run.database("outboxd_bench_erase") as url:
        load(url, args.total, args.erased)
        alone, _ = drain_beside(url, args.drain, erase=False)
        beside, erased = drain_beside(url, args.drain, erase=True)
        columns, left = traces(url)
        size = run.psql(url, "SELECT pg_size_pretty(pg_total_relation_size('outbox_messages'))")
    said = dict(line.split(": ", 1) for line in erased["said"].splitlines() if ": " in line)
    run.table(f"Erasure: {args.erased} messages to one address among {args.total} sent ({size}), "
              f"while a replica drains {args.drain} others",
              ["drain alone msg/s", "drain beside the erasure msg/s", "erasure s",
               "longest erase transaction ms (its own)", "longest seen by the 20 ms sampler ms",
               "ended messages erased", "text columns searched", "columns still holding the address"],
              [[f"{alone:.0f}", f"{beside:.0f}", f"{erased['seconds']:.1f}",
                said.get("longest transaction", "?").replace(" ms", ""), f"{1000 * erased['longest']:.0f}",
                said.get("ended messages erased", "?"), str(columns), str(left)]])


if __name__ == "__main__":
    main()
