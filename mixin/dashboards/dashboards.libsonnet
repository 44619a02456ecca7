// outboxd's Grafana dashboards, by file name. To add a panel: put it in a row below (the
// layout places it and numbers it), run `python3 mixin/generate.py`.
local utils = import '../lib/utils.libsonnet';
local p = import 'panels.libsonnet';
local s = p.selector;

{
  local config = $._config,
  local datasource = { type: 'prometheus', uid: '${datasource}' },

  // A histogram's quantile over the dashboard's rate interval.
  local quantile(q, metric) =
    p.target(
      'histogram_quantile(%g, sum by (le) (rate(%s_bucket{%s}[$__rate_interval])))' % [q, metric, s],
      'p%d' % std.round(q * 100),
    ),

  // The share of a delivery objective's messages accepted within its threshold over `window`.
  local compliance(slo, window) =
    local sel = '%s,lane="%s"' % [s, slo.lane];
    'sum(increase(outbox_delivery_latency_seconds_bucket{%s,%s}[%s])) / sum(increase(outbox_delivery_latency_seconds_count{%s}[%s]))' % [
      sel,
      utils.leMatcher(slo.thresholdSeconds),
      window,
      sel,
      window,
    ],

  // One row per delivery objective (_config.deliverySLOs): the alerts read the same windows.
  local sloRow(slo) =
    local budget = 1 - slo.objective;
    local period = '%dd' % slo.periodDays;
    p.row('Delivery objective: %s' % utils.sloText(slo), [
      p.stat(
        'Objective (%s)' % slo.name,
        'The objective: %s. Shown while outboxd reports.' % utils.sloText(slo),
        'percentunit',
        [p.target('%g * max(outbox_build_info{%s})' % [slo.objective, s], 'objective')],
        w=4,
      ),
      p.stat(
        'Compliance, last %d days' % slo.periodDays,
        'The share of the %s lane\'s messages the relay accepted within %g s of falling due, over the objective\'s period; red below the objective.' % [slo.lane, slo.thresholdSeconds],
        'percentunit',
        [p.target(compliance(slo, period), 'compliance')],
        w=5,
        thresholds=[['red', null], ['green', slo.objective]],
      ),
      p.stat(
        'Error budget left',
        'The share of the period\'s error budget (%g%% of messages later than %g s) not yet spent; 0 or below: the objective is missed.' % [budget * 100, slo.thresholdSeconds],
        'percentunit',
        [p.target('1 - (1 - (%s)) / %g' % [compliance(slo, period), budget], 'budget left')],
        w=5,
        thresholds=[['red', null], ['orange', 0.25], ['green', 0.5]],
      ),
      p.timeseries(
        'Burn rate',
        'How fast the error budget is being spent, over the alerts\' long windows: 1 spends it exactly over the period; the page fires at 14.4 (15m) or 6 (6h), the ticket at 3 (1d) or 1 (3d), each while its short window agrees.',
        'short',
        [
          p.target('(1 - (%s)) / %g' % [compliance(slo, w), budget], w)
          for w in std.sort(std.set([pair.long for pair in config.sloBurnFast + config.sloBurnSlow]), utils.seconds)
        ],
        w=10,
        thresholds=[['green', null], ['orange', 1], ['red', 14.4]],
      ),
    ]),

  grafanaDashboards+:: {
    'outboxd-overview.json': {
      uid: config.dashboardUid,
      title: 'outboxd / Overview',
      description: 'Is outboxd delivering email? Backlog age, throughput, failures, latency and health of the transactional-outbox dispatcher.',
      tags: config.dashboardTags,
      timezone: '',
      editable: true,
      graphTooltip: 1,
      schemaVersion: 39,
      version: 1,
      time: { from: 'now-6h', to: 'now' },
      refresh: '30s',
      links: [{ title: 'Runbook', type: 'link', url: config.runbookURL, targetBlank: true }],
      annotations: { list: [] },
      templating: {
        list: [
          {
            name: 'datasource',
            label: 'Data source',
            type: 'datasource',
            query: 'prometheus',
            current: {},
            hide: 0,
            refresh: 1,
            regex: '',
            includeAll: false,
            multi: false,
          },
          {
            name: 'job',
            label: 'Job',
            type: 'query',
            datasource: datasource,
            query: { query: 'label_values(outbox_build_info, job)', refId: 'job' },
            definition: 'label_values(outbox_build_info, job)',
            refresh: 2,
            includeAll: false,
            multi: false,
            // The job the mixin's selector names, when it names one.
            current: if config.dashboardJobDefault == '' then {} else {
              text: config.dashboardJobDefault,
              value: config.dashboardJobDefault,
            },
            sort: 1,
          },
          {
            name: 'instance',
            label: 'Instance',
            type: 'query',
            datasource: datasource,
            query: { query: 'label_values(outbox_build_info{job=~"$job"}, instance)', refId: 'instance' },
            definition: 'label_values(outbox_build_info{job=~"$job"}, instance)',
            refresh: 2,
            includeAll: true,
            allValue: '.*',
            multi: true,
            current: {},
            sort: 1,
          },
        ],
      },
      panels: p.layout([
        p.row('Is email flowing?', [
          p.timeseries(
            'Oldest pending age',
            'How long the oldest pending message has been due, and the oldest message that is due now and not backing off, all lanes and paused kinds included (the stall alert watches the transactional lane: see its row).',
            's',
            [
              p.target('max(outbox_oldest_pending_age_seconds{%s})' % s, 'oldest pending'),
              p.target('max(outbox_oldest_ready_age_seconds{%s})' % s, 'oldest ready'),
            ],
            w=12,
            thresholds=[['green', null], ['red', 600]],
          ),
          p.stat(
            'Pending messages',
            'Messages neither dispatched nor dead-lettered, due or not (sampled from the database).',
            'short',
            [p.target('max(outbox_pending_messages{%s})' % s, 'pending')],
            w=4,
            thresholds=[['green', null], ['orange', 1000]],
          ),
          p.stat(
            'Dead letters',
            'Dead-lettered messages waiting for an operator.',
            'short',
            [p.target('max(outbox_dead_letter_messages{%s})' % s, 'dead letters')],
            w=4,
            thresholds=[['green', null], ['orange', 1]],
          ),
          p.stat(
            'Replicas up / ready',
            'Targets Prometheus scrapes successfully, and replicas whose database, schema and shutdown checks pass.',
            'short',
            [
              p.target('sum(up{%s})' % s, 'up'),
              p.target('sum(outbox_ready{%s})' % s, 'ready'),
            ],
            w=4,
            thresholds=[['red', null], ['green', 1]],
          ),
        ]),
      ] + [
        p.row('Lane: %s' % lane, [
          p.timeseries(
            'Oldest ready age (%s)' % lane,
            'How long the %s lane\'s oldest message due now has waited to be claimed; paused kinds left out. %s' % [
              lane,
              if lane == 'transactional'
              then 'The stall alert pages when it passes 5 minutes.'
              else 'A bulk run at the pace is old by design; the lane alerts when it sends nothing.',
            ],
            's',
            [
              p.target('max(outbox_lane_oldest_ready_age_seconds{%s,lane="%s"})' % [s, lane], 'oldest ready'),
              p.target('max(outbox_lane_oldest_pending_age_seconds{%s,lane="%s"})' % [s, lane], 'oldest pending'),
            ],
            w=8,
            thresholds=if lane == 'transactional' then [['green', null], ['red', 300]] else null,
          ),
          p.timeseries(
            'Ready messages (%s)' % lane,
            'Messages of the %s lane due now, neither backing off nor leased; paused kinds left out.' % lane,
            'short',
            [p.target('max(outbox_lane_ready_messages{%s,lane="%s"})' % [s, lane], 'ready')],
            w=8,
          ),
          p.timeseries(
            'Sent per second (%s)' % lane,
            'Messages of the %s lane the SMTP server accepted, all replicas together.' % lane,
            'ops',
            [p.target('sum(rate(outbox_lane_sent_total{%s,lane="%s"}[$__rate_interval]))' % [s, lane], 'sent')],
            w=8,
          ),
        ])
        for lane in ['transactional', 'bulk']
      ] + [
        p.row('Throughput and failures', [
          p.timeseries(
            'Sent per second by kind',
            'Messages the SMTP server accepted (delivery=smtp), or only logged because no SMTP server is configured (delivery=log).',
            'ops',
            [p.target('sum by (kind, delivery) (rate(outbox_messages_sent_total{%s}[$__rate_interval]))' % s, '{{kind}} ({{delivery}})')],
            w=8,
          ),
          p.timeseries(
            'Failed attempts per second by kind and class',
            'Transient failures are retried with backoff; permanent ones are dead-lettered.',
            'ops',
            [p.target('sum by (kind, class) (rate(outbox_send_failures_total{%s}[$__rate_interval]))' % s, '{{kind}} {{class}}')],
            w=8,
          ),
          p.timeseries(
            'Failure ratio',
            'Failed attempts over all attempts that reached a decision.',
            'percentunit',
            [p.target(
              'sum(rate(outbox_send_failures_total{%(s)s}[$__rate_interval])) / (sum(rate(outbox_send_failures_total{%(s)s}[$__rate_interval])) + sum(rate(outbox_messages_sent_total{%(s)s}[$__rate_interval])))' % { s: s },
              'failure ratio',
            )],
            w=8,
            thresholds=[['green', null], ['orange', 0.2], ['red', 0.9]],
          ),
          p.timeseries(
            'Dead-lettered per second',
            'Messages given up on, by kind and the class of their last failure.',
            'ops',
            [p.target('sum by (kind, class) (rate(outbox_messages_dead_lettered_total{%s}[$__rate_interval]))' % s, '{{kind}} {{class}}')],
            w=8,
          ),
          p.timeseries(
            'Released per second',
            'Claimed messages given back unsent: at shutdown, near the end of a lease, or during an SMTP outage (no attempt counted).',
            'ops',
            [p.target('sum by (reason) (rate(outbox_messages_released_total{%s}[$__rate_interval]))' % s, '{{reason}}')],
            w=8,
          ),
          p.timeseries(
            'Reclaimed and lost leases',
            "Rows taken over after another replica's lease ran out, and outcomes a stalled replica could not record.",
            'ops',
            [
              p.target('sum(rate(outbox_messages_reclaimed_total{%s}[$__rate_interval]))' % s, 'reclaimed'),
              p.target('sum(rate(outbox_lease_lost_total{%s}[$__rate_interval]))' % s, 'lease lost'),
            ],
            w=8,
          ),
        ]),
      ] + [sloRow(slo) for slo in config.deliverySLOs] + [
        p.row('Latency', [
          p.timeseries(
            'Delivery latency',
            'From when a message fell due to when the SMTP server accepted it.',
            's',
            [quantile(q, 'outbox_delivery_latency_seconds') for q in [0.5, 0.9, 0.99]],
            w=12,
          ),
          p.timeseries(
            'SMTP send duration',
            'One SMTP send, connection included.',
            's',
            [quantile(q, 'outbox_smtp_send_duration_seconds') for q in [0.5, 0.99]],
            w=12,
          ),
        ]),
        p.row('Health', [
          p.timeseries(
            'Heartbeat age',
            "Seconds since each replica's dispatch loop last completed a cycle; the heartbeat alert fires past 5 minutes.",
            's',
            [p.target('time() - max by (instance) (outbox_last_cycle_timestamp_seconds{%s})' % s, '{{instance}}')],
            w=8,
            thresholds=[['green', null], ['red', 300]],
          ),
          p.timeseries(
            'Gauge sample age',
            'Seconds since each replica last sampled the database gauges.',
            's',
            [p.target('time() - max by (instance) (outbox_last_sample_timestamp_seconds{%s})' % s, '{{instance}}')],
            w=8,
            thresholds=[['green', null], ['red', 300]],
          ),
          p.timeseries(
            'Database errors per second',
            'Failed database operations, by operation.',
            'ops',
            [p.target('sum by (operation) (rate(outbox_database_errors_total{%s}[$__rate_interval]))' % s, '{{operation}}')],
            w=8,
          ),
          p.timeseries(
            'SMTP circuit open, relays down',
            "1 while a replica's SMTP circuit breaker is open (no relay takes mail: claiming is paused); and 1 while a relay is down for any replica (passed over for the next, probed every 5 s).",
            'bool',
            [
              p.target('max by (instance, lane) (outbox_smtp_circuit_open{%s})' % s, 'circuit {{instance}} {{lane}}'),
              p.target('1 - min by (relay, lane) (outbox_relay_up{%s})' % s, 'down {{relay}} ({{lane}})'),
            ],
            w=12,
            thresholds=[['green', null], ['red', 1]],
          ),
          p.table(
            'Versions and delivery mode',
            "Each replica's version, and whether it sends over SMTP or only logs (development mode).",
            'short',
            [p.target(
              'max by (instance, version, smtp_enabled) (outbox_build_info{%s})' % s,
              '{{instance}} {{version}} smtp={{smtp_enabled}}',
              { format: 'table', instant: true },
            )],
            w=12,
          ),
        ]),
        p.row('Delivery policy', [
          p.timeseries(
            'Rate limit and throttling',
            "The send rate the replicas share now per route (OUTBOXD_RATE_LIMIT, or OUTBOXD_BULK_RATE_LIMIT for the bulk lane's own relays, cut by throttling; 0: no limit), what was sent, and the relays' throttling replies per second.",
            'ops',
            [
              p.target('max by (lane) (outbox_send_rate_limit_per_second{%s})' % s, 'pace {{lane}} (limit now)'),
              p.target('sum(rate(outbox_messages_sent_total{%s}[$__rate_interval]))' % s, 'sent'),
              p.target('sum(rate(outbox_throttled_total{%s}[$__rate_interval]))' % s, 'throttled'),
            ],
            w=10,
          ),
          p.table(
            'Paused kinds',
            'How long each kind has been paused (outboxd pause); 0: not paused. A paused kind\'s messages wait, out of the lanes\' gauges; a pause over 4 hours warns.',
            's',
            [p.target(
              'max by (kind) (outbox_kind_pause_age_seconds{%s})' % s,
              '{{kind}}',
              { format: 'table', instant: true },
            )],
            w=6,
          ),
          p.timeseries(
            'Expired per second',
            'Messages not sent because their expiry passed first (expires_at or OUTBOXD_EXPIRE_AFTER); not dead letters.',
            'ops',
            [p.target('sum by (kind) (rate(outbox_messages_expired_total{%s}[$__rate_interval]))' % s, '{{kind}}')],
            w=8,
          ),
        ]),
        p.row('Deliverability', [
          p.timeseries(
            'Hard bounces and complaints per email sent (1h)',
            'Hard bounces (SMTP replies that the mailbox does not exist, and provider notifications) and spam complaints, over the emails sent in the last hour. The alerts warn past 5% and 0.1%.',
            'percentunit',
            [
              p.target('sum(increase(outbox_bounces_received_total{%s,type="hard"}[1h])) / sum(increase(outbox_messages_sent_total{%s,delivery="smtp"}[1h]))' % [s, s], 'hard bounces'),
              p.target('sum(increase(outbox_complaints_received_total{%s}[1h])) / sum(increase(outbox_messages_sent_total{%s,delivery="smtp"}[1h]))' % [s, s], 'complaints'),
            ],
            w=8,
            thresholds=[['green', null], ['orange', 0.001], ['red', 0.05]],
          ),
          p.timeseries(
            'Bounces, complaints and unsubscribes received',
            'Per second, by where they came from (smtp: our relay said the mailbox does not exist; ses, postmark, webhook: notifications) and type; and one-click unsubscribes (RFC 8058) by result.',
            'ops',
            [
              p.target('sum by (source, type) (rate(outbox_bounces_received_total{%s}[$__rate_interval]))' % s, 'bounce {{source}} {{type}}'),
              p.target('sum by (source) (rate(outbox_complaints_received_total{%s}[$__rate_interval]))' % s, 'complaint {{source}}'),
              p.target('sum by (result) (rate(outbox_unsubscribes_total{%s}[$__rate_interval]))' % s, 'one-click unsubscribe {{result}}'),
            ],
            w=8,
          ),
          p.timeseries(
            'Suppressed and webhook requests',
            'Messages not sent because every recipient is on the suppression list, by reason; and webhook requests refused (a wrong signature or credentials, a bad body).',
            'ops',
            [
              p.target('sum by (reason, scope) (rate(outbox_messages_suppressed_total{%s}[$__rate_interval]))' % s, 'suppressed {{reason}} ({{scope}})'),
              p.target('sum by (source, result) (rate(outbox_webhook_requests_total{%s,result!="accepted"}[$__rate_interval]))' % s, 'webhook {{source}} {{result}}'),
            ],
            w=8,
          ),
        ]),
      ]),
    },
  },
}
