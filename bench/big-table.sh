#!/usr/bin/env bash
# Times the sampler's gauge query and a dispatch claim on a table of 10 million dispatched
# rows and 100 000 pending ones (override with DISPATCHED=, PENDING=). Prints EXPLAIN
# ANALYZE, so index use is visible. Uses a database of its own and drops it afterwards
# unless KEEP=1.
#   bench/big-table.sh            # needs PostgreSQL on 127.0.0.1:5432 and cargo
set -euo pipefail
cd "$(dirname "$0")/.."
DISPATCHED=${DISPATCHED:-10000000}
PENDING=${PENDING:-100000}
DB=${DB:-outboxd_bench_big}
ADMIN=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
URL=${ADMIN%/*}/$DB
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$@"; }

psql "$ADMIN" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
cargo run --quiet --release -- migrate --database-url "$URL" 2>/dev/null
echo "loading $DISPATCHED dispatched and $PENDING pending rows..."
start=$(date +%s)
psql "$URL" <<SQL
SET session_replication_role = replica;  -- bulk load: skip the NOTIFY and default triggers
INSERT INTO outbox_messages (kind, payload, created_at, not_before, next_attempt_at, dispatched_at)
SELECT 'account_verification',
       jsonb_build_object('to', 'user' || g || '@example.com', 'name', 'User', 'verify_url', 'https://app.example/v/' || g),
       now() - interval '30 days' + g * interval '250 ms', now() - interval '30 days' + g * interval '250 ms',
       now() - interval '30 days' + g * interval '250 ms', now() - interval '30 days' + g * interval '250 ms' + interval '1 s'
FROM generate_series(1, $DISPATCHED) g;
INSERT INTO outbox_messages (kind, payload, created_at, not_before, next_attempt_at)
SELECT 'account_verification',
       jsonb_build_object('to', 'pending' || g || '@example.com', 'name', 'User', 'verify_url', 'https://app.example/v/' || g),
       now() - interval '10 minutes', now() - interval '10 minutes', now() - interval '10 minutes'
FROM generate_series(1, $PENDING) g;
VACUUM ANALYZE outbox_messages;
SQL
echo "loaded in $(( $(date +%s) - start ))s"
psql "$URL" -c "SELECT pg_size_pretty(pg_total_relation_size('outbox_messages')) AS table_and_indexes"

echo "== sampler query (outbox_pending_messages, outbox_dead_letter_messages, outbox_oldest_*_age_seconds)"
SAMPLER="SELECT
  (SELECT count(*) FROM outbox_messages WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL) AS pending,
  (SELECT count(*) FROM outbox_messages WHERE dead_lettered_at IS NOT NULL) AS dead_letters,
  (SELECT coalesce(extract(epoch FROM now() - min(greatest(created_at, not_before))), 0)::float8 FROM outbox_messages
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND greatest(created_at, not_before) <= now()) AS oldest_pending_age,
  (SELECT coalesce(extract(epoch FROM now() - min(next_attempt_at)), 0)::float8 FROM outbox_messages
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND next_attempt_at <= now()) AS oldest_ready_age"
psql "$URL" -c "$SAMPLER" >/dev/null  # warm the cache, as a running sampler does
psql "$URL" -c "EXPLAIN (ANALYZE, BUFFERS) $SAMPLER"
for _ in 1 2 3; do psql "$URL" -c '\timing on' -c "$SAMPLER" | grep Time; done

echo "== claim of 25 due rows (rolled back)"
psql "$URL" <<SQL
BEGIN;
EXPLAIN (ANALYZE, BUFFERS)
WITH due AS (
  SELECT id, locked_until AS previous_lease FROM outbox_messages
  WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND next_attempt_at <= now()
  ORDER BY next_attempt_at, id LIMIT 25 FOR UPDATE SKIP LOCKED)
UPDATE outbox_messages AS m
SET locked_until = now() + make_interval(secs => 60), next_attempt_at = now() + make_interval(secs => 60),
    locked_by = 'bench', claim_token = gen_random_uuid()
FROM due WHERE m.id = due.id
RETURNING m.id;
ROLLBACK;
SQL
[ "${KEEP:-0}" = 1 ] || psql "$ADMIN" -c "DROP DATABASE $DB WITH (FORCE)"
