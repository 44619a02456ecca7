#!/usr/bin/env python3
"""The drain with delivery callbacks on (OUTBOXD_CALLBACK_URL) beside the same drain with them
off, alternated: what keeping a callback in the outcome statement and sending it costs the
delivery rate. The endpoint is a small asyncio server in this process that answers 204 at
once (an application's endpoint would be elsewhere); the table also says how long after
the drain the last callback was taken.

    python3 bench/callbacks.py                 # 3 rounds of 50 000 messages each way
    python3 bench/callbacks.py --messages 5000 --rounds 1

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import asyncio
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwAAAAAAAAAAA="


class Endpoint:
    """An HTTP/1.1 endpoint that reads each request and answers 204, counting them."""

    def __init__(self):
        self.port = run.free_port()
        self.taken = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait()

    def _serve(self, ready):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _client(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.taken += 1
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def one_drain(messages, callbacks, endpoint):
    with run.database("outboxd_bench_callbacks") as url:
        env = {}
        flags = list(run.TUNED)
        if callbacks:
            flags += ["--callback-url", f"http://127.0.0.1:{endpoint.port}/callbacks"]
            env["OUTBOXD_CALLBACK_SECRET"] = SECRET
        before = endpoint.taken
        result = run.run_drain(url, messages, flags, env=env)
        result["callbacks"] = callbacks
        if callbacks:
            # What the drain left to send when it ended (the sender stops with the replica).
            pending = int(run.psql(url, "SELECT count(*) FROM outbox_callbacks WHERE failed_at IS NULL"))
            result["taken"] = endpoint.taken - before
            result["left"] = pending
        return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--binary", help="an outboxd binary to run instead of target/release/outboxd")
    args = parser.parse_args()
    if args.binary:
        run.BIN = args.binary
    elif not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=run.ROOT, check=True)
    endpoint = Endpoint()
    rows, rates = [], {False: [], True: []}
    for n in range(args.rounds):
        for callbacks in (False, True):
            r = one_drain(args.messages, callbacks, endpoint)
            rates[callbacks].append(r["rate"])
            rows.append([f"{n + 1}", "on" if callbacks else "off", f"{r['rate']:.0f}",
                         f"{1000 * r['cpu'] / r['messages']:.3f}", f"{r['others']['postgres']:.1f}",
                         str(r.get("taken", "–")), str(r.get("left", "–")), r["dead"]])
    median = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    run.table(f"Callbacks: {args.messages} messages drained with callbacks off and on, alternated, "
              f"{' '.join(run.TUNED)}; endpoint answering 204 in this process",
              ["round", "callbacks", "msg/s", "outboxd CPU ms/msg", "PostgreSQL CPU s",
               "callbacks taken during the drain", "callbacks left when it ended", "dead letters"], rows)
    print(f"median msg/s: off {median[False]:.0f}, on {median[True]:.0f} "
          f"({100 * median[True] / median[False]:.0f}% of off)")


if __name__ == "__main__":
    main()
