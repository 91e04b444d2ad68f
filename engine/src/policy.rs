//! Scheduling policies and per-vCluster scheduler configuration.

use crate::time::Duration;
use crate::weights::CostWeights;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How far backfilling looks ahead (DESIGN.md §3 "Backfill").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Depth {
    /// The top `d` blocked allocations get reservations; `0` = no backfill (first fit), `1` = EASY.
    Limited(u32),
    /// Every blocked allocation gets a reservation (conservative backfilling).
    Unlimited,
}

/// The scheduling policy of a vCluster's scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// Strict queue order: start from the head while it fits; the first that does not fit blocks all.
    /// (`fifo`, the interactive policy, is this with arrival order.)
    Fcfs,
    /// Backfilling with reservations for the top `depth` blocked allocations (HPC).
    Backfill { depth: Depth },
    /// EASY exactly as pyss implements it (DESIGN.md §3 "EASY, pyss-compatible").
    PyssEasy,
    /// Services: first fit in queue order, no reservations, best-fit placement that packs partially used
    /// groups before opening empty ones.
    BinPack,
    /// Sensitive: strict queue order, priority fixed at the highest class, conformance a hard constraint.
    Reservation,
}

impl Policy {
    pub const EASY: Policy = Policy::Backfill {
        depth: Depth::Limited(1),
    };
    pub const CONSERVATIVE: Policy = Policy::Backfill {
        depth: Depth::Unlimited,
    };
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Fcfs => f.write_str("fcfs"),
            Policy::Backfill {
                depth: Depth::Limited(1),
            } => f.write_str("easy"),
            Policy::Backfill {
                depth: Depth::Unlimited,
            } => f.write_str("conservative"),
            Policy::Backfill {
                depth: Depth::Limited(d),
            } => write!(f, "backfill(depth={d})"),
            Policy::PyssEasy => f.write_str("easy(compat=pyss)"),
            Policy::BinPack => f.write_str("bin-pack"),
            Policy::Reservation => f.write_str("reservation"),
        }
    }
}

/// One vCluster's scheduler settings (the per-vCluster part of a weight profile).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct VClusterConfig {
    pub policy: Policy,
    /// `Some`: the queue is ordered by `Score(j) = Σ wᵢ·fᵢ(j)`; `None`: by arrival (literature policies).
    pub weights: Option<CostWeights>,
    /// Passes run at multiples of this interval; zero = after every batch of inputs (event-driven).
    pub cycle_interval: Duration,
    /// f2's reference wait (seed default 1 h).
    pub reference_wait: Duration,
    /// Wait target for SLO compliance.
    pub slo_wait_target: Option<Duration>,
    /// GPU-hours (node-hours on CPU-only pools) this vCluster may commit over the run.
    pub gpu_hours_budget: Option<f64>,
    /// May this vCluster's scheduler preempt lower-class allocations for a blocked higher-class one?
    /// (Score-ordered vClusters only: the literature policies never preempt.)
    pub preemption: bool,
    /// Fraction of this vCluster's home nodes it lends to others while idle (score-ordered only).
    pub lend_cap: f64,
}

impl VClusterConfig {
    pub fn new(policy: Policy) -> VClusterConfig {
        VClusterConfig {
            policy,
            weights: None,
            cycle_interval: Duration::ZERO,
            reference_wait: Duration::from_hours(1),
            slo_wait_target: None,
            gpu_hours_budget: None,
            preemption: true,
            lend_cap: 0.5,
        }
    }
}
