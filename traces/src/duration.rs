//! Human durations as traces and profiles write them: `72h`, `30m`, `90s`, `1500ms`, `1h30m`, `HH:MM:SS`,
//! `D-HH:MM:SS` (Slurm) or a plain number of seconds.

use lattice_engine::Duration;

/// The longest duration any input may give: 100 years. Every time the engine computes (a submission
/// plus a walltime, a reservation) then stays far inside `u64` milliseconds, so no arithmetic on
/// input saturates or wraps; anything longer is refused naming the field.
pub const MAX_DURATION: Duration = Duration(100 * 366 * 86_400_000);

/// The longest walltime a request may ask for: 366 days. A scheduler has to plan reservations
/// around every running walltime; a year is already far past any site's limit.
pub const MAX_WALLTIME: Duration = Duration(366 * 86_400_000);

/// The latest timestamp a trace may carry: 9999-12-31T23:59:59Z, in seconds since the epoch.
pub const MAX_TIMESTAMP_S: f64 = 253_402_300_799.0;

/// Parses a requested walltime (the API): a duration, positive and at most [`MAX_WALLTIME`].
pub fn parse_walltime(s: &str) -> Result<Duration, String> {
    let d = check_walltime(parse_duration(s)?, s)?;
    if d == Duration::ZERO {
        return Err(format!("`{s}`: a walltime must be positive"));
    }
    Ok(d)
}

/// A walltime already parsed (e.g. a trace's number of seconds): at most [`MAX_WALLTIME`]. Traces may
/// carry a zero walltime (an SWF job that ran 0 s with no requested time; DESIGN.md holds its nodes
/// for 1 ms), so zero is not refused here.
pub fn check_walltime(d: Duration, shown: &str) -> Result<Duration, String> {
    if d > MAX_WALLTIME {
        return Err(format!("`{shown}`: a walltime is at most 366 days"));
    }
    Ok(d)
}

/// Parses a duration; the error says what was expected. At most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if t.contains(':') {
        return parse_clock(t);
    }
    if let Ok(secs) = t.parse::<f64>() {
        return secs_to_duration(secs, s);
    }
    // Sequence of <number><unit>.
    let mut total_ms: f64 = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{s}`: missing unit (use h, m, s, ms or d)"))?;
        if num_len == 0 {
            return Err(format!("`{s}`: expected a number before the unit"));
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| format!("`{s}`: bad number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_ms = match &rest[..unit_len] {
            "d" => 86_400_000.0,
            "h" => 3_600_000.0,
            "m" | "min" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            u => return Err(format!("`{s}`: unknown unit `{u}` (use d, h, m, s or ms)")),
        };
        total_ms += n * unit_ms;
        if total_ms.is_nan() || total_ms > MAX_DURATION.0 as f64 {
            return Err(too_long(s));
        }
        rest = &rest[unit_len..];
    }
    Ok(Duration(total_ms.round() as u64))
}

fn too_long(s: &str) -> String {
    format!("`{s}`: longer than 100 years")
}

/// A number of seconds as a duration: finite, non-negative and at most [`MAX_DURATION`] (the error
/// shows `s`).
pub fn secs_to_duration(secs: f64, s: &str) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}`: duration must be a non-negative number of seconds"));
    }
    if secs * 1000.0 > MAX_DURATION.0 as f64 {
        return Err(too_long(s));
    }
    Ok(Duration((secs * 1000.0).round() as u64))
}

fn parse_clock(t: &str) -> Result<Duration, String> {
    let (days, clock) = match t.split_once('-') {
        Some((d, c)) => (d.parse::<u64>().map_err(|_| format!("`{t}`: bad day count"))?, c),
        None => (0, t),
    };
    let too_long = || too_long(t);
    let parts: Vec<&str> = clock.split(':').collect();
    if parts.len() != 3 {
        return Err(format!("`{t}`: expected HH:MM:SS"));
    }
    let mut v = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        v[i] = p.parse().map_err(|_| format!("`{t}`: expected HH:MM:SS"))?;
    }
    if v[1] >= 60 || v[2] >= 60 {
        return Err(format!("`{t}`: minutes and seconds must be below 60"));
    }
    let secs = days
        .checked_mul(86_400)
        .and_then(|d| v[0].checked_mul(3600).and_then(|h| d.checked_add(h)))
        .and_then(|x| x.checked_add(v[1] * 60 + v[2]))
        .ok_or_else(too_long)?;
    if secs > MAX_DURATION.0 / 1000 {
        return Err(too_long());
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(parse_duration("72h"), Ok(Duration::from_hours(72)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_mins(30)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_mins(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration(250)));
        assert_eq!(parse_duration("01:02:03"), Ok(Duration::from_secs(3723)));
        assert_eq!(parse_duration("2-00:00:01"), Ok(Duration::from_secs(172_801)));
        assert_eq!(parse_duration("3600"), Ok(Duration::from_hours(1)));
        assert_eq!(parse_duration("1.5"), Ok(Duration(1500)));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("h").unwrap_err().contains("number"));
        assert!(parse_duration("1:2").unwrap_err().contains("HH:MM:SS"));
        assert!(parse_duration("00:61:00").is_err());
        assert!(parse_duration("-5").is_err());
    }

    #[test]
    fn absurd_durations_are_refused_not_wrapped() {
        for s in [
            "99999999999999d",
            "1e300",
            "36601d",
            "99999999999999999999:00:00",
            "999999999999999-00:00:00",
            "18446744073709551615ms",
            "5000000000000000000",
        ] {
            let e = parse_duration(s).unwrap_err();
            assert!(
                e.contains("100 years") || e.contains("bad day count") || e.contains("HH:MM:SS"),
                "{s}: {e}"
            );
        }
        assert_eq!(parse_duration("36600d"), Ok(Duration::from_hours(36600 * 24)));
        // Walltimes: positive, at most 366 days.
        assert_eq!(parse_walltime("366d"), Ok(Duration::from_hours(366 * 24)));
        assert!(parse_walltime("367d").unwrap_err().contains("at most 366 days"));
        assert!(parse_walltime("99999999999999d").unwrap_err().contains("100 years"));
        assert!(parse_walltime("0").unwrap_err().contains("positive"));
        // A trace's zero walltime stays (an SWF job that ran 0 s).
        assert_eq!(check_walltime(Duration::ZERO, "0"), Ok(Duration::ZERO));
    }
}
