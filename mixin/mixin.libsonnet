// outboxd's monitoring mixin (https://monitoring.mixins.dev layout):
//   prometheusAlerts   the alerting rules (alerts/alerts.libsonnet) and the delivery
//                      objectives' recording rules and burn-rate alerts (alerts/slo.libsonnet)
//   grafanaDashboards  the dashboards, by file name (dashboards/dashboards.libsonnet)
// configured by _config (config.libsonnet). mixin/generate.py renders it into the
// committed files; see mixin/README.md.
(import 'config.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'alerts/slo.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
