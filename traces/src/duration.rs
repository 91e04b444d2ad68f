//! Human durations as traces and profiles write them: `72h`, `30m`, `90s`, `1500ms`, `1h30m`, `HH:MM:SS`,
//! `D-HH:MM:SS` (Slurm) or a plain number of seconds.

use lattice_engine::Duration;

/// Parses a duration; the error says what was expected.
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
        rest = &rest[unit_len..];
    }
    Ok(Duration(total_ms.round() as u64))
}

fn secs_to_duration(secs: f64, s: &str) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}`: duration must be a non-negative number of seconds"));
    }
    Ok(Duration((secs * 1000.0).round() as u64))
}

fn parse_clock(t: &str) -> Result<Duration, String> {
    let (days, clock) = match t.split_once('-') {
        Some((d, c)) => (d.parse::<u64>().map_err(|_| format!("`{t}`: bad day count"))?, c),
        None => (0, t),
    };
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
    Ok(Duration::from_secs(days * 86_400 + v[0] * 3600 + v[1] * 60 + v[2]))
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
}
