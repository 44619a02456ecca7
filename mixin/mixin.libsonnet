// outboxd's monitoring mixin (https://monitoring.mixins.dev layout):
//   prometheusAlerts   the alerting rules (alerts/alerts.libsonnet)
//   grafanaDashboards  the dashboards, by file name (dashboards/dashboards.libsonnet)
// configured by _config (config.libsonnet). mixin/generate.py renders it into the
// committed files; see mixin/README.md.
(import 'config.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
