// Delivery objectives (SLOs) as multi-window, multi-burn-rate alerts (the SRE workbook,
// "Alerting on SLOs"). Each objective in _config.deliverySLOs becomes recording rules, the
// share of its lane's messages slower than its threshold over each window an alert reads,
// and one OutboxDeliverySLOBurnFast and one OutboxDeliverySLOBurnSlow rule labelled
// slo="<name>". The SLI is outbox_delivery_latency_seconds: due to accepted by the relay.
local utils = import '../lib/utils.libsonnet';
{
  local cfg = $._config,
  local withRunbook(rule) = rule {
    annotations+: { runbook_url: cfg.runbookURLPattern % std.asciiLower(rule.alert) },
  },

  // Every window the burn-rate pairs read, shortest first.
  local windows = std.sort(
    std.set([w for pair in cfg.sloBurnFast + cfg.sloBurnSlow for w in [pair.long, pair.short]]),
    utils.seconds,
  ),

  local selector(slo) = '%s,lane="%s"' % [cfg.outboxdSelector, slo.lane],
  // The recorded series keep the labels the alerts group by and those the selector matches
  // on equality, so that the alerts can select them too: two outboxd deployments rendered
  // with their own selectors into one Prometheus each alert on their own series only.
  local selectorLabels = cfg.outboxdSelectorLabels,
  local by = std.join(', ', std.set(
    [std.stripChars(l, ' ') for l in std.split(cfg.groupLabels, ',')] + std.objectFields(selectorLabels)
  )),
  local recorded(slo) = std.join(',', ['%s="%s"' % [k, selectorLabels[k]] for k in std.objectFields(selectorLabels)] + ['slo="%s"' % slo.name]),
  local ratioRecord(window) = 'outbox_slo:delivery_slow:ratio_rate%s' % window,
  local messagesRecord(window) = 'outbox_slo:delivery_messages:rate%s' % window,
  local on = 'on (%s, slo)' % by,

  local records(slo) = std.flattenArrays([
    [
      {
        record: messagesRecord(w),
        expr: 'sum by (%s) (rate(outbox_delivery_latency_seconds_count{%s}[%s]))' % [by, selector(slo), w],
        labels: { slo: slo.name },
      },
      {
        record: ratioRecord(w),
        expr: |||
          1 - (
            sum by (%(by)s) (rate(outbox_delivery_latency_seconds_bucket{%(sel)s,%(le)s}[%(w)s]))
            /
            sum by (%(by)s) (rate(outbox_delivery_latency_seconds_count{%(sel)s}[%(w)s]))
          )
        ||| % { by: by, sel: selector(slo), le: utils.leMatcher(slo.thresholdSeconds), w: w },
        labels: { slo: slo.name },
      },
    ]
    for w in windows
  ]),

  // One pair: both windows burn faster than `factor` times the budget, and the long one saw
  // enough messages for a share to mean something. Its value is the time the whole
  // period's budget lasts at the long window's burn rate.
  local pairExpr(slo, pair) =
    local budget = 1 - slo.objective;
    local match = '{%s}' % recorded(slo);
    |||
      round(%(lasts)g / %(long)s%(m)s)
        and %(on)s %(long)s%(m)s > %(threshold)g
        and %(on)s %(short)s%(m)s > %(threshold)g
        and %(on)s %(messages)s%(m)s * %(longSeconds)d >= %(min)d
    ||| % {
      lasts: slo.periodDays * 86400 * budget,
      long: ratioRecord(pair.long),
      short: ratioRecord(pair.short),
      messages: messagesRecord(pair.long),
      longSeconds: utils.seconds(pair.long),
      threshold: pair.factor * budget,
      min: cfg.sloMinMessages,
      m: match,
      on: on,
    },

  local pairsText(pairs) = std.join(' or ', [
    '%s and %s at %gx' % [p.long, p.short, p.factor]
    for p in pairs
  ]),

  local alert(slo, name, pairs, severity, forDuration, summary, comment) = withRunbook({
    comment:: comment,
    alert: name,
    expr: std.join('or\n', ['(\n' + std.join('', ['  ' + l + '\n' for l in std.split(std.stripChars(pairExpr(slo, p), '\n'), '\n')]) + ')\n' for p in pairs]),
    'for': forDuration,
    labels: { severity: severity },
    annotations: {
      summary: summary,
      description: (
        '{{ $labels.job }} misses objective %(slo)s (%(text)s): more of its messages take '
        + 'longer than %(threshold)g s than the objective allows (windows %(pairs)s). At this '
        + 'rate the whole %(days)d-day error budget is gone in {{ $value | humanizeDuration }}.'
      ) % {
        slo: slo.name,
        text: utils.sloText(slo),
        threshold: slo.thresholdSeconds,
        pairs: pairsText(pairs),
        days: slo.periodDays,
      },
    },
  }),

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'outboxd-slo',
        rules: std.flattenArrays([records(slo) for slo in cfg.deliverySLOs]) + std.flattenArrays([
          [
            alert(
              slo, 'OutboxDeliverySLOBurnFast', cfg.sloBurnFast, 'critical', cfg.sloBurnFastFor,
              'The %s lane is late often enough to spend its delivery budget within days.' % slo.lane,
              |||
                Pages when the budget burns fast: a pair fires when its long window burns at the
                factor (a sustained change) and its short one still does (it is still happening,
                so the alert resolves minutes after recovery). 15m/5m at 14.4x, not the
                workbook's 1h/5m: 20% of transactional email late must page within 15 minutes,
                and an hour's window reaches 14.4x of a 1% budget only after 43 minutes of it.
                6h/30m at 6x catches a burn too slow for that (10% of the budget in 6 hours).
                A long window with fewer than sloMinMessages messages never fires.
              |||,
            ),
            alert(
              slo, 'OutboxDeliverySLOBurnSlow', cfg.sloBurnSlow, 'warning', cfg.sloBurnSlowFor,
              'The %s lane is late often enough to miss its delivery objective this period.' % slo.lane,
              |||
                Opens a ticket when the budget burns slowly: 1d/2h at 3x spends 10% of a 30-day
                budget in a day, 3d/6h at 1x the whole of it by the period's end.
              |||,
            ),
          ]
          for slo in cfg.deliverySLOs
        ]),
      },
    ],
  },
}
