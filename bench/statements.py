"""The `statements` scenario of bench/run.py: what the claim and the outcome write cost
PostgreSQL on their own, with no SMTP and no outboxd process.

A drain's PostgreSQL CPU per message moves by a fifth from run to run, with outboxd and the
sink competing for the same two cores, which hides a change of a few percent. Here one
connection runs the drain's two statements exactly as outboxd sends them (read from
src/store/, prepared, bound in the order `store::claim` and `store::record_outcomes` bind
them): a claim of a batch, then the previous batch's outcomes as sent, in chunks, so that
one batch is always in flight as in the drain. The figure is the backend's CPU time from
/proc, which the rest of the machine does not inflate.
"""

import statistics
import time
import uuid

# The drain's shape (bench/run.py TUNED): batches of 400, outcomes written a chunk at a time.
BATCH = 400
CHUNK = 200

# Parameter types, in bind order (PostgreSQL type OIDs): `store::claim`'s eleven and
# `store::record_outcomes`' thirteen.
CLAIM_TYPES = [20, 701, 25, 1184, 2950, 20, 1184, 1009, 1184, 1009, 20]
RECORD_TYPES = [2950, 1016, 1009, 1009, 1022, 1009, 25, 1009, 1000, 1009, 1007, 25, 1009]

# A relay's acceptance, as outboxd keeps it on a sent row.
REPLY = "250 2.0.0 Ok: queued as 4ZtQ1m0bz7z9vB"
# The relay that took it.
RELAY = "smtp.example.com:587"


class Prepared:
    """One named statement on a libpq connection, its parameters and results in binary
    format, as sqlx sends and reads them (text would add PostgreSQL's parsing of array
    literals and its formatting of every timestamp to the figure)."""

    def __init__(self, conn, name, sql, types):
        from psycopg.adapt import Transformer
        from psycopg.pq import Format
        self.pgconn, self.name, self.binary = conn.pgconn, name.encode(), Format.BINARY
        self.transformer = Transformer(conn)
        self.transformer.set_dumper_types(types, Format.BINARY)
        result = self.pgconn.prepare(self.name, sql.encode(), types)
        if result.error_message:
            raise RuntimeError(result.error_message.decode())

    def __call__(self, *params):
        """Executes the statement; returns its rows' first column, a bigint."""
        values = self.transformer.dump_sequence(params, [self.binary] * len(params))
        result = self.pgconn.exec_prepared(self.name, values, [self.binary] * len(params),
                                           result_format=self.binary)
        if result.error_message:
            raise RuntimeError(result.error_message.decode())
        return [int.from_bytes(result.get_value(i, 0), "big", signed=True)
                for i in range(result.ntuples)]


def drain_by_statements(url, claim_sql, record_sql, backend_cpu_seconds):
    """Claims every pending row, writing each batch's outcomes after the next claim;
    returns (rows claimed, rows written, backend CPU s, wall s). `backend_cpu_seconds` is
    bench/run.py's `process_cpu_seconds`."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        claim = Prepared(conn, "claim", claim_sql, CLAIM_TYPES)
        record = Prepared(conn, "record", record_sql, RECORD_TYPES)
        cpu, started = backend_cpu_seconds(pid), time.time()
        claimed = written = 0
        in_flight = None
        while True:
            token = uuid.uuid4()
            ids = claim(BATCH, 60.0, "bench-statements", None, token, 4_194_304, None, [], None,
                         ["transactional", "bulk"], None)
            if in_flight:
                previous, previous_ids = in_flight
                for at in range(0, len(previous_ids), CHUNK):
                    chunk = previous_ids[at:at + CHUNK]
                    n = len(chunk)
                    written += len(record(previous, chunk, ["sent"] * n, [None] * n, [0.0] * n,
                                          [None] * n, "outbox_bench", [None] * n, [False] * n,
                                          [REPLY] * n, [3] * n, "bench-statements", [RELAY] * n))
            in_flight = (token, ids) if ids else None
            claimed += len(ids)
            if not ids:
                return claimed, written, backend_cpu_seconds(pid) - cpu, time.time() - started


def run(args, bench):
    claim_sql = bench.statement("claim")
    record_sql = bench.statement("record_outcomes")
    messages, rows = args.messages, []
    for run in range(args.repeat):
        with bench.database("outboxd_bench_statements") as url:
            bench.insert_pending(url, messages)
            claimed, written, cpu, wall = drain_by_statements(url, claim_sql, record_sql,
                                                                  bench.process_cpu_seconds)
        if claimed != messages or written != messages:
            raise SystemExit(f"claimed {claimed} and wrote {written} of {messages}")
        rows.append((run + 1, messages / wall, 1000 * cpu / messages))
    median = statistics.median(r[2] for r in rows)
    bench.table(f"Statements: the claim and the outcome write alone, {messages} pending messages, "
                f"batches of {BATCH}, outcomes in chunks of {CHUNK}, one batch in flight; "
                f"{len(rows)} runs",
                ["run", "msg/s", "PostgreSQL CPU ms/msg"],
                [[f"{n}", f"{rate:.0f}", f"{ms:.4f}"] for n, rate, ms in rows]
                + ([["**median**", "", f"{median:.4f}"]] if len(rows) > 1 else []))
