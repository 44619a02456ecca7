// outboxd's monitoring mixin: the configuration. Override any field with
//   (import 'mixin.libsonnet') + { _config+:: { outboxdSelector: 'job="mail-dispatcher"' } }
// or `python3 mixin/generate.py --selector 'job="mail-dispatcher"' --out DIR`.
local utils = import 'lib/utils.libsonnet';

{
  _config+:: {
    // The label matchers that select outboxd's scrape targets, in every alert. With the
    // Kubernetes base in deploy/kubernetes, the ServiceMonitor's jobLabel makes it job="outboxd".
    outboxdSelector: 'job="outboxd"',

    // The selector's name="value" matchers as labels: set on OutboxDispatcherDown, whose
    // absent() has no series to take them from (Alertmanager's inhibit rules match on job).
    outboxdSelectorLabels: utils.equalityLabels(self.outboxdSelector),

    // The labels every alert aggregates by: one alert per outboxd Deployment. With one
    // Deployment per application database, each in its namespace, `job` alone would merge
    // them (the ServiceMonitor names every job "outboxd").
    groupLabels: 'namespace, job',

    // The dashboard's default `job` (the variable still lists every job with outboxd's metrics).
    dashboardJobDefault: std.get(self.outboxdSelectorLabels, 'job', ''),

    // Where each alert's runbook_url points: the alert's name, lower-cased, fills the %s.
    runbookURLPattern: 'https://github.com/outboxd/outboxd/blob/main/alerts/RUNBOOK.md#%s',
    runbookURL: 'https://github.com/outboxd/outboxd/blob/main/alerts/RUNBOOK.md',

    dashboardUid: 'outboxd-overview',
    dashboardTags: ['outboxd', 'email', 'outbox'],

    // Thresholds. The `for` durations and the texts that name a duration stay in
    // alerts/alerts.libsonnet, beside the reasoning that chose them.
    stalledReadyAgeSeconds: 300,  // OutboxDispatcherStalled: a due message unclaimed this long
    heartbeatStaleSeconds: 180,  // OutboxHeartbeatStale: no dispatch cycle for this long
    sendFailingRatio: 0.9,  // OutboxSendFailing: share of attempts failing over 3m
    sendFailingMinRate: 0.05,  // ... at more than this many failures a second
    claimsFailingPendingAgeSeconds: 60,  // OutboxClaimsFailing: the oldest pending message is older
    backlogReadyAgeSeconds: 30,  // OutboxBacklogGrowing: the oldest ready message waits longer
    rescuesPer15m: 10,  // OutboxRescuesSpiking: rows taken over after their lease in 15m
    throughputCollapsedReadyAgeSeconds: 60,  // OutboxThroughputCollapsed: messages waiting this long
    sendPaceLowShare: 0.25,  // OutboxSendPaceLow: the pace under this share of the last hour's best 5m send rate
    sendPaceLowReadyAgeSeconds: 60,  // ... while a ready message waits this long
    sendFailuresHighRatio: 0.2,  // OutboxSendFailuresHigh: share of attempts failing over 15m
    sendFailuresHighMinCount: 10,  // ... and more failures than this in 15m
    gaugesStaleSeconds: 300,  // OutboxGaugesStale: no sample of the database gauges for this long
    vacuumBlockedSeconds: 1800,  // OutboxVacuumBlocked: a transaction open in the database this long
    hardBounceRatio: 0.05,  // OutboxHardBounceRateHigh: hard bounces per email sent over 1h
    hardBounceRatioText: '5%',
    complaintRatio: 0.001,  // OutboxComplaintRateHigh: spam complaints per email sent over 1h
    complaintRatioText: '0.1%',
    deliverabilityMinSent: 100,  // ... both only once this many emails were sent in the hour
    kindPausedWarningSeconds: 4 * 3600,  // OutboxKindPausedLong: a kind paused this long

    // Delivery objectives (alerts/slo.libsonnet): each becomes recording rules, two burn-rate
    // alerts labelled slo="<name>", and a dashboard row. The SLI is outbox_delivery_latency_seconds
    // (falling due to accepted by the relay) of the objective's lane; thresholdSeconds must be
    // one of its buckets (a test checks every objective here against outboxd's /metrics).
    deliverySLOs: [
      {
        name: 'transactional-60s',
        lane: 'transactional',
        objective: 0.99,
        thresholdSeconds: 60,
        periodDays: 30,
      },
    ],
    // The burn-rate alerts' window pairs: a pair fires when both windows spend the budget
    // faster than `factor` times the rate that would spend it exactly over the period.
    sloBurnFast: [{ long: '15m', short: '5m', factor: 14.4 }, { long: '6h', short: '30m', factor: 6 }],
    sloBurnFastFor: '2m',
    sloBurnSlow: [{ long: '1d', short: '2h', factor: 3 }, { long: '3d', short: '6h', factor: 1 }],
    sloBurnSlowFor: '15m',
    sloMinMessages: 20,  // a pair's long window needs this many messages of the lane to fire
  },
}
