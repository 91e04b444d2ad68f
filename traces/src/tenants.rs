//! Tenant contracts YAML (book: "Quota Enforcement"): hard and soft quotas per tenant.
//!
//! ```yaml
//! physics:
//!   max_nodes: 200                  # hard, quorum-enforced
//!   max_concurrent_allocations: 50  # hard, quorum-enforced
//!   fair_share_target: 0.15         # soft: f3's target
//!   burst_allowance: 1.5            # soft: up to 150 % of the share while others wait
//!   gpu_hours_budget: 100000        # soft: 80-100 % used ramps a score penalty
//!   node_hours_budget: 500000
//!   deserved_nodes: 120             # KAI: guaranteed share of the pool (makes f3 targets demand-aware)
//!   over_quota_weight: 2            # KAI: weight for what others leave idle
//! ```

use crate::error::TraceError;
use lattice_engine::TenantQuota;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantIn {
    max_nodes: Option<u32>,
    max_concurrent_allocations: Option<u32>,
    gpu_hours_budget: Option<f64>,
    node_hours_budget: Option<f64>,
    fair_share_target: Option<f64>,
    burst_allowance: Option<f64>,
    deserved_nodes: Option<f64>,
    over_quota_weight: Option<f64>,
}

pub fn read_tenants(path: &Path) -> Result<BTreeMap<String, TenantQuota>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    parse_tenants(&path.display().to_string(), &text)
}

pub fn parse_tenants(file: &str, text: &str) -> Result<BTreeMap<String, TenantQuota>, TraceError> {
    let err = |message: String| TraceError::Config {
        file: file.to_string(),
        message,
    };
    let doc: BTreeMap<String, TenantIn> = yaml_serde::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, t) in doc {
        for (key, v) in [
            ("gpu_hours_budget", t.gpu_hours_budget),
            ("node_hours_budget", t.node_hours_budget),
        ] {
            if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
                return Err(err(format!("{name}.{key}: must be >= 0")));
            }
        }
        if t.fair_share_target.is_some_and(|x| !(x > 0.0 && x <= 1.0)) {
            return Err(err(format!("{name}.fair_share_target: must be in (0, 1]")));
        }
        for (key, v) in [
            ("deserved_nodes", t.deserved_nodes),
            ("over_quota_weight", t.over_quota_weight),
        ] {
            if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
                return Err(err(format!("{name}.{key}: must be >= 0")));
            }
        }
        if t.burst_allowance.is_some_and(|x| !(x.is_finite() && x >= 1.0)) {
            return Err(err(format!("{name}.burst_allowance: must be >= 1")));
        }
        out.insert(
            name,
            TenantQuota {
                max_nodes: t.max_nodes,
                max_concurrent_allocations: t.max_concurrent_allocations,
                gpu_hours_budget: t.gpu_hours_budget,
                node_hours_budget: t.node_hours_budget,
                fair_share_target: t.fair_share_target,
                burst_allowance: t.burst_allowance,
                deserved_nodes: t.deserved_nodes,
                over_quota_weight: t.over_quota_weight,
            },
        );
    }
    let total: f64 = out.values().filter_map(|q| q.fair_share_target).sum();
    if total > 1.0 + 1e-9 {
        return Err(err(format!("fair_share_target values add up to {total:.3} > 1")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let t = parse_tenants("t.yaml", "physics:\n  max_nodes: 200\n  fair_share_target: 0.15\n").unwrap();
        assert_eq!(t["physics"].max_nodes, Some(200));
        let e = parse_tenants("t.yaml", "physics:\n  max_gpus: 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.yaml:") && e.contains("max_gpus"), "{e}");
        let e = parse_tenants("t.yaml", "a:\n  burst_allowance: 0.5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a.burst_allowance"), "{e}");
        let e = parse_tenants("t.yaml", "a:\n  fair_share_target: 0.7\nb:\n  fair_share_target: 0.7\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("add up to"), "{e}");
    }
}
