//! Cost-function weights `w1..w9` (the scheduling-algorithm seed). Pure data here; the cost function that
//! uses them arrives with the cost-function issue.

use serde::{Deserialize, Serialize};

/// Weights of `Score(j) = Σ wᵢ·fᵢ(j)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostWeights {
    pub priority: f64,
    pub wait_time: f64,
    pub fair_share: f64,
    pub topology: f64,
    pub data_readiness: f64,
    pub backlog: f64,
    pub energy: f64,
    pub checkpoint: f64,
    pub conformance: f64,
}

impl CostWeights {
    /// Names in `w1..w9` order, as profiles spell them.
    pub const NAMES: [&'static str; 9] = [
        "priority",
        "wait_time",
        "fair_share",
        "topology",
        "data_readiness",
        "backlog",
        "energy",
        "checkpoint",
        "conformance",
    ];

    /// The weights in [`CostWeights::NAMES`] order (the inverse of [`CostWeights::as_array`]).
    pub fn from_array(w: [f64; 9]) -> CostWeights {
        CostWeights {
            priority: w[0],
            wait_time: w[1],
            fair_share: w[2],
            topology: w[3],
            data_readiness: w[4],
            backlog: w[5],
            energy: w[6],
            checkpoint: w[7],
            conformance: w[8],
        }
    }

    pub fn as_array(&self) -> [f64; 9] {
        [
            self.priority,
            self.wait_time,
            self.fair_share,
            self.topology,
            self.data_readiness,
            self.backlog,
            self.energy,
            self.checkpoint,
            self.conformance,
        ]
    }
}

impl Default for CostWeights {
    /// The seed's `CostWeights::default()`, the "balanced HPC" baseline.
    fn default() -> Self {
        CostWeights {
            priority: 0.20,
            wait_time: 0.20,
            fair_share: 0.20,
            topology: 0.15,
            data_readiness: 0.10,
            backlog: 0.05,
            energy: 0.00,
            checkpoint: 0.00,
            conformance: 0.10,
        }
    }
}
