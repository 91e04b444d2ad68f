//! Virtual time: integer milliseconds since the trace epoch.
//!
//! The engine never reads a clock; every input carries `now: Time`. [`Clock`] enforces that the time the
//! engine is given never goes backwards.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, Sub};

/// A point in time, in milliseconds since the trace (or cluster) epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Time(pub u64);

/// A length of time in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Duration(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);
    pub const MAX: Time = Time(u64::MAX);

    pub fn from_secs(s: u64) -> Time {
        Time(s.saturating_mul(1000))
    }
    pub fn as_millis(self) -> u64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    /// `self - earlier`, saturating at zero.
    pub fn since(self, earlier: Time) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    pub const ZERO: Duration = Duration(0);

    pub fn from_secs(s: u64) -> Duration {
        Duration(s.saturating_mul(1000))
    }
    pub fn from_mins(m: u64) -> Duration {
        Duration::from_secs(m.saturating_mul(60))
    }
    pub fn from_hours(h: u64) -> Duration {
        Duration::from_secs(h.saturating_mul(3600))
    }
    pub fn as_millis(self) -> u64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.0))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(d.0))
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, d: Duration) -> Duration {
        Duration(self.0.saturating_add(d.0))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}s", self.as_secs_f64())
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.as_secs_f64())
    }
}

/// Guards monotonic time: every input to the engine passes through [`Clock::advance`].
#[derive(Clone, Debug, Default)]
pub struct Clock {
    now: Time,
}

impl Clock {
    pub fn now(&self) -> Time {
        self.now
    }

    /// Moves the clock to `now`.
    ///
    /// # Panics
    /// If `now` is earlier than the last time seen: a driver that feeds time backwards is a programming
    /// error in the driver (the simulator's event queue or the runtime's monotonic clock), never bad input.
    pub fn advance(&mut self, now: Time) {
        assert!(
            now >= self.now,
            "time went backwards: engine was at {} and was given {}",
            self.now,
            now
        );
        self.now = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Time(5) - Duration(10), Time(0));
        assert_eq!(Time::MAX + Duration(1), Time::MAX);
        assert_eq!(Time(10).since(Time(3)), Duration(7));
        assert_eq!(Time(3).since(Time(10)), Duration(0));
        assert_eq!(Duration::from_hours(1), Duration(3_600_000));
    }

    #[test]
    fn clock_accepts_equal_and_later_times() {
        let mut c = Clock::default();
        c.advance(Time(5));
        c.advance(Time(5));
        c.advance(Time(9));
        assert_eq!(c.now(), Time(9));
    }

    #[test]
    #[should_panic(expected = "time went backwards")]
    fn clock_rejects_backwards_time() {
        let mut c = Clock::default();
        c.advance(Time(10));
        c.advance(Time(9));
    }
}
