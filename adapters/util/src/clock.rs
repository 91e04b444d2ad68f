//! The wall clock.

/// Now, in milliseconds since the Unix epoch (0 on a clock set before 1970).
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_is_past_2026_and_does_not_go_back() {
        let a = super::epoch_ms();
        let b = super::epoch_ms();
        assert!(a >= 1_767_225_600_000, "{a}");
        assert!(b >= a);
    }
}
