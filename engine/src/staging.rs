//! Data staging (book: "Data Staging & Cache Lifecycle"): allocations whose data mounts ask for the hot
//! tier but sit on warm/cold storage enter `Staging` while they wait; the VAST write bandwidth available
//! to staging is capped at `0.3 × total` and shared in queue order (closest to the front first, smaller
//! datasets first on ties); f5 (data readiness) is the fraction staged. At the head of the queue, a job
//! more than 80 % staged may start (accepting a brief I/O stall for the rest), one below 80 % is held.
//! Staging pauses while storage is down; a failed staging restarts (up to 3 retries, then it waits with
//! an alert).

use crate::alloc::AllocState;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids::AllocId;
use crate::time::{Duration, Time};
use serde::{Deserialize, Serialize};

/// Storage tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Hot,
    #[default]
    Warm,
    Cold,
}

/// One data mount of a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataMount {
    pub source: String,
    pub size_gb: f64,
    /// Where the data is now.
    pub tier: Tier,
    /// Where the job wants it (`hot` triggers pre-staging).
    pub tier_hint: Tier,
}

/// Fraction below which a job at the front is held for staging.
pub const STAGED_ENOUGH: f64 = 0.8;
/// Share of the VAST write bandwidth staging may use.
pub const STAGING_BANDWIDTH_SHARE: f64 = 0.3;
/// Staging retries before the allocation waits with an alert.
pub const STAGING_RETRIES: u32 = 3;

#[derive(Clone, Debug, Default)]
pub(crate) struct StagingState {
    pub needed_gb: f64,
    pub done_gb: f64,
    pub started: Option<Time>,
    pub completed: Option<Time>,
    pub retries: u32,
}

impl Engine {
    /// Sets the VAST write bandwidth (GB/s); staging gets 30 % of it.
    pub fn set_vast_bandwidth(&mut self, gbps: f64) {
        self.vast_write_gbps = gbps.max(0.0);
    }

    /// GB the allocation still needs on the hot tier before it is fully staged.
    pub(crate) fn staging_needed(mounts: &[DataMount]) -> f64 {
        mounts
            .iter()
            .filter(|m| m.tier_hint == Tier::Hot && m.tier != Tier::Hot)
            .map(|m| m.size_gb.max(0.0))
            .sum()
    }

    /// f5: fraction of the input data on the hot tier (`None` = the request declares no data).
    pub fn data_readiness(&self, id: AllocId) -> Option<f64> {
        let a = self.allocs.get(id.index())?;
        if a.spec.data.is_empty() {
            return None;
        }
        Some(match self.staging.get(&id) {
            Some(s) if s.needed_gb > 0.0 => (s.done_gb / s.needed_gb).clamp(0.0, 1.0),
            _ => 1.0,
        })
    }

    /// Seconds of staging left at the current staging bandwidth (the I/O stall if it starts now).
    pub fn staging_remaining_s(&self, id: AllocId) -> f64 {
        let bw = self.vast_write_gbps * STAGING_BANDWIDTH_SHARE;
        match self.staging.get(&id) {
            Some(s) if s.needed_gb > s.done_gb && bw > 0.0 => (s.needed_gb - s.done_gb) / bw,
            _ => 0.0,
        }
    }

    /// When staging of `id` began and finished (for the "staging overlapped with queue wait" metric).
    pub fn staging_times(&self, id: AllocId) -> Option<(Time, Option<Time>)> {
        self.staging.get(&id).and_then(|s| Some((s.started?, s.completed)))
    }

    /// A staging transfer failed: it restarts (after 3 retries the allocation keeps waiting with an alert).
    pub fn handle_staging_failure(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let s = self.staging.get_mut(&id).ok_or(EngineError::UnknownAlloc(id))?;
        s.retries += 1;
        s.done_gb = 0.0;
        s.completed = None;
        if s.retries > STAGING_RETRIES {
            self.staging_alerts += 1;
        }
        Ok(())
    }

    /// Advances staging from the last accrual to `now` in queue order (front first, small first),
    /// within `0.3 × bandwidth`; paused while storage is down. Returns allocations that finished.
    pub(crate) fn advance_staging(&mut self, now: Time) -> u32 {
        let from = self.staging_last;
        self.staging_last = now;
        if self.staging.is_empty() || !self.storage_available {
            return 0;
        }
        let mut budget = self.vast_write_gbps * STAGING_BANDWIDTH_SHARE * now.since(from).as_secs_f64();
        let mut order: Vec<(usize, f64, AllocId)> = Vec::new();
        for p in self.pools.values() {
            for (pos, &id) in p.queue.iter().enumerate() {
                if let Some(s) = self.staging.get(&id)
                    && s.done_gb < s.needed_gb
                    && s.retries <= STAGING_RETRIES
                {
                    order.push((pos, s.needed_gb, id));
                }
            }
        }
        order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut finished = 0;
        for (_, _, id) in order {
            if budget <= 0.0 {
                break;
            }
            let s = self.staging.get_mut(&id).expect("listed");
            s.started.get_or_insert(from);
            let before = s.done_gb;
            let take = (s.needed_gb - s.done_gb).min(budget);
            s.done_gb += take;
            budget -= take;
            // Crossing 80 % makes the job schedulable (the >80 % rule).
            if before < STAGED_ENOUGH * s.needed_gb && s.done_gb >= STAGED_ENOUGH * s.needed_gb - 1e-9 {
                finished += 1;
            }
            if s.done_gb >= s.needed_gb - 1e-9 {
                s.done_gb = s.needed_gb;
                // Finished somewhere in this interval: at the time the bandwidth used so far implies.
                s.completed = Some(now);
                finished += 1;
            }
        }
        // Wake when the front job next crosses 80 % or finishes.
        self.staging_next = self.next_staging_event(now);
        finished
    }

    /// The earliest time a waiting job crosses 80 % or finishes, under front-first sharing.
    fn next_staging_event(&self, now: Time) -> Option<Time> {
        let bw = self.vast_write_gbps * STAGING_BANDWIDTH_SHARE;
        if bw <= 0.0 || !self.storage_available {
            return None;
        }
        let mut best: Option<(usize, f64)> = None;
        for p in self.pools.values() {
            for (pos, &id) in p.queue.iter().enumerate() {
                if let Some(s) = self.staging.get(&id)
                    && s.done_gb < s.needed_gb
                    && best.is_none_or(|b| pos < b.0)
                {
                    let to80 = STAGED_ENOUGH * s.needed_gb - s.done_gb;
                    let left = if to80 > 1e-9 { to80 } else { s.needed_gb - s.done_gb };
                    best = Some((pos, left));
                }
            }
        }
        best.map(|(_, left)| now + Duration((left / bw * 1000.0).ceil().max(1.0) as u64))
    }

    /// Registers an allocation's staging needs at submission.
    pub(crate) fn start_staging(&mut self, now: Time, id: AllocId) {
        let needed = Self::staging_needed(&self.allocs[id.index()].spec.data);
        if needed > 0.0 {
            if self.staging.values().all(|s| s.done_gb >= s.needed_gb) {
                // Nothing was staging: no bandwidth accrued before now (a fresh engine's last
                // accrual is time 0, which would otherwise stage everything at once).
                self.staging_last = now;
            }
            self.staging.insert(
                id,
                StagingState {
                    needed_gb: needed,
                    ..StagingState::default()
                },
            );
            let a = &mut self.allocs[id.index()];
            if a.state == AllocState::Pending {
                a.state = AllocState::Staging;
            }
            if self.staging_next.is_none() {
                self.staging_next = Some(now);
            }
        }
    }

    /// May the job at the front start, data-wise (the >80 % rule)?
    pub(crate) fn staged_enough(&self, id: AllocId) -> bool {
        self.data_readiness(id).is_none_or(|f| f >= STAGED_ENOUGH)
    }
}
