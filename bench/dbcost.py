"""The `dbcost` scenario of bench/run.py: what outboxd costs the application's database.

On a private cluster with default settings (autovacuum on), N messages are inserted one
transaction each, as producers do, then drained by `outboxd run` with its defaults into
smtp-sink. It reports WAL per email for the insert and for the drain (each measured from a
checkpoint, so full-page images are counted as production would see them after one),
`pg_walinspect`'s breakdown of the drain's WAL by record type (index leaf inserts per
message among them), dead tuples, and the CPU time of the PostgreSQL backends serving
outboxd per email.
"""

import subprocess
import time

# The drain's record types shown, largest first.
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


def backend_cpu(bench, conn, application):
    """CPU seconds used so far by the backends of this database serving `application`."""
    total = 0.0
    for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s", (application,)):
        stat = bench.read_text(f"/proc/{pid}/stat")
        if stat:
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / bench.CLK_TCK
    return total


def insert_one_by_one(conn, count):
    """`count` messages, each in a transaction of its own, as producers commit them."""
    for g in range(count):
        conn.execute(
            "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
            "jsonb_build_object('to', 'user' || %s::int || '@example.com', 'name', 'User', "
            "'verify_url', 'https://app.example/verify?t=' || md5(%s::text)))", (g, g))


def measure(bench, count):
    """One insert-then-drain on a fresh private cluster."""
    import psycopg
    with bench.private_cluster() as (url, _start, _stop):
        admin = url.rsplit("/", 1)[0] + "/postgres"
        subprocess.run(["psql", "-X", "-q", admin, "-c", "CREATE DATABASE outboxd"], check=True)
        subprocess.run([bench.BIN, "migrate", "--database-url", url], check=True, capture_output=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            conn.execute("CHECKPOINT")
            start = lsn(conn)
            insert_one_by_one(conn, count)
            insert_wal = wal_between(conn, start, lsn(conn))
            conn.execute("CHECKPOINT")
            start = lsn(conn)
            with bench.smtp_sink() as port:
                proc = bench.Outboxd(url, port)
                began = time.time()
                bench.wait_drained(url, count)
                wall = time.time() - began
                pg_cpu = backend_cpu(bench, conn, "outboxd")
                cpu = proc.cpu_seconds()
                proc.stop()
            end = lsn(conn)
            drain_wal = wal_between(conn, start, end)
            wait_flushed(conn, end)
            records = conn.execute(
                "SELECT \"resource_manager/record_type\", count, record_size + fpi_size, fpi_size "
                "FROM pg_get_wal_stats(%s, %s, per_record => true) WHERE count > 0 "
                "ORDER BY record_size + fpi_size DESC", (start, end)).fetchall()
            dead = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                                "WHERE relname = 'outbox_messages'").fetchone()[0]
    return {"insert": insert_wal / count, "drain": drain_wal / count, "records": records,
            "dead": dead / count, "pg_cpu_ms": 1000 * pg_cpu / count, "cpu_ms": 1000 * cpu / count,
            "rate": count / wall}


def run(args, bench):
    count = args.dbcost_messages
    r = measure(bench, count)
    leaf = sum(c for name, c, _, _ in r["records"] if name == "Btree/INSERT_LEAF")
    bench.table(
        f"Database cost: {count} messages inserted one transaction each, then drained with the "
        "defaults into smtp-sink; private cluster, default settings, each part from a checkpoint",
        ["WAL B/email, insert", "drain", "insert + drain", "index leaf inserts/email, drain",
         "dead tuples/email", "PostgreSQL CPU ms/email, drain", "outboxd CPU ms/email", "drain msg/s"],
        [[f"{r['insert']:.0f}", f"{r['drain']:.0f}", f"{r['insert'] + r['drain']:.0f}",
          f"{leaf / count:.2f}", f"{r['dead']:.2f}", f"{r['pg_cpu_ms']:.3f}", f"{r['cpu_ms']:.3f}",
          f"{r['rate']:.0f}"]])
    bench.table(
        "Database cost: the drain's WAL by record type (pg_walinspect), largest first",
        ["record type", "records/email", "B/email", "of which full-page images B/email"],
        [[name, f"{c / count:.2f}", f"{size / count:.0f}", f"{fpi / count:.0f}"]
         for name, c, size, fpi in r["records"][:RECORDS_SHOWN]])
