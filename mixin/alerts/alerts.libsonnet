// outboxd's alerting rules. Each rule carries a static summary, a templated description and
// (added below, from _config.runbookURLPattern) a runbook_url: every alert needs a section in
// alerts/RUNBOOK.md and a scenario in tests/alerts/outboxd.rules.test.yml.
//
// A rule's hidden `comment::` is not part of the mixin's output: mixin/generate.py writes it
// as a YAML comment above the rule in alerts/outboxd.rules.yml and the PrometheusRule.
//
// To add an alert: append an object to `rules` below (selector and thresholds from
// $._config), run `python3 mixin/generate.py`, add its runbook section and unit test.
{
  local config = $._config,
  local withRunbook(rule) = rule {
    annotations+: { runbook_url: config.runbookURLPattern % std.asciiLower(rule.alert) },
  },

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'outboxd',
        rules: std.map(withRunbook, [
          {
            alert: 'OutboxDispatcherDown',
            expr: 'absent(up{%(outboxdSelector)s} == 1)' % config,
            'for': '5m',
            labels: { severity: 'critical' } + config.outboxdSelectorLabels,
            annotations: {
              summary: 'No outboxd replica is up.',
              description: (
                if std.objectHas(config.outboxdSelectorLabels, 'job')
                then 'No target of job "%s"' % config.outboxdSelectorLabels.job
                else 'No target matching {%s}' % config.outboxdSelector
              ) + ' has been scraped successfully for 5 minutes; no email is being delivered.',
            },
          },
          {
            comment:: |||
              The oldest message that is due now and neither backing off nor leased: it grows only
              when nothing is claiming. A message backing off after a temporary failure is not
              "ready", so it cannot fire this while the rest flow (see the runbook). Pages about
              9 minutes after claiming stops; a healthy burst drained in 3 minutes stays under.
              The transactional lane's: a bulk run at the pace (OUTBOXD_BULK_KINDS) is old by
              design, and a paused kind is left out of the lanes' gauges.
            |||,
            alert: 'OutboxDispatcherStalled',
            expr: 'max by (%(groupLabels)s) (outbox_lane_oldest_ready_age_seconds{%(outboxdSelector)s,lane="transactional"}) > %(stalledReadyAgeSeconds)g' % config,
            'for': '3m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'Outbox messages are due but nothing is sending them.',
              description: 'The oldest ready transactional message of {{ $labels.job }} has waited {{ $value | humanizeDuration }} to be claimed; delivery has stopped.',
            },
          },
          {
            comment:: |||
              A cycle ends at least every poll interval, and a batch within its lease: three
              minutes without one is a hung loop. Pages about 6 minutes after it hangs.
            |||,
            alert: 'OutboxHeartbeatStale',
            expr: |||
              (time() - max by (job, instance) (max_over_time(outbox_last_cycle_timestamp_seconds{%(outboxdSelector)s}[5m]))) > %(heartbeatStaleSeconds)g
              and on (job, instance) max by (job, instance) (max_over_time(up{%(outboxdSelector)s}[5m])) == 1
            ||| % config,
            'for': '2m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'An outboxd dispatch loop has stopped cycling.',
              description: 'The dispatch loop of {{ $labels.instance }} has not completed a cycle for {{ $value | humanizeDuration }} while the process is up.',
            },
          },
          {
            alert: 'OutboxSmtpUnreachable',
            expr: 'max by (%(groupLabels)s, lane) (min_over_time(outbox_smtp_circuit_open{%(outboxdSelector)s}[3m])) == 1' % config,
            'for': '3m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'outboxd cannot reach its SMTP server.',
              description: 'The SMTP circuit breaker of {{ $labels.job }} has stayed open for over 5 minutes: no relay of the {{ $labels.lane }} lane, fallbacks included, takes mail; that lane is not claimed and its email is piling up.',
            },
          },
          {
            comment:: |||
              A fallback relay (OUTBOXD_SMTP_FALLBACK_URLS) has carried mail in every 5-minute
              window for 10 minutes: the relays before it are down (outbox_relay_up says which).
              Nothing is lost; a warning, because the fallback may be slower, dearer or less
              trusted. OutboxSmtpUnreachable pages only when every relay of a lane is down.
            |||,
            alert: 'OutboxRelayFailover',
            expr: 'sum by (%(groupLabels)s, relay) (increase(outbox_relay_sent_total{%(outboxdSelector)s,fallback="true"}[5m])) > 0' % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'outboxd is sending through a fallback relay.',
              description: '{{ $labels.job }} sent {{ $value | humanize }} messages through the fallback relay {{ $labels.relay }} in the last 5 minutes, and has for 10 minutes: the relay before it is down (outbox_relay_up).',
            },
          },
          {
            comment:: |||
              The delivery callbacks (OUTBOXD_CALLBACK_URL) have stopped flowing: the oldest
              one still to send happened over 15 minutes ago, for 10 minutes. Nothing is lost
              (they wait in outbox_callbacks, retried until OUTBOXD_CALLBACK_MAX_AGE); a
              warning, because the application's view of its emails falls behind. max, not
              sum: every replica reads the same table.
            |||,
            alert: 'OutboxCallbacksStalled',
            expr: 'max by (%(groupLabels)s) (outbox_callback_oldest_age_seconds{%(outboxdSelector)s}) > 900' % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Delivery callbacks to the application have stopped flowing.',
              description: "{{ $labels.job }}: the oldest callback still to send happened {{ $value | humanizeDuration }} ago: the application's endpoint (OUTBOXD_CALLBACK_URL) is not taking them (outbox_callback_failures_total says why).",
            },
          },
          {
            comment:: |||
              Nearly every attempt failing (a server deferring everything), at a volume one
              stubborn message cannot reach. Pages about 6 minutes after the failures start.
            |||,
            alert: 'OutboxSendFailing',
            expr: |||
              (
                sum by (%(groupLabels)s) (rate(outbox_send_failures_total{%(outboxdSelector)s}[3m]))
                /
                (sum by (%(groupLabels)s) (rate(outbox_send_failures_total{%(outboxdSelector)s}[3m]))
                  + sum by (%(groupLabels)s) (rate(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[3m])))
              ) > %(sendFailingRatio)g
              and sum by (%(groupLabels)s) (rate(outbox_send_failures_total{%(outboxdSelector)s}[3m])) > %(sendFailingMinRate)g
            ||| % config,
            'for': '3m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'Nearly every outbox send is failing.',
              description: '{{ $value | humanizePercentage }} of the send attempts of {{ $labels.job }} failed over the last 3 minutes.',
            },
          },
          {
            comment:: |||
              Claims failing while nothing is sent and messages are due: the rows may stay leased
              by the failed claims, so no message looks "ready" and the stall alert cannot see it.
              Pages about 6 minutes after the claims start failing.
            |||,
            alert: 'OutboxClaimsFailing',
            expr: |||
              sum by (%(groupLabels)s) (increase(outbox_database_errors_total{%(outboxdSelector)s,operation="claim"}[3m])) > 0
              and on (%(groupLabels)s) sum by (%(groupLabels)s) (increase(outbox_messages_sent_total{%(outboxdSelector)s}[3m])) == 0
              and on (%(groupLabels)s) max by (%(groupLabels)s) (outbox_oldest_pending_age_seconds{%(outboxdSelector)s}) > %(claimsFailingPendingAgeSeconds)g
            ||| % config,
            'for': '3m',
            labels: { severity: 'critical' },
            annotations: {
              summary: "outboxd's claims fail and nothing is sent.",
              description: 'The claims of {{ $labels.job }} have been failing with nothing sent for 3 minutes while messages are due.',
            },
          },
          {
            comment:: |||
              More arrives than is sent: the backlog grows and its oldest ready message waits.
              A burst that drains shrinks instead. Pages about 7 minutes after the drain falls
              behind by half; sooner the further behind.
            |||,
            alert: 'OutboxBacklogGrowing',
            expr: |||
              max by (%(groupLabels)s) (outbox_lane_oldest_ready_age_seconds{%(outboxdSelector)s,lane="transactional"}) > %(backlogReadyAgeSeconds)g
              and on (%(groupLabels)s) max by (%(groupLabels)s) (deriv(outbox_lane_ready_messages{%(outboxdSelector)s,lane="transactional"}[5m])) > 0
            ||| % config,
            'for': '4m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'The outbox backlog grows faster than outboxd sends.',
              description: 'The backlog of {{ $labels.job }} keeps growing; its oldest ready message has waited {{ $value | humanizeDuration }}.',
            },
          },
          {
            comment:: |||
              Rows taken over after their claimer's lease ran out: replicas crashing, stalling or
              losing their database mid-batch (each such row may have been sent twice).
            |||,
            alert: 'OutboxRescuesSpiking',
            expr: 'sum by (%(groupLabels)s) (increase(outbox_messages_reclaimed_total{%(outboxdSelector)s}[15m])) > %(rescuesPer15m)g' % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'outboxd keeps taking over rows whose claimer vanished.',
              description: '{{ $value | humanize }} rows of {{ $labels.job }} were taken over after their lease ran out in the last 15 minutes.',
            },
          },
          {
            comment:: |||
              Sends fell to a fifth of the previous hour's pace while messages wait: a throttling
              relay, a slow database, replicas gone.
            |||,
            alert: 'OutboxThroughputCollapsed',
            expr: |||
              sum by (%(groupLabels)s) (rate(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[10m]))
                < 0.2 * sum by (%(groupLabels)s) (rate(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[1h] offset 10m))
              and on (%(groupLabels)s) max by (%(groupLabels)s) (outbox_lane_oldest_ready_age_seconds{%(outboxdSelector)s,lane="transactional"}) > %(throughputCollapsedReadyAgeSeconds)g
            ||| % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'outboxd sends far fewer messages than an hour ago while messages wait.',
              description: '{{ $labels.job }} sends at less than a fifth of its pace of the hour before, with messages waiting.',
            },
          },
          {
            alert: 'OutboxSendFailuresHigh',
            expr: |||
              (
                sum by (%(groupLabels)s) (rate(outbox_send_failures_total{%(outboxdSelector)s}[15m]))
                /
                (sum by (%(groupLabels)s) (rate(outbox_send_failures_total{%(outboxdSelector)s}[15m]))
                  + sum by (%(groupLabels)s) (rate(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[15m])))
              ) > %(sendFailuresHighRatio)g
              and sum by (%(groupLabels)s) (increase(outbox_send_failures_total{%(outboxdSelector)s}[15m])) > %(sendFailuresHighMinCount)g
            ||| % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Many outbox sends are failing.',
              description: '{{ $value | humanizePercentage }} of the send attempts of {{ $labels.job }} failed over the last 15 minutes.',
            },
          },
          {
            comment:: |||
              Throttling replies cost no attempts and slow the shared pace; persisting, they mean
              the configured rate is above what the relay allows.
            |||,
            alert: 'OutboxRelayThrottling',
            expr: 'sum by (%(groupLabels)s) (increase(outbox_throttled_total{%(outboxdSelector)s}[5m])) > 0' % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The SMTP relay keeps throttling outboxd.',
              description: '{{ $labels.job }} got {{ $value | humanize }} throttling replies in the last 5 minutes, and throttling has not stopped for 15 minutes; the pace stays below OUTBOXD_RATE_LIMIT.',
            },
          },
          {
            comment:: |||
              The pace (OUTBOXD_RATE_LIMIT cut by throttling, or the pace found without one) stays
              far under what the relay took within the hour, while messages wait: the push-back
              has ended and the pace has not grown back. outboxd forgets a found pace 20 s after
              the relay's last throttling reply; this is the net under that.
            |||,
            alert: 'OutboxSendPaceLow',
            expr: |||
              max by (%(groupLabels)s) (outbox_send_rate_limit_per_second{%(outboxdSelector)s}) > 0
              and on (%(groupLabels)s)
                max by (%(groupLabels)s) (outbox_send_rate_limit_per_second{%(outboxdSelector)s})
                  < %(sendPaceLowShare)g * max by (%(groupLabels)s) (max_over_time(sum by (%(groupLabels)s) (rate(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[5m]))[1h:1m]))
              and on (%(groupLabels)s)
                max by (%(groupLabels)s) (outbox_lane_oldest_ready_age_seconds{%(outboxdSelector)s}) > %(sendPaceLowReadyAgeSeconds)g
            ||| % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The send pace stays far under what the relay accepted within the hour.',
              description: '{{ $labels.job }} paces its sends at {{ $value | humanize }} a second, under a quarter of what the relay accepted within the last hour, while messages wait.',
            },
          },
          {
            // Over an hour, with a floor of sends so that one bounce among a handful of
            // emails pages nobody. Mailbox providers start to junk a sender past a few per
            // cent of bounces and a tenth of a per cent of complaints.
            alert: 'OutboxHardBounceRateHigh',
            expr: |||
              sum by (%(groupLabels)s) (increase(outbox_bounces_received_total{%(outboxdSelector)s,type="hard"}[1h]))
                / sum by (%(groupLabels)s) (increase(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[1h]))
                > %(hardBounceRatio)s
              and sum by (%(groupLabels)s) (increase(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[1h])) >= %(deliverabilityMinSent)s
            ||| % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Many outbox emails bounce hard: the sender reputation is at risk.',
              description: '{{ $labels.job }}: hard bounces were {{ $value | humanizePercentage }} of the emails sent in the last hour (threshold %(hardBounceRatioText)s).' % config,
            },
          },
          {
            alert: 'OutboxComplaintRateHigh',
            expr: |||
              sum by (%(groupLabels)s) (increase(outbox_complaints_received_total{%(outboxdSelector)s}[1h]))
                / sum by (%(groupLabels)s) (increase(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[1h]))
                > %(complaintRatio)s
              and sum by (%(groupLabels)s) (increase(outbox_messages_sent_total{%(outboxdSelector)s,delivery="smtp"}[1h])) >= %(deliverabilityMinSent)s
            ||| % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Recipients mark outbox emails as spam.',
              description: '{{ $labels.job }}: spam complaints were {{ $value | humanizePercentage }} of the emails sent in the last hour (threshold %(complaintRatioText)s).' % config,
            },
          },
          {
            alert: 'OutboxDeadLetters',
            expr: 'max by (%(groupLabels)s) (max_over_time(outbox_dead_letter_messages{%(outboxdSelector)s}[15m])) > 0' % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Outbox messages were dead-lettered.',
              description: '{{ $labels.job }} holds {{ $value }} dead-lettered messages that will not be sent unless retried.',
            },
          },
          {
            alert: 'OutboxOldestPendingHigh',
            // The summary says "over an hour": change both together.
            expr: 'max by (%(groupLabels)s) (min_over_time(outbox_lane_oldest_pending_age_seconds{%(outboxdSelector)s,lane="transactional"}[10m])) > 3600' % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'An outbox message has been pending for over an hour.',
              description: 'The oldest pending transactional message of {{ $labels.job }} fell due {{ $value | humanizeDuration }} ago; it keeps failing or waiting.',
            },
          },
          {
            comment:: |||
              A bulk lane (OUTBOXD_BULK_KINDS) is expected to wait: a newsletter at the relay's
              pace takes hours. It has stopped when it has had due messages for 15 minutes and
              sent none: the transactional lane takes the whole rate limit, or every bulk
              message fails. Warns about 20 minutes after the last bulk send.
            |||,
            alert: 'OutboxBulkLaneStalled',
            expr: |||
              max by (%(groupLabels)s) (min_over_time(outbox_lane_ready_messages{%(outboxdSelector)s,lane="bulk"}[15m])) > 0
              and on (%(groupLabels)s) sum by (%(groupLabels)s) (increase(outbox_lane_sent_total{%(outboxdSelector)s,lane="bulk"}[15m])) == 0
            ||| % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The bulk lane has due messages and sends none.',
              description: '{{ $labels.job }} has had {{ $value }} due bulk messages for 20 minutes and sent none of them.',
            },
          },
          {
            comment:: |||
              outboxd paused a kind by itself (OUTBOXD_AUTO_PAUSE_KINDS): its recipients
              bounced or complained past a threshold, as SES would suspend the account. It
              stays paused until an operator resumes it, so it pages at once.
            |||,
            alert: 'OutboxKindAutoPaused',
            expr: 'max by (%(groupLabels)s, kind) (outbox_kind_auto_paused{%(outboxdSelector)s}) == 1' % config,
            'for': '0m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'outboxd paused a kind on its bounces or complaints.',
              description: 'Kind {{ $labels.kind }} of {{ $labels.job }} was paused because its latest sends bounced or drew complaints past the threshold; its messages wait until it is resumed.',
            },
          },
          {
            comment:: |||
              A paused kind (outboxd pause) pages nobody: its backlog is out of the lanes'
              gauges. A pause forgotten for longer than kindPausedWarningSeconds warns, with
              the kind in its labels.
            |||,
            alert: 'OutboxKindPausedLong',
            expr: 'max by (%(groupLabels)s, kind) (outbox_kind_pause_age_seconds{%(outboxdSelector)s}) > %(kindPausedWarningSeconds)g' % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A kind has been paused for a long time.',
              description: 'Kind {{ $labels.kind }} of {{ $labels.job }} has been paused for {{ $value | humanizeDuration }}; its messages wait until it is resumed.',
            },
          },
          {
            alert: 'OutboxDeliveryDisabled',
            expr: 'max by (job, instance) (max_over_time(outbox_build_info{%(outboxdSelector)s,smtp_enabled="false"}[10m])) == 1' % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'An outboxd replica runs without SMTP and only logs email.',
              description: '{{ $labels.instance }} has no OUTBOXD_SMTP_URL: it marks messages dispatched without sending them.',
            },
          },
          {
            comment:: |||
              A replica's own NOTIFY has not come back for 15 minutes: a transaction pooler is in
              the way of its LISTEN (or it does not LISTEN at all behind one). Commits still go
              out, found by a poll every 2 s instead of within milliseconds: a ticket, not a page.
            |||,
            alert: 'OutboxNotificationsNotWorking',
            expr: 'max by (job, instance) (outbox_notifications_working{%(outboxdSelector)s}) == 0' % config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: "outboxd's notifications do not come back; it polls every 2 seconds instead.",
              description: '{{ $labels.instance }} has not received its own NOTIFY for 15 minutes: commits go out within seconds, not milliseconds. Set OUTBOXD_LISTEN_DATABASE_URL to a direct connection.',
            },
          },
          {
            comment:: |||
              The replica cannot reach its database (readiness fails on it: credentials rotated,
              a network policy, the server gone) while its process is up. Other replicas may
              still deliver, but this one's share of the work stops. Pages about 9 minutes after
              it starts; a database restart of a minute or two pages nobody.
            |||,
            alert: 'OutboxDatabaseUnreachable',
            expr: |||
              max by (job, instance) (outbox_ready{%(outboxdSelector)s}) == 0
              and on (job, instance) sum by (job, instance) (increase(outbox_database_errors_total{%(outboxdSelector)s,operation="readiness"}[5m])) > 0
            ||| % config,
            'for': '8m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'An outboxd replica cannot reach its database.',
              description: '{{ $labels.instance }} has failed its database readiness check for 8 minutes: it claims and records nothing.',
            },
          },
          {
            comment:: |||
              A transaction open in the database for half an hour keeps vacuum from removing the
              dead entries of every row sent since it began: claims stay flat (the claim floor),
              but the table and its indexes grow, and the gauges' sample slows down.
            |||,
            alert: 'OutboxVacuumBlocked',
            expr: 'max by (job, instance) (outbox_database_oldest_transaction_age_seconds{%(outboxdSelector)s}) > %(vacuumBlockedSeconds)g' % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: "A transaction left open keeps vacuum from cleaning outboxd's table.",
              description: 'The oldest transaction in the database of {{ $labels.instance }} has been open for {{ $value | humanizeDuration }}.',
            },
          },
          {
            alert: 'OutboxDatabaseErrors',
            expr: 'sum by (job, instance) (rate(outbox_database_errors_total{%(outboxdSelector)s}[5m])) > 0' % config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'outboxd keeps failing to reach its database.',
              description: '{{ $labels.instance }} has had database errors for 10 minutes ({{ $value | humanize }} per second).',
            },
          },
          {
            alert: 'OutboxGaugesStale',
            expr: |||
              (time() - max by (job, instance) (max_over_time(outbox_last_sample_timestamp_seconds{%(outboxdSelector)s}[5m]))) > %(gaugesStaleSeconds)g
              and on (job, instance) max by (job, instance) (max_over_time(up{%(outboxdSelector)s}[5m])) == 1
            ||| % config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: "outboxd's database gauges are stale.",
              description: '{{ $labels.instance }} has not sampled the outbox for {{ $value | humanizeDuration }}; the pending and age gauges show old values.',
            },
          },
        ]),
      },
    ],
  },
}
