-- The replicas' open SMTP circuits (migration 25), kept where the command line can read
-- them.

-- name: circuit_opened
-- A replica's circuit is open: since its first call while open, unless the row is older
-- than five minutes (a replica that died with its circuit open and came back).
-- $1 worker_id (text)
-- Index: outbox_replica_circuits_pkey.
INSERT INTO {{schema}}outbox_replica_circuits AS c (worker_id, open_since) VALUES ($1, now())
ON CONFLICT (worker_id) DO UPDATE SET seen_at = now(),
    open_since = CASE WHEN c.seen_at < now() - interval '5 minutes'
                      THEN now() ELSE c.open_since END

-- name: circuit_closed
-- A replica's circuit closed.
-- $1 worker_id (text)
-- Index: outbox_replica_circuits_pkey.
DELETE FROM {{schema}}outbox_replica_circuits WHERE worker_id = $1

-- name: open_circuits
-- The circuits open now: said within the last five minutes (a replica probes at least once
-- a minute while its circuit is open).
-- No parameters.
-- Index: none; a row a replica, read whole.
SELECT worker_id, open_since, seen_at FROM {{schema}}outbox_replica_circuits
WHERE seen_at > now() - interval '5 minutes' ORDER BY worker_id
