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
//!   projects:                       # projects within the tenant (Waldur's projects), each with its
//!     lattice-qcd:                  # own hard limits (an allocation must fit both) and soft budgets
//!       max_nodes: 50
//!       max_concurrent_allocations: 10
//!       gpu_hours_budget: 20000
//!       node_hours_budget: 80000
//! ```

use crate::error::TraceError;
use lattice_engine::{ProjectQuota, TenantQuota};
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
    #[serde(default)]
    projects: BTreeMap<String, ProjectIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectIn {
    max_nodes: Option<u32>,
    max_concurrent_allocations: Option<u32>,
    gpu_hours_budget: Option<f64>,
    node_hours_budget: Option<f64>,
}

/// Tenants' and their projects' contracts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contracts {
    pub tenants: BTreeMap<String, TenantQuota>,
    /// By tenant, then project name.
    pub projects: BTreeMap<String, BTreeMap<String, ProjectQuota>>,
}

impl Contracts {
    /// Every project's contract as (tenant, project, quota), in name order.
    pub fn project_list(&self) -> impl Iterator<Item = (&str, &str, &ProjectQuota)> {
        self.projects
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, q)| (t.as_str(), p.as_str(), q)))
    }
}

pub fn read_tenants(path: &Path) -> Result<Contracts, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    parse_tenants(&path.display().to_string(), &text)
}

pub fn parse_tenants(file: &str, text: &str) -> Result<Contracts, TraceError> {
    let err = |message: String| TraceError::Config {
        file: file.to_string(),
        message,
    };
    let doc: BTreeMap<String, TenantIn> = yaml_serde::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut out = BTreeMap::new();
    let mut projects = BTreeMap::new();
    let budget = |name: &str, key: &str, v: Option<f64>| {
        if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
            return Err(err(format!("{name}.{key}: must be >= 0")));
        }
        Ok(())
    };
    for (name, t) in doc {
        budget(&name, "gpu_hours_budget", t.gpu_hours_budget)?;
        budget(&name, "node_hours_budget", t.node_hours_budget)?;
        let mut own = BTreeMap::new();
        for (p, q) in t.projects {
            if p.is_empty() || p.contains('/') {
                return Err(err(format!(
                    "{name}.projects.{p:?}: a project name is not empty and has no `/`"
                )));
            }
            let at = format!("{name}.projects.{p}");
            budget(&at, "gpu_hours_budget", q.gpu_hours_budget)?;
            budget(&at, "node_hours_budget", q.node_hours_budget)?;
            let quota = ProjectQuota {
                max_nodes: q.max_nodes,
                max_concurrent_allocations: q.max_concurrent_allocations,
                gpu_hours_budget: q.gpu_hours_budget,
                node_hours_budget: q.node_hours_budget,
            };
            own.insert(p, quota);
        }
        if !own.is_empty() {
            projects.insert(name.clone(), own);
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
    Ok(Contracts { tenants: out, projects })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let t = parse_tenants("t.yaml", "physics:\n  max_nodes: 200\n  fair_share_target: 0.15\n")
            .unwrap()
            .tenants;
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

    #[test]
    fn projects_within_tenants() {
        let c = parse_tenants(
            "t.yaml",
            "physics:\n  max_nodes: 20\n  projects:\n    qcd:\n      max_nodes: 8\n      gpu_hours_budget: 100\n    astro: {}\n",
        )
        .unwrap();
        assert_eq!(c.projects["physics"]["qcd"].max_nodes, Some(8));
        assert_eq!(c.projects["physics"]["qcd"].gpu_hours_budget, Some(100.0));
        let list: Vec<_> = c.project_list().map(|(t, p, _)| (t, p)).collect();
        assert_eq!(list, [("physics", "astro"), ("physics", "qcd")]);
        let e = parse_tenants(
            "t.yaml",
            "physics:\n  projects:\n    qcd:\n      fair_share_target: 0.2\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("t.yaml:") && e.contains("fair_share_target"), "{e}");
        let e = parse_tenants(
            "t.yaml",
            "physics:\n  projects:\n    qcd:\n      node_hours_budget: -1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("physics.projects.qcd.node_hours_budget"), "{e}");
    }
}
