"""The dispatchers bench/dbcost.py measures: outboxd, and graphile-worker with nodemailer.

Each gives its schema, a producer's insert of message `g` (one transaction, the same email
for both: an account verification to user<g>@example.com), its dispatcher started against
a relay, whether anything is left to send, and when each message was sent.
"""

import os
import re
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPIENT = re.compile(r"^user(\d+)@example\.com$")


class Outboxd:
    name = "outboxd"
    application = "outboxd"

    def __init__(self, bench):
        self.bench = bench

    def prepare(self, url):
        subprocess.run([self.bench.BIN, "migrate", "--create-database", "--database-url", url], check=True,
                       capture_output=True)

    def insert(self, conn, g):
        conn.execute(
            "INSERT INTO outbox_messages (kind, payload) VALUES ('account_verification', "
            "jsonb_build_object('to', 'user' || %s::int || '@example.com', 'name', 'User', "
            "'verify_url', 'https://app.example/verify?t=' || md5(%s::text)))", (g, g))

    def start(self, url, port):
        return self.bench.Outboxd(url, port)

    @staticmethod
    def histories(choices):
        return choices

    @staticmethod
    def history_said(count):
        return f"{count} sent rows" if count else "empty table"

    def history(self, conn, count):
        """`count` messages sent an hour ago, as retention keeps them."""
        if not count:
            return
        conn.execute(
            "INSERT INTO outbox_messages (kind, payload, created_at, not_before, dispatched_at) "
            "SELECT 'account_verification', jsonb_build_object('to', 'old' || g || '@example.com', "
            "'name', 'User', 'verify_url', 'https://app.example/verify?t=' || md5(g::text)), "
            "now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour' "
            "FROM generate_series(1, %s) AS g", (count,))
        conn.execute("VACUUM ANALYZE outbox_messages")

    def pending(self, conn):
        return conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_messages "
                            "WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL)").fetchone()[0]

    def dead_tuples(self, conn):
        return conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                            "WHERE relname = 'outbox_messages'").fetchone()[0]

    def sent_times(self, conn, _proc):
        return {int(m.group(1)): at for to, at in conn.execute(
            "SELECT payload->>'to', extract(epoch FROM dispatched_at)::float8 "
            "FROM outbox_messages WHERE dispatched_at IS NOT NULL") if (m := RECIPIENT.match(to))}


class GraphileWorker:
    name = "graphile-worker"
    application = "graphile-worker"

    script = os.path.join(HERE, "graphile_worker.js")

    def __init__(self, bench):
        self.bench = bench

    @staticmethod
    def installed():
        return os.path.isdir(os.path.join(HERE, "node_modules", "graphile-worker"))

    def prepare(self, url):
        subprocess.run(["node", self.script, "migrate", url], check=True, capture_output=True)

    def insert(self, conn, g):
        conn.execute(
            "SELECT graphile_worker.add_job('account_verification', json_build_object("
            "'to', 'user' || %s::int || '@example.com', 'name', 'User', "
            "'verify_url', 'https://app.example/verify?t=' || md5(%s::text)))", (g, g))

    def start(self, url, port):
        return Node(self, f"{url}?application_name={self.application}", port)

    @staticmethod
    def histories(_choices):
        return (0,)

    @staticmethod
    def history_said(_count):
        return "its defaults"

    def history(self, conn, _count):
        """Nothing: graphile-worker deletes a job once it is done."""
        conn.execute("VACUUM ANALYZE graphile_worker._private_jobs")

    def pending(self, conn):
        return conn.execute("SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)").fetchone()[0]

    def dead_tuples(self, conn):
        return conn.execute("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
                            "WHERE schemaname = 'graphile_worker'").fetchone()[0]

    def sent_times(self, _conn, proc):
        return proc.sent_times()


class Node:
    """bench/graphile_worker.js at work, printing each recipient and when it was sent."""

    def __init__(self, system, url, port):
        self.log = tempfile.NamedTemporaryFile(mode="w+", prefix="graphile-worker-")
        self.proc = subprocess.Popen(["node", system.script, "work", url, str(port)],
                                     stdout=self.log, stderr=subprocess.DEVNULL)
        self.bench = system.bench
        # Started once it has connected (its pool opens a connection to listen).
        for _ in range(200):
            if self.proc.poll() is not None:
                raise SystemExit("graphile-worker exited at start")
            if os.path.getsize(self.log.name) > 0:
                break
            time.sleep(0.05)

    def cpu_seconds(self):
        return self.bench.stat_cpu_seconds(self.bench.read_text(f"/proc/{self.proc.pid}/stat"))

    def sent_times(self):
        with open(self.log.name) as f:
            return {int(RECIPIENT.match(to).group(1)): float(at)
                    for to, at in (line.split() for line in f if RECIPIENT.match(line.split()[0]))}

    def stop(self):
        self.bench.terminate(self.proc)
        self.log.close()
