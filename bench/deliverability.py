#!/usr/bin/env python3
"""What deliverability costs in a drain: the same messages drained plainly, with a
suppression list of 100 000 addresses and of 1 000 (1% of the messages going to one of
them; a list this short is read from the table rather than its index), signed
with DKIM (RSA-2048), signed twice (RSA-2048 and Ed25519 beside it), and with a signed
return path per message (OUTBOXD_BOUNCE_DOMAIN), back to back on this machine.

    python3 bench/deliverability.py                  # 20 000 messages per variant
    python3 bench/deliverability.py --messages 5000

Uses bench/run.py's harness (the release binary, the local PostgreSQL, smtp-sink); prints a
table for BENCHMARKS.md. Nothing here asserts a time.
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the harness)

SUPPRESSED = (100_000, 1_000)


def suppressing(size):
    """Puts `size` addresses on the list before a drain of `messages`."""
    return lambda url, messages: suppress(url, messages, size)


def suppress(url, messages, size):
    # Every hundredth message's recipient (run.KINDS_SQL sends to user<g>@ or billing<g>@),
    # and the rest of the list addresses no message goes to.
    run.psql(url, f"""
        INSERT INTO outbox_suppressions (address, reason, source)
        SELECT CASE g % 3 WHEN 2 THEN 'billing' ELSE 'user' END || g || '@example.com', 'manual', 'operator'
        FROM generate_series(100, {messages}, 100) g
        UNION ALL
        SELECT 'nobody' || g || '@example.net', 'hard_bounce', 'smtp'
        FROM generate_series(1, {size} - {messages} / 100) g;
        ANALYZE outbox_suppressions;""")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--binary", help="an outboxd binary to run instead of target/release/outboxd")
    args = parser.parse_args()
    if args.binary:
        run.BIN = args.binary
    elif not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "outboxd"], cwd=run.ROOT, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "dkim.pem")
        subprocess.run(["openssl", "genrsa", "-traditional", "-out", key, "2048"], check=True, capture_output=True)
        dkim = ["--dkim-domain", "example.com", "--dkim-selector", "bench", "--dkim-private-key-file", key]
        ed_key = os.path.join(tmp, "dkim-ed25519.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", ed_key], check=True,
                       capture_output=True)
        both = dkim + ["--dkim-ed25519-selector", "bench-ed", "--dkim-ed25519-private-key-file", ed_key]
        rows, plain = [], None
        verp = ["--bounce-domain", "bounces.example.com"]
        for label, flags, prepare in [
            ("plain", run.TUNED, None),
            *((f"{size:,} suppressed addresses", run.TUNED, suppressing(size)) for size in SUPPRESSED),
            ("DKIM, RSA-2048", run.TUNED + dkim, None),
            ("DKIM, RSA-2048 and Ed25519", run.TUNED + both, None),
            ("signed return paths (OUTBOXD_BOUNCE_DOMAIN)", run.TUNED + verp, None),
        ]:
            run.log(f"== {label}")
            with run.database("outboxd_bench_deliverability") as url:
                if prepare:
                    prepare(url, args.messages)
                # The return paths' secret only with their domain: one without the other is refused.
                env = {"OUTBOXD_BOUNCE_SECRET": "b" * 32} if "--bounce-domain" in flags else None
                r = run.run_drain(url, args.messages, flags, env=env)
                ended = int(run.psql(url, "SELECT count(*) FROM outbox_messages WHERE end_reason = 'suppressed'"))
            plain = plain or r["rate"]
            rows.append([label, f"{r['rate']:.0f}", f"{r['rate'] / plain:.2f}", f"{1000 * r['cpu'] / r['messages']:.3f}",
                         f"{1000 * r['others']['postgres'] / r['messages']:.3f}", f"{r['rss']:.1f}", ended])
    run.table(f"Deliverability: {args.messages} pending messages, {' '.join(run.TUNED)}",
              ["variant", "msg/s", "vs. plain", "outboxd CPU ms/msg", "PostgreSQL CPU ms/msg", "peak RSS MiB",
               "ended suppressed"], rows)


if __name__ == "__main__":
    main()
