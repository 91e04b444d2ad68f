//! Tenant quotas (book: "Quota Enforcement", ADR-009): hard limits the quorum enforces, soft limits that
//! act through the score.

use serde::{Deserialize, Serialize};

/// A tenant's contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantQuota {
    /// Hard: nodes the tenant may hold at once (quorum-enforced).
    pub max_nodes: Option<u32>,
    /// Hard: running allocations at once (quorum-enforced).
    pub max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period; 80-100 % used ramps a score penalty, beyond starves.
    pub gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period (the worse of the two fractions drives the penalty).
    pub node_hours_budget: Option<f64>,
    /// Soft: target share of the system (f3's target).
    pub fair_share_target: Option<f64>,
    /// Soft: while other tenants wait, a tenant may hold up to this multiple of its share (the seed's
    /// example: 1.5); beyond it, it only gets what nobody else is waiting for. Unset = no cap.
    pub burst_allowance: Option<f64>,
    /// KAI-style deserved quota (nodes): when any tenant sets one, f3's targets are the tenants' fair
    /// shares of the pool computed from current demand ([`crate::kai`]).
    pub deserved_nodes: Option<f64>,
    /// KAI over-quota weight (default 1).
    pub over_quota_weight: Option<f64>,
}

/// A project's contract within its tenant (book: "Entity Mapping": a Waldur project is a Lattice
/// project): its own hard limits, enforced with its tenant's (an allocation must fit both), and its own
/// soft budgets (the worse of the tenant's and the project's penalty applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProjectQuota {
    /// Hard: nodes the project may hold at once (quorum-enforced).
    pub max_nodes: Option<u32>,
    /// Hard: running allocations of the project at once (quorum-enforced).
    pub max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period.
    pub gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    pub node_hours_budget: Option<f64>,
}

impl ProjectQuota {
    /// Whether it sets a hard limit.
    pub fn is_hard(&self) -> bool {
        self.max_nodes.is_some() || self.max_concurrent_allocations.is_some()
    }
}

/// Whose quota a rejection names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    #[default]
    Tenant,
    Project,
}

/// Which hard quota a proposal would break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HardQuota {
    MaxNodes,
    MaxConcurrentAllocations,
    SensitivePoolSize,
}

impl HardQuota {
    pub fn as_str(self) -> &'static str {
        match self {
            HardQuota::MaxNodes => "max_nodes",
            HardQuota::MaxConcurrentAllocations => "max_concurrent_allocations",
            HardQuota::SensitivePoolSize => "sensitive_pool_size",
        }
    }
}

/// A hard-quota rejection, worded as the seed's error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QuotaViolation {
    pub quota: HardQuota,
    /// Whose quota: the tenant's, or a project's (then `tenant` reads `tenant/project`).
    pub scope: QuotaScope,
    pub tenant: String,
    pub current: u64,
    pub requested: u64,
    pub limit: u64,
}

impl std::fmt::Display for QuotaViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.quota {
            HardQuota::SensitivePoolSize => write!(
                f,
                "allocation rejected: sensitive pool would exceed sensitive_pool_size (current: {}, requested: {}, limit: {})",
                self.current, self.requested, self.limit
            ),
            q => write!(
                f,
                "allocation rejected: {} \"{}\" would exceed {} quota (current: {}, requested: {}, limit: {})",
                match self.scope {
                    QuotaScope::Tenant => "tenant",
                    QuotaScope::Project => "project",
                },
                self.tenant,
                q.as_str(),
                self.current,
                self.requested,
                self.limit
            ),
        }
    }
}

/// Checks one proposal against hard quotas given the tenant's committed usage.
pub fn check_hard(
    tenant: &str,
    quota: &TenantQuota,
    nodes_held: u64,
    allocs_running: u64,
    requested_nodes: u64,
) -> Result<(), QuotaViolation> {
    let limits = (quota.max_nodes, quota.max_concurrent_allocations);
    check_limits(
        QuotaScope::Tenant,
        tenant,
        limits,
        nodes_held,
        allocs_running,
        requested_nodes,
    )
}

/// Checks one proposal against a project's hard quotas given the project's committed usage; the
/// rejection names `tenant/project`.
pub fn check_project(
    tenant: &str,
    project: &str,
    quota: &ProjectQuota,
    nodes_held: u64,
    allocs_running: u64,
    requested_nodes: u64,
) -> Result<(), QuotaViolation> {
    let limits = (quota.max_nodes, quota.max_concurrent_allocations);
    let name = format!("{tenant}/{project}");
    check_limits(
        QuotaScope::Project,
        &name,
        limits,
        nodes_held,
        allocs_running,
        requested_nodes,
    )
}

fn check_limits(
    scope: QuotaScope,
    name: &str,
    (max_nodes, max_allocs): (Option<u32>, Option<u32>),
    nodes_held: u64,
    allocs_running: u64,
    requested_nodes: u64,
) -> Result<(), QuotaViolation> {
    if let Some(limit) = max_nodes
        && nodes_held + requested_nodes > limit as u64
    {
        return Err(QuotaViolation {
            quota: HardQuota::MaxNodes,
            scope,
            tenant: name.to_string(),
            current: nodes_held,
            requested: requested_nodes,
            limit: limit as u64,
        });
    }
    if let Some(limit) = max_allocs
        && allocs_running + 1 > limit as u64
    {
        return Err(QuotaViolation {
            quota: HardQuota::MaxConcurrentAllocations,
            scope,
            tenant: name.to_string(),
            current: allocs_running,
            requested: 1,
            limit: limit as u64,
        });
    }
    Ok(())
}

/// The soft budget penalty subtracted from the score: 0 up to 80 % of the budget used, rising linearly
/// to 1 at 100 %, and 10 (effective starvation, not rejection) beyond.
pub fn budget_penalty(used_fraction: f64) -> f64 {
    if used_fraction <= 0.8 {
        0.0
    } else if used_fraction < 1.0 {
        (used_fraction - 0.8) / 0.2
    } else {
        10.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_reads_like_the_seed() {
        let q = TenantQuota {
            max_nodes: Some(200),
            ..Default::default()
        };
        let e = check_hard("physics", &q, 195, 3, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "allocation rejected: tenant \"physics\" would exceed max_nodes quota (current: 195, requested: 10, limit: 200)"
        );
        assert!(check_hard("physics", &q, 190, 3, 10).is_ok());
        let c = TenantQuota {
            max_concurrent_allocations: Some(3),
            ..Default::default()
        };
        assert_eq!(
            check_hard("bio", &c, 0, 3, 1).unwrap_err().quota,
            HardQuota::MaxConcurrentAllocations
        );
        let p = ProjectQuota {
            max_nodes: Some(8),
            ..Default::default()
        };
        assert_eq!(
            check_project("physics", "qcd", &p, 6, 1, 4).unwrap_err().to_string(),
            "allocation rejected: project \"physics/qcd\" would exceed max_nodes quota (current: 6, requested: 4, limit: 8)"
        );
        assert!(check_project("physics", "qcd", &p, 4, 1, 4).is_ok());
    }

    #[test]
    fn penalty_ramp() {
        assert_eq!(budget_penalty(0.5), 0.0);
        assert_eq!(budget_penalty(0.8), 0.0);
        assert!((budget_penalty(0.9) - 0.5).abs() < 1e-12);
        assert_eq!(budget_penalty(1.0), 10.0);
    }
}
