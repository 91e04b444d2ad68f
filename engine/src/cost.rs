//! The cost function `Score(j) = Σ wᵢ·fᵢ(j)` of the scheduling-algorithm seed, as pure functions of their
//! inputs, with a per-allocation breakdown ("why did X run before Y?").
//!
//! This module computes scores from given inputs; gathering the inputs from engine state (fair-share usage,
//! free-node topology, energy prices) and ordering the queue by score is the cost-function issue's work.

use crate::weights::CostWeights;
use serde::{Deserialize, Serialize};

/// Everything the nine components read, for one allocation at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostInputs {
    /// Priority class 0..=10.
    pub priority_class: u8,
    pub wait_s: f64,
    /// f2's reference wait (seed default: 1 h).
    pub reference_wait_s: f64,
    /// Tenant's contracted share and its actual (decayed) usage share, both in [0, 1].
    pub target_share: f64,
    pub actual_share: f64,
    /// Topology groups the best placement needs, and the most groups available to it.
    pub groups_needed: u32,
    pub max_groups_available: u32,
    /// Fraction of input data on the hot tier; `None` = unknown (→ 0.5).
    pub hot_data_fraction: Option<f64>,
    pub queued_gpu_hours: f64,
    pub running_gpu_hours: f64,
    /// Energy price normalised to [0, 1] over the price series.
    pub normalized_energy_price: f64,
    /// Estimated minutes to checkpoint; `None` = not checkpointable.
    pub checkpoint_minutes: Option<f64>,
    /// Largest set of candidate nodes sharing one conformance fingerprint, and the nodes requested.
    pub largest_conformance_group: u32,
    pub requested_nodes: u32,
}

/// The nine component values and the weighted total.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreBreakdown {
    /// f1..f9 in order.
    pub components: [f64; 9],
    /// wᵢ·fᵢ in order.
    pub weighted: [f64; 9],
    /// Soft-quota budget penalty subtracted from the sum (0 below 80 % of the budget).
    pub penalty: f64,
    /// Σ wᵢ·fᵢ − penalty.
    pub total: f64,
}

/// f1: priority class normalised to [0, 1].
pub fn f1_priority(class: u8) -> f64 {
    class.min(10) as f64 / 10.0
}

/// f2: `log(1 + wait / reference_wait)` (natural log), anti-starvation.
pub fn f2_wait(wait_s: f64, reference_wait_s: f64) -> f64 {
    if reference_wait_s <= 0.0 {
        return 0.0;
    }
    (1.0 + wait_s.max(0.0) / reference_wait_s).ln()
}

/// f3: `max(0, target − actual) / target`; 0 for a tenant without a share.
pub fn f3_fair_share(target: f64, actual: f64) -> f64 {
    if target <= 0.0 {
        return 0.0;
    }
    ((target - actual).max(0.0) / target).min(1.0)
}

/// f4: `1 − groups_needed / max_groups_available`; 0 when nothing is available.
pub fn f4_topology(groups_needed: u32, max_groups_available: u32) -> f64 {
    if max_groups_available == 0 {
        return 0.0;
    }
    (1.0 - groups_needed as f64 / max_groups_available as f64).clamp(0.0, 1.0)
}

/// f5: fraction of input data on the hot tier; 0.5 (neutral) when unknown.
pub fn f5_data_readiness(hot_fraction: Option<f64>) -> f64 {
    hot_fraction.map_or(0.5, |f| f.clamp(0.0, 1.0))
}

/// f6: `min(1, queued_gpu_hours / running_gpu_hours)`; 1 when work queues with nothing running.
pub fn f6_backlog(queued_gpu_hours: f64, running_gpu_hours: f64) -> f64 {
    if running_gpu_hours <= 0.0 {
        return if queued_gpu_hours > 0.0 { 1.0 } else { 0.0 };
    }
    (queued_gpu_hours / running_gpu_hours).clamp(0.0, 1.0)
}

/// f7: `1 − normalized_energy_price(t)`.
pub fn f7_energy(normalized_price: f64) -> f64 {
    1.0 - normalized_price.clamp(0.0, 1.0)
}

/// f8: `1 / (1 + estimated_checkpoint_minutes)`; 0 for a non-checkpointable allocation.
pub fn f8_checkpoint(minutes: Option<f64>) -> f64 {
    minutes.map_or(0.0, |m| 1.0 / (1.0 + m.max(0.0)))
}

/// f9: `largest_conformance_group(candidates) / requested`, capped at 1.
pub fn f9_conformance(largest_group: u32, requested: u32) -> f64 {
    if requested == 0 {
        return 0.0;
    }
    (largest_group as f64 / requested as f64).min(1.0)
}

/// `Score(j) = Σ wᵢ·fᵢ(j)` with its breakdown.
pub fn score(w: &CostWeights, x: &CostInputs) -> ScoreBreakdown {
    let components = [
        f1_priority(x.priority_class),
        f2_wait(x.wait_s, x.reference_wait_s),
        f3_fair_share(x.target_share, x.actual_share),
        f4_topology(x.groups_needed, x.max_groups_available),
        f5_data_readiness(x.hot_data_fraction),
        f6_backlog(x.queued_gpu_hours, x.running_gpu_hours),
        f7_energy(x.normalized_energy_price),
        f8_checkpoint(x.checkpoint_minutes),
        f9_conformance(x.largest_conformance_group, x.requested_nodes),
    ];
    let ws = w.as_array();
    let mut weighted = [0.0; 9];
    for i in 0..9 {
        weighted[i] = ws[i] * components[i];
    }
    ScoreBreakdown {
        components,
        weighted,
        penalty: 0.0,
        total: weighted.iter().sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn components_follow_the_seed_formulas() {
        assert!(close(f1_priority(4), 0.4));
        assert!(close(f1_priority(15), 1.0));
        // One reference wait waited: ln 2.
        assert!(close(f2_wait(3600.0, 3600.0), 2f64.ln()));
        assert!(close(f2_wait(0.0, 3600.0), 0.0));
        assert!(f2_wait(7200.0, 3600.0) > f2_wait(3600.0, 3600.0), "monotonic in wait");
        assert!(close(f3_fair_share(0.4, 0.1), 0.75));
        assert!(close(f3_fair_share(0.4, 0.5), 0.0), "at or above share scores 0");
        assert!(close(f3_fair_share(0.4, 0.0), 1.0), "unused share scores 1");
        assert!(close(f4_topology(1, 4), 0.75));
        assert!(close(f4_topology(4, 4), 0.0));
        assert!(close(f5_data_readiness(None), 0.5));
        assert!(close(f5_data_readiness(Some(0.8)), 0.8));
        assert!(close(f6_backlog(50.0, 100.0), 0.5));
        assert!(close(f6_backlog(500.0, 100.0), 1.0), "capped at 1");
        assert!(close(f7_energy(0.25), 0.75));
        assert!(close(f8_checkpoint(Some(4.0)), 0.2));
        assert!(close(f8_checkpoint(None), 0.0));
        assert!(close(f9_conformance(48, 64), 0.75));
        assert!(close(f9_conformance(64, 64), 1.0));
    }

    #[test]
    fn score_is_the_weighted_sum_with_breakdown() {
        let w = CostWeights::default();
        let x = CostInputs {
            priority_class: 5,
            wait_s: 3600.0,
            reference_wait_s: 3600.0,
            target_share: 0.5,
            actual_share: 0.25,
            groups_needed: 1,
            max_groups_available: 2,
            hot_data_fraction: None,
            queued_gpu_hours: 10.0,
            running_gpu_hours: 20.0,
            normalized_energy_price: 0.0,
            checkpoint_minutes: Some(1.0),
            largest_conformance_group: 4,
            requested_nodes: 4,
        };
        let s = score(&w, &x);
        let want = 0.20 * 0.5 + 0.20 * 2f64.ln() + 0.20 * 0.5 + 0.15 * 0.5 + 0.10 * 0.5 + 0.05 * 0.5 + 0.0 + 0.0 + 0.10;
        assert!(close(s.total, want), "{} vs {want}", s.total);
        assert!(close(s.weighted.iter().sum::<f64>(), s.total));
        assert!(close(s.components[7], 0.5));
    }

    use proptest::prelude::*;

    proptest! {
        /// f3 ∈ [0, 1] for any shares; f2 is monotone in the wait; every component stays in its range.
        #[test]
        fn component_ranges_and_monotonicity(
            target in 0.0f64..1.0, actual in 0.0f64..2.0,
            w1 in 0.0f64..1e6, w2 in 0.0f64..1e6, r in 1.0f64..1e5,
            g in 0u32..50, gmax in 0u32..50, q in 0.0f64..1e4, run in 0.0f64..1e4,
            price in -1.0f64..2.0, ck in proptest::option::of(0.0f64..1e3),
            conf in 0u32..100, req in 0u32..100,
        ) {
            let f3 = f3_fair_share(target, actual);
            prop_assert!((0.0..=1.0).contains(&f3));
            let (lo, hi) = if w1 <= w2 { (w1, w2) } else { (w2, w1) };
            prop_assert!(f2_wait(lo, r) <= f2_wait(hi, r));
            prop_assert!(f2_wait(lo, r) >= 0.0);
            prop_assert!((0.0..=1.0).contains(&f4_topology(g, gmax)));
            prop_assert!((0.0..=1.0).contains(&f6_backlog(q, run)));
            prop_assert!((0.0..=1.0).contains(&f7_energy(price)));
            prop_assert!((0.0..=1.0).contains(&f8_checkpoint(ck)));
            prop_assert!((0.0..=1.0).contains(&f9_conformance(conf, req)));
        }
    }
}
