// Grafana panel builders for outboxd's dashboards: every panel and query uses the
// `datasource` variable, every query the `job` and `instance` variables, rates use
// $__rate_interval, and every panel has a unit and a description (the dashboard test in
// tests/it/observability.rs checks these).
local datasource = { type: 'prometheus', uid: '${datasource}' };

{
  // The matchers every query puts on every metric.
  selector:: 'job=~"$job", instance=~"$instance"',

  // One query; refIds (A, B, ...) are given by the panel from the query's position.
  target(expr, legendFormat, extra={}):: {
    expr: expr,
    legendFormat: legendFormat,
  } + extra,

  // Threshold steps from [[color, value], ...]; the first value is null (the base).
  thresholds(steps):: {
    mode: 'absolute',
    steps: [{ color: s[0], value: s[1] } for s in steps],
  },

  local base(type, title, description, unit, targets, w, h, thresholds) = {
    type: type,
    title: title,
    description: description,
    datasource: datasource,
    targets: [
      { refId: std.char(65 + i), datasource: datasource } + targets[i]
      for i in std.range(0, std.length(targets) - 1)
    ],
    fieldConfig: {
      defaults: { unit: unit } + (
        if thresholds == null then {} else { thresholds: $.thresholds(thresholds) }
      ),
      overrides: [],
    },
    // Width and height in grid units, for layout() below; not part of the panel's JSON.
    w:: w,
    h:: h,
  },

  // A time series; with thresholds, they are drawn as a line and an area.
  timeseries(title, description, unit, targets, w, h=8, thresholds=null)::
    base('timeseries', title, description, unit, targets, w, h, thresholds) {
      fieldConfig+: {
        defaults+: if thresholds == null then {} else {
          custom: { thresholdsStyle: { mode: 'line+area' } },
        },
      },
      options: {
        legend: { displayMode: 'list', placement: 'bottom' },
        tooltip: { mode: 'multi', sort: 'desc' },
      },
    },

  // A single value (the last one), its background coloured by the thresholds.
  stat(title, description, unit, targets, w, h=8, thresholds=null)::
    base('stat', title, description, unit, targets, w, h, thresholds) {
      options: {
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        colorMode: 'background',
        graphMode: 'area',
      },
    },

  // A table of instant query results.
  table(title, description, unit, targets, w, h=8)::
    base('table', title, description, unit, targets, w, h, null) {
      options: { showHeader: true },
    },

  // A row: a title and the panels under it.
  row(title, panels):: { title: title, panels: panels },

  // Lays rows out on Grafana's 24-column grid: each row's panels left to right, wrapping
  // onto a new line when the next one does not fit, and numbers every panel from 1.
  layout(rows)::
    local place(acc, panel) =
      local wrap = acc.x + panel.w > 24;
      local x = if wrap then 0 else acc.x;
      local y = if wrap then acc.y + acc.lineHeight else acc.y;
      acc {
        panels+: [panel { id: acc.id, gridPos: { x: x, y: y, w: panel.w, h: panel.h } }],
        id: acc.id + 1,
        x: x + panel.w,
        y: y,
        lineHeight: if wrap then panel.h else std.max(acc.lineHeight, panel.h),
      };
    local addRow(acc, row) =
      local y = acc.y + acc.lineHeight;
      std.foldl(place, row.panels, acc {
        panels+: [{
          id: acc.id,
          type: 'row',
          title: row.title,
          collapsed: false,
          gridPos: { x: 0, y: y, w: 24, h: 1 },
          panels: [],
        }],
        id: acc.id + 1,
        x: 0,
        y: y + 1,
        lineHeight: 0,
      });
    std.foldl(addRow, rows, { panels: [], id: 1, x: 0, y: 0, lineHeight: 0 }).panels,
}
