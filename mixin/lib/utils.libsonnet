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
}
