//! Fair-share usage accounting with exponential decay (the fair-share tutorial's model).
//!
//! Usage is accumulated in periods (the tutorial: days) over a window (the tutorial: 7 days) and
//! weighted by a decay factor per period back: `U = u(now) + D·u(now−1) + D²·u(now−2) + …` over the
//! window. A half-life configures the same model (`D = 0.5^(period / half-life)`). Running allocations
//! accrue continuously (node-seconds, or GPU-seconds on GPU pools); [`UsageLedger::accrue`] brings the
//! ledger to `now`, splitting time at period boundaries.

use crate::time::{Duration, Time};
use std::collections::VecDeque;

/// Decay settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FairShareConfig {
    /// Length of one usage bucket.
    pub period: Duration,
    /// Weight of the previous period relative to the current one, in (0, 1].
    pub decay: f64,
    /// Periods remembered (older usage is forgotten entirely).
    pub window: u32,
}

impl FairShareConfig {
    /// Decay from a half-life: usage counts half after `half_life`.
    pub fn from_half_life(half_life: Duration, period: Duration, window: u32) -> FairShareConfig {
        let periods = half_life.as_secs_f64() / period.as_secs_f64().max(1e-9);
        FairShareConfig {
            period,
            decay: 0.5f64.powf(1.0 / periods.max(1e-9)),
            window: window.max(1),
        }
    }

    /// The tutorial's settings: daily periods, decay 0.7, a 7-day window.
    pub fn tutorial() -> FairShareConfig {
        FairShareConfig {
            period: Duration::from_hours(24),
            decay: 0.7,
            window: 7,
        }
    }
}

impl Default for FairShareConfig {
    /// Hourly periods, a 7-day half-life, a 28-day window.
    fn default() -> Self {
        FairShareConfig::from_half_life(Duration::from_hours(7 * 24), Duration::from_hours(1), 28 * 24)
    }
}

#[derive(Clone, Debug, Default)]
struct TenantUsage {
    /// `buckets[0]` is the current period.
    buckets: VecDeque<f64>,
    decayed: f64,
    /// Units per second while running (nodes or GPUs).
    rate: f64,
}

/// Per-tenant decayed usage.
#[derive(Clone, Debug)]
pub struct UsageLedger {
    cfg: FairShareConfig,
    tenants: Vec<TenantUsage>,
    /// Start of the current period.
    period_start: Time,
    last: Time,
}

impl UsageLedger {
    pub fn new(cfg: FairShareConfig) -> UsageLedger {
        UsageLedger {
            cfg,
            tenants: Vec::new(),
            period_start: Time::ZERO,
            last: Time::ZERO,
        }
    }

    pub fn config(&self) -> FairShareConfig {
        self.cfg
    }

    fn ensure(&mut self, tenant: usize) {
        while self.tenants.len() <= tenant {
            self.tenants.push(TenantUsage {
                buckets: std::iter::repeat_n(0.0, self.cfg.window as usize).collect(),
                ..TenantUsage::default()
            });
        }
    }

    /// Brings every tenant's usage up to `now`.
    pub fn accrue(&mut self, now: Time) {
        if now <= self.last {
            return;
        }
        let period = self.cfg.period.as_millis().max(1);
        let window = self.cfg.window as u64;
        let d_last = self.cfg.decay.powi(self.cfg.window as i32 - 1);
        while self.last < now {
            let boundary = Time(self.period_start.0 + period);
            let until = now.min(boundary);
            let dt = until.since(self.last).as_secs_f64();
            for t in &mut self.tenants {
                if t.rate > 0.0 {
                    let add = t.rate * dt;
                    t.buckets[0] += add;
                    t.decayed += add;
                }
            }
            self.last = until;
            if until == boundary {
                // A new period: shift, decaying everything once and forgetting the oldest bucket.
                let skipped = (now.0.saturating_sub(boundary.0)) / period;
                if skipped >= window && self.tenants.iter().all(|t| t.rate == 0.0) {
                    // Long idle gap: the whole window is forgotten.
                    for t in &mut self.tenants {
                        t.buckets.iter_mut().for_each(|b| *b = 0.0);
                        t.decayed = 0.0;
                    }
                    self.period_start = Time(boundary.0 + skipped * period);
                    self.last = self.period_start.max(self.last);
                    continue;
                }
                for t in &mut self.tenants {
                    let oldest = t.buckets.pop_back().unwrap_or(0.0);
                    t.decayed = (self.cfg.decay * (t.decayed - d_last * oldest)).max(0.0);
                    t.buckets.push_front(0.0);
                }
                self.period_start = boundary;
            }
        }
    }

    /// A tenant starts consuming `rate` units at `now`.
    pub fn start(&mut self, now: Time, tenant: usize, rate: f64) {
        self.ensure(tenant);
        self.accrue(now);
        self.tenants[tenant].rate += rate;
    }

    /// A tenant stops consuming `rate` units at `now`.
    pub fn stop(&mut self, now: Time, tenant: usize, rate: f64) {
        self.ensure(tenant);
        self.accrue(now);
        let r = &mut self.tenants[tenant].rate;
        *r = (*r - rate).max(0.0);
    }

    /// Decayed usage of a tenant (unit-seconds), as of the last accrual.
    pub fn decayed(&self, tenant: usize) -> f64 {
        self.tenants.get(tenant).map_or(0.0, |t| t.decayed)
    }

    /// Decayed usage as a fraction of one period's capacity (`capacity` units), the tutorial's `U / S`:
    /// a tenant that used the whole cluster for the whole current period has 1.0.
    pub fn decayed_fraction(&self, tenant: usize, capacity: f64) -> f64 {
        let per_period = capacity * self.cfg.period.as_secs_f64();
        if per_period <= 0.0 {
            0.0
        } else {
            self.decayed(tenant) / per_period
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    #[test]
    fn decay_per_period_and_window() {
        // The tutorial: a job using the whole 4-node cluster all day gives usage 1 (96/96); one day later it
        // counts 0.7, two days later 0.49; after the 7-day window it is gone.
        let mut l = UsageLedger::new(FairShareConfig::tutorial());
        l.start(Time::ZERO, 0, 4.0);
        l.stop(Time::from_secs(DAY), 0, 4.0);
        let frac = |l: &UsageLedger| l.decayed_fraction(0, 4.0);
        assert!(
            (frac(&l) - 0.7).abs() < 1e-9,
            "the day boundary already decayed it once: {}",
            frac(&l)
        );
        l.accrue(Time::from_secs(2 * DAY));
        assert!((frac(&l) - 0.49).abs() < 1e-9);
        l.accrue(Time::from_secs(7 * DAY));
        assert!(frac(&l) < 1e-9, "outside the window: {}", frac(&l));
    }

    #[test]
    fn within_a_period_usage_adds_up() {
        let mut l = UsageLedger::new(FairShareConfig::tutorial());
        l.start(Time::ZERO, 1, 4.0);
        l.stop(Time::from_secs(6 * 3600), 1, 4.0);
        assert!((l.decayed_fraction(1, 4.0) - 0.25).abs() < 1e-9);
        assert_eq!(l.decayed(0), 0.0);
    }

    #[test]
    fn half_life_config() {
        let c = FairShareConfig::from_half_life(Duration::from_hours(48), Duration::from_hours(24), 14);
        assert!((c.decay - 0.5f64.sqrt()).abs() < 1e-12);
        let mut l = UsageLedger::new(c);
        l.start(Time::ZERO, 0, 1.0);
        l.stop(Time::from_secs(1), 0, 1.0);
        l.accrue(Time::from_secs(2 * DAY));
        assert!((l.decayed(0) - 0.5).abs() < 1e-9);
    }
}
