//! Every metric's definition: its name, type, unit and help text, in one table ([`ALL`]).
//! The names are a public contract (docs/src/metrics.md).

use metrics::Unit;

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, type, unit and help text, all defined here and nowhere else.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    pub name: &'static str,
    pub metric_type: MetricType,
    /// `Some` for metrics measured in seconds.
    pub unit: Option<Unit>,
    pub help: &'static str,
}

const fn def(
    name: &'static str,
    metric_type: MetricType,
    unit: Option<Unit>,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        metric_type,
        unit,
        help,
    }
}

const SECONDS: Option<Unit> = Some(Unit::Seconds);

/// Declares each metric's name constant and its entry in [`ALL`] together, so that no
/// metric can be exported without its type and help, or be left out of the conventions
/// test that loops over `ALL` (`outbox_background_task_restarts_total` once was).
macro_rules! metrics {
    ($($name:ident = $text:literal, $kind:ident, $unit:expr, $help:literal;)*) => {
        $(pub const $name: &str = $text;)*

        /// Every metric outboxd exports; described to the recorder from this list, and the
        /// tests check every entry on a live `/metrics`.
        pub const ALL: &[MetricDef] = {
            use MetricType::{Counter, Gauge, Histogram};
            &[$(def($name, $kind, $unit, $help)),*]
        };
    };
}

metrics! {
    OLDEST_PENDING_AGE = "outbox_oldest_pending_age_seconds", Gauge, SECONDS,
        "How long the oldest pending message has been due (now minus the later of created_at and not_before); 0 when nothing is pending.";
    OLDEST_READY_AGE = "outbox_oldest_ready_age_seconds", Gauge, SECONDS,
        "How long the oldest message that is due now, and neither backing off nor leased, has waited to be claimed.";
    PENDING = "outbox_pending_messages", Gauge, None,
        "Messages neither dispatched nor dead-lettered, due or not.";
    DEAD_LETTERS = "outbox_dead_letter_messages", Gauge, None,
        "Dead-lettered messages.";
    OLDEST_TRANSACTION_AGE = "outbox_database_oldest_transaction_age_seconds", Gauge, SECONDS,
        "Age of the oldest transaction or snapshot open in outboxd's database (sessions of other roles where its role may see them: pg_read_all_stats): while it lasts, vacuum cannot remove sent rows' dead entries.";
    TABLE_DEAD_TUPLES = "outbox_table_dead_tuples", Gauge, None,
        "Dead tuples in outbox_messages, as PostgreSQL's statistics last counted them: what vacuum has yet to remove.";
    LAST_SAMPLE = "outbox_last_sample_timestamp_seconds", Gauge, SECONDS,
        "Unix time of the last successful sample of the database gauges.";
    SENT = "outbox_messages_sent_total", Counter, None,
        "Messages handed to SMTP successfully (delivery=\"smtp\"), or only logged and ended as logged_only, not sent, because no SMTP server is configured (delivery=\"log\").";
    SEND_FAILURES = "outbox_send_failures_total", Counter, None,
        "Failed delivery attempts, by class: transient (not delivered, retried), permanent (not delivered, dead-lettered) or ambiguous (the server had the whole message when its reply failed to come: perhaps delivered, retried with the same Message-ID).";
    DEAD_LETTERED = "outbox_messages_dead_lettered_total", Counter, None,
        "Messages dead-lettered, by the class of their last failure.";
    RELEASED = "outbox_messages_released_total", Counter, None,
        "Claimed messages given back unsent, by reason.";
    RECLAIMED = "outbox_messages_reclaimed_total", Counter, None,
        "Messages claimed after another claimer's lease ran out (a crashed or stalled replica).";
    LEASE_LOST = "outbox_lease_lost_total", Counter, None,
        "Outcomes not recorded because the lease had been taken over.";
    DELIVERY_LATENCY = "outbox_delivery_latency_seconds", Histogram, SECONDS,
        "From when a message fell due to when the SMTP server accepted it, by kind and lane; a bucket at each delivery objective's threshold (60 s).";
    SMTP_SEND_DURATION = "outbox_smtp_send_duration_seconds", Histogram, SECONDS,
        "Duration of one SMTP send, connection included.";
    DATABASE_ERRORS = "outbox_database_errors_total", Counter, None,
        "Failed database operations.";
    CIRCUIT_OPEN = "outbox_smtp_circuit_open", Gauge, None,
        "1 while a route's SMTP circuit breaker is open: every relay of the lane (lane=\"bulk\" only with OUTBOXD_BULK_SMTP_URL; else transactional carries both lanes) is unreachable, and the lane is not claimed.";
    NOTIFICATIONS_WORKING = "outbox_notifications_working", Gauge, None,
        "1 while a NOTIFY this replica sends comes back on its LISTEN connection; 0 when it does not (a transaction pooler in the way: set OUTBOXD_LISTEN_DATABASE_URL), and the dispatcher polls every 2 s instead.";
    LAST_CYCLE = "outbox_last_cycle_timestamp_seconds", Gauge, SECONDS,
        "Unix time of the dispatch loop's last completed cycle: its heartbeat.";
    READY = "outbox_ready", Gauge, None,
        "1 while this replica is ready: database reachable, schema migrated, not shutting down.";
    BUILD_INFO = "outbox_build_info", Gauge, None,
        "Always 1; labels carry the version and whether SMTP delivery is enabled.";
    PRUNED = "outbox_messages_pruned_total", Counter, None,
        "Dispatched and discarded rows deleted by retention, by state.";
    BACKGROUND_RESTARTS = "outbox_background_task_restarts_total", Counter, None,
        "Background tasks (retention, the sampler, the recorder's upkeep) started again after they failed or panicked, by task; each failure is also logged at ERROR.";
    THROTTLED = "outbox_throttled_total", Counter, None,
        "SMTP replies that said the relay is throttling (421/45x with 4.7.x, or a reply about rate or throttling): the message was released without an attempt and the pace cut.";
    EXPIRED = "outbox_messages_expired_total", Counter, None,
        "Messages not sent because their expiry passed first (expires_at, or OUTBOXD_EXPIRE_AFTER for their kind); not dead letters.";
    CALLBACKS_PENDING = "outbox_callbacks_pending", Gauge, None,
        "Delivery callbacks (OUTBOXD_CALLBACK_URL) not yet taken by the application's endpoint nor given up on.";
    CALLBACK_OLDEST_AGE = "outbox_callback_oldest_age_seconds", Gauge, SECONDS,
        "How long ago the event of the oldest callback still to send happened; 0 with none.";
    CALLBACK_FAILURES = "outbox_callback_failures_total", Counter, None,
        "Callback POSTs that failed, by reason (unreachable: no answer in time; refused: an answer other than 2xx); each is tried again with backoff.";
    CANCELLED = "outbox_messages_cancelled_total", Counter, None,
        "Messages withdrawn by their producer (outbox_cancel, outboxd cancel, the API) and ended unsent, as the timeline records them; every replica counts every one, so aggregate with max, not sum.";
    SEND_RATE_LIMIT = "outbox_send_rate_limit_per_second", Gauge, None,
        "The send rate the replicas share now through a lane's relays (lane: transactional covers both lanes without OUTBOXD_BULK_SMTP_URL): OUTBOXD_RATE_LIMIT (OUTBOXD_BULK_RATE_LIMIT for the bulk lane's own), or without one the pace found from throttling replies; cut by throttling and recovering; 0 with no limit until the relays throttle.";
    SUPPRESSED = "outbox_messages_suppressed_total", Counter, None,
        "Messages not sent because every recipient is on the suppression list, by the first recipient's reason and the scope of its entry (all, bulk or transactional); not dead letters.";
    BOUNCES = "outbox_bounces_received_total", Counter, None,
        "Bounces received, by source (smtp: a 5xx reply saying the mailbox does not exist; ses, postmark, webhook: a provider's notification) and type (hard, soft, undetermined). Hard bounces suppress their address.";
    COMPLAINTS = "outbox_complaints_received_total", Counter, None,
        "Spam complaints received from a provider, by source; each suppresses its address.";
    WEBHOOK_REQUESTS = "outbox_webhook_requests_total", Counter, None,
        "Requests to the bounce and complaint webhooks, by source and result (accepted, or why refused).";
    RELAY_UP = "outbox_relay_up", Gauge, None,
        "1 while a relay (host:port; lane: transactional for OUTBOXD_SMTP_URL and its fallbacks, bulk for OUTBOXD_BULK_SMTP_URL and its) takes messages, 0 while it is down: passed over, and probed every 5 s.";
    RELAY_SENT = "outbox_relay_sent_total", Counter, None,
        "Messages a relay accepted, by relay (host:port) and whether it is a fallback (fallback=\"true\": the relays before it could not take them).";
    UNSUBSCRIBES = "outbox_unsubscribes_total", Counter, None,
        "One-click unsubscribe requests (RFC 8058, POST /unsubscribe/TOKEN), by result: recorded, already_recorded, refused (not a link outboxd made, or not the RFC's body), failed (not recorded now; the sender retries).";
    BOUNCE_LISTENER = "outbox_bounce_listener_messages_total", Counter, None,
        "Messages the bounce listener (OUTBOXD_BOUNCE_LISTEN) took, by result: recorded (a DSN about our message), replay, not_a_bounce (an auto-reply, or no failure reported), forged (a return path outboxd did not make), too_large, failed (not recorded now; refused with a 451, the sender retries).";
    RECIPIENT_LOOKUPS = "outbox_recipient_lookups_total", Counter, None,
        "Recipient lookups (the API's, the admin page's), by result: answered, busy (every connection for lookups in use: refused at once), timed_out (stopped by the server), failed.";
    LANE_OLDEST_READY_AGE = "outbox_lane_oldest_ready_age_seconds", Gauge, SECONDS,
        "Per lane (bulk: the kinds in OUTBOXD_BULK_KINDS; transactional: every other kind), how long its oldest message that is due now, and neither backing off nor leased, has waited to be claimed. Paused kinds are left out.";
    LANE_OLDEST_PENDING_AGE = "outbox_lane_oldest_pending_age_seconds", Gauge, SECONDS,
        "Per lane, how long its oldest pending message has been due (as outbox_oldest_pending_age_seconds). Paused kinds are left out.";
    LANE_READY = "outbox_lane_ready_messages", Gauge, None,
        "Per lane, messages due now, neither backing off nor leased. Paused kinds are left out.";
    LANE_SENT = "outbox_lane_sent_total", Counter, None,
        "Messages sent (as outbox_messages_sent_total), per lane: a bulk lane with ready messages and no sends has stopped.";
    KIND_PAUSED = "outbox_kind_paused", Gauge, None,
        "1 while an operator's pause holds a kind's messages unclaimed (outboxd pause), 0 once it is resumed; kinds without templates are folded into kind=\"other\".";
    KIND_AUTO_PAUSED = "outbox_kind_auto_paused", Gauge, None,
        "1 while outboxd itself holds a kind paused on a bounce or complaint breach (OUTBOXD_AUTO_PAUSE_KINDS), until an operator resumes it.";
    KIND_PAUSE_AGE = "outbox_kind_pause_age_seconds", Gauge, SECONDS,
        "How long a kind has been paused; 0 when it is not.";
}
