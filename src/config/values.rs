//! The values options take: durations within bounds, sizes in bytes, retention, and the
//! admin surface's host names; each refused with a message that shows the syntax.

use std::time::Duration;

use crate::background::retention::Retention;

/// A domain name as outboxd writes one (letters, digits, `.` and `-`), or why not.
pub fn domain_name(domain: &str) -> Result<String, String> {
    let valid = !domain.is_empty()
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
    if valid {
        Ok(domain.to_owned())
    } else {
        Err(format!("{domain:?}: expected a domain name"))
    }
}

/// `15s`, `1m30s`, `500ms`, `1h`: humantime's syntax, with a message that shows it.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("{e}; expected a duration such as 15s, 500ms, 2m or 1h"))
}

/// A size in bytes: `4MiB`, `500kB`, `1048576`; from 1 KiB to 100 MiB.
pub fn parse_bytes(value: &str) -> Result<usize, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let unit_bytes: usize = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1000,
        "KiB" => 1024,
        "MB" => 1_000_000,
        "MiB" => 1024 * 1024,
        other => return Err(format!("unknown unit {other:?}: use B, kB, KiB, MB or MiB")),
    };
    let bytes = number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(|| format!("{value:?} is not a size such as 4MiB or 500kB"))?;
    if !(1024..=100 * 1024 * 1024).contains(&bytes) {
        return Err(format!("{value} is out of range: from 1KiB to 100MiB"));
    }
    Ok(bytes)
}

/// Upper bounds of durations, in seconds: far beyond any sensible setting, and far inside
/// what timers, clocks and PostgreSQL intervals can represent.
pub(super) const TEN_MINUTES: u64 = 600;
pub(super) const SECOND: u64 = 1;
pub(super) const HOUR: u64 = 3600;
pub(super) const DAY: u64 = 24 * HOUR;
pub(super) const WEEK: u64 = 7 * DAY;
pub(super) const MONTH: u64 = 30 * DAY;
pub(super) const TEN_YEARS: u64 = 3650 * DAY;

/// [`parse_duration`], refusing anything longer than `MAX_SECONDS`.
pub fn parse_duration_up_to<const MAX_SECONDS: u64>(value: &str) -> Result<Duration, String> {
    let duration = parse_duration(value)?;
    let max = Duration::from_secs(MAX_SECONDS);
    if duration > max {
        return Err(format!(
            "{} is too long: at most {}",
            value.trim(),
            humantime::format_duration(max)
        ));
    }
    Ok(duration)
}

/// `0` keeps rows forever; anything else is a duration such as `7d` or `12h`.
pub fn parse_retention(value: &str) -> Result<Retention, String> {
    match value.trim() {
        "0" | "0s" => Ok(Retention::Keep),
        other => parse_duration_up_to::<TEN_YEARS>(other).map(Retention::For),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_zero_keeps_rows_forever() {
        assert_eq!(parse_retention("0"), Ok(Retention::Keep));
        assert_eq!(
            parse_retention("7d"),
            Ok(Retention::For(Duration::from_secs(7 * 86400)))
        );
        assert!(parse_retention("a week").is_err());
    }

    #[test]
    fn absurd_durations_are_refused_with_the_bound() {
        let refused = parse_duration_up_to::<HOUR>("18446744073709551615s").unwrap_err();
        assert!(refused.contains("at most 1h"), "{refused}");
        assert!(parse_retention("300000y").unwrap_err().contains("too long"));
        assert_eq!(
            parse_duration_up_to::<HOUR>("1h"),
            Ok(Duration::from_secs(3600))
        );
    }

    #[test]
    fn sizes_take_units_and_stay_in_range() {
        assert_eq!(parse_bytes("4MiB"), Ok(4 * 1024 * 1024));
        assert_eq!(parse_bytes("500kB"), Ok(500_000));
        assert_eq!(parse_bytes("2048"), Ok(2048));
        for bad in [
            "",
            "MiB",
            "4 GiB",
            "1",
            "1000MiB",
            "99999999999999999999999",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_use_humantime_syntax() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("15").unwrap_err().contains("such as 15s"));
    }
}
