// Helpers shared by the mixin's alerts and dashboards.
{
  // The equality matchers (name="value") of a selector such as 'job="outboxd",namespace="mail"',
  // as an object of labels: {job: 'outboxd', namespace: 'mail'}. Regex and negative matchers
  // are left out, and so is a matcher whose value holds a comma.
  equalityLabels(selector)::
    local matcher(text) =
      local parts = std.splitLimit(std.stripChars(text, ' '), '=', 1);
      local name = if std.length(parts) == 2 then std.stripChars(parts[0], ' ') else '';
      local value = if std.length(parts) == 2 then std.stripChars(parts[1], ' ') else '';
      if name != '' && !std.endsWith(name, '!') && std.length(value) >= 2
         && std.startsWith(value, '"') && std.endsWith(value, '"')
      then { [name]: value[1:std.length(value) - 1] }
      else {};
    std.foldl(function(labels, text) labels + matcher(text), std.split(selector, ','), {}),

  // The `le` matcher of a delivery objective's threshold bucket, as Prometheus 2 ("60") and
  // Prometheus 3 ("60.0", its normalised form) write it.
  leMatcher(threshold)::
    if threshold == std.floor(threshold)
    then 'le=~"%d(\\\\.0)?"' % threshold
    else 'le="%g"' % threshold,

  // A delivery objective in words: "99% of transactional messages accepted within 60 s of
  // falling due, over 30 days".
  sloText(slo)::
    '%g%% of %s messages accepted within %g s of falling due, over %d days' % [
      slo.objective * 100,
      slo.lane,
      slo.thresholdSeconds,
      slo.periodDays,
    ],

  // A window ('15m', '6h', '1d') in seconds.
  seconds(window)::
    local unit = window[std.length(window) - 1];
    std.parseInt(window[0:std.length(window) - 1]) * { s: 1, m: 60, h: 3600, d: 86400 }[unit],
}
