//! The fake quorum: commits the engine's proposals after a configurable latency and validates them the way
//! the Raft state machine does — a node has one owner, and hard quotas (`max_nodes`,
//! `max_concurrent_allocations` per tenant and per project, `sensitive_pool_size` system-wide) can never
//! be exceeded.
//! The first proposal to commit wins; a later conflicting one is rejected (the engine requeues it and its
//! scheduler retries next cycle).

use lattice_engine::{AllocId, Engine, NodeId, Proposal, TenantQuota, quota::check_hard, quota::check_project};
use std::collections::BTreeMap;

/// At most this many rejection messages are kept (all are counted).
const EXAMPLES_KEPT: usize = 20;

/// A committed allocation: whose, how many nodes, sensitive or not, and the nodes themselves.
#[derive(Debug)]
struct Held {
    tenant: usize,
    project: usize,
    count: u64,
    sensitive: bool,
    nodes: Vec<NodeId>,
}

#[derive(Debug)]
pub struct FakeQuorum {
    owner: Vec<Option<AllocId>>,
    pending: Vec<(AllocId, Vec<NodeId>)>,
    committed: BTreeMap<AllocId, Held>,
    nodes_held: Vec<u64>,
    allocs_running: Vec<u64>,
    /// Per project: (nodes held, allocations running).
    project_held: Vec<(u64, u64)>,
    /// Projects' names by id (`tenant/project` reads better in a rejection than an id).
    pub project_names: Vec<String>,
    sensitive_held: u64,
    sensitive_pool_size: Option<u32>,
    pub commits: u64,
    pub rejections: u64,
    pub rejections_by_reason: BTreeMap<String, u64>,
    pub rejection_examples: Vec<String>,
    /// The sensitive audit log (claim, release, wipe, quarantine), hash-chained.
    pub audit: crate::audit::AuditLog,
}

impl FakeQuorum {
    pub fn new(nodes: usize, sensitive_pool_size: Option<u32>) -> FakeQuorum {
        FakeQuorum {
            owner: vec![None; nodes],
            pending: Vec::new(),
            committed: BTreeMap::new(),
            nodes_held: Vec::new(),
            allocs_running: Vec::new(),
            project_held: Vec::new(),
            project_names: Vec::new(),
            sensitive_held: 0,
            sensitive_pool_size,
            commits: 0,
            rejections: 0,
            rejections_by_reason: BTreeMap::new(),
            rejection_examples: Vec::new(),
            audit: crate::audit::AuditLog::default(),
        }
    }

    /// A node joined the site (the next id).
    pub fn add_node(&mut self) {
        self.owner.push(None);
    }

    /// Records a proposal to be decided at commit time.
    pub fn propose(&mut self, p: Proposal) {
        self.pending.push((p.alloc, p.nodes));
    }

    fn reject(&mut self, reason: &str, message: String) -> bool {
        self.rejections += 1;
        *self.rejections_by_reason.entry(reason.to_string()).or_default() += 1;
        if self.rejection_examples.len() < EXAMPLES_KEPT {
            self.rejection_examples.push(message);
        }
        false
    }

    /// Decides the proposal of `alloc`: `true` = committed (ownership recorded).
    pub fn decide(&mut self, engine: &Engine, alloc: AllocId) -> bool {
        let Some(i) = self.pending.iter().position(|p| p.0 == alloc) else {
            return false;
        };
        let (_, nodes) = self.pending.swap_remove(i);
        let conflict = nodes
            .iter()
            .find(|n| self.owner[n.index()].is_some() || !engine.node(**n).is_some_and(|x| x.state.runs_allocations()));
        if let Some(n) = conflict {
            return self.reject(
                "node_conflict",
                format!("allocation rejected: node {n} is already owned or not available"),
            );
        }
        let a = engine.allocation(alloc).expect("proposed allocation exists");
        let t = a.spec.tenant.index();
        while self.nodes_held.len() <= t {
            self.nodes_held.push(0);
            self.allocs_running.push(0);
        }
        let name = engine.tenant(a.spec.tenant).map(|x| x.name).unwrap_or_default();
        let quota: TenantQuota = engine.tenant_quota(a.spec.tenant).copied().unwrap_or_default();
        let k = nodes.len() as u64;
        if let Err(v) = check_hard(&name, &quota, self.nodes_held[t], self.allocs_running[t], k) {
            return self.reject(v.quota.as_str(), v.to_string());
        }
        let p = a.spec.project.index();
        if self.project_held.len() <= p {
            self.project_held.resize(p + 1, (0, 0));
        }
        if let Some(pq) = engine.project_quota(a.spec.project).filter(|q| q.is_hard()) {
            let project = self.project_names.get(p).map_or_else(|| p.to_string(), Clone::clone);
            let (held, running) = self.project_held[p];
            if let Err(v) = check_project(&name, &project, pq, held, running, k) {
                return self.reject(v.quota.as_str(), v.to_string());
            }
        }
        let sensitive = engine.is_sensitive(alloc);
        if sensitive
            && let Some(size) = self.sensitive_pool_size
            && self.sensitive_held + k > size as u64
        {
            let v = lattice_engine::QuotaViolation {
                quota: lattice_engine::HardQuota::SensitivePoolSize,
                scope: lattice_engine::QuotaScope::Tenant,
                tenant: name,
                current: self.sensitive_held,
                requested: k,
                limit: size as u64,
            };
            return self.reject(v.quota.as_str(), v.to_string());
        }
        for n in &nodes {
            self.owner[n.index()] = Some(alloc);
        }
        self.nodes_held[t] += k;
        self.allocs_running[t] += 1;
        self.project_held[p].0 += k;
        self.project_held[p].1 += 1;
        if sensitive {
            self.sensitive_held += k;
        }
        let held = Held {
            tenant: t,
            project: p,
            count: k,
            sensitive,
            nodes: nodes.clone(),
        };
        self.committed.insert(alloc, held);
        self.commits += 1;
        true
    }

    /// The autoscaler added (or removed) a node of a committed allocation.
    pub fn scale(&mut self, alloc: AllocId, node: NodeId, added: bool) {
        let Some(entry) = self.committed.get_mut(&alloc) else {
            return;
        };
        let (t, p) = (entry.tenant, entry.project);
        if added {
            self.owner[node.index()] = Some(alloc);
            entry.count += 1;
            entry.nodes.push(node);
            self.nodes_held[t] += 1;
            self.project_held[p].0 += 1;
        } else {
            if self.owner[node.index()] == Some(alloc) {
                self.owner[node.index()] = None;
            }
            entry.count -= 1;
            entry.nodes.retain(|&n| n != node);
            self.nodes_held[t] -= 1;
            self.project_held[p].0 -= 1;
        }
    }

    /// The allocation ended (or, under pyss, reached its estimated end): its nodes are released.
    pub fn release(&mut self, _engine: &Engine, alloc: AllocId) {
        if let Some(h) = self.committed.remove(&alloc) {
            for n in &h.nodes {
                if self.owner[n.index()] == Some(alloc) {
                    self.owner[n.index()] = None;
                }
            }
            self.nodes_held[h.tenant] -= h.count;
            self.allocs_running[h.tenant] -= 1;
            self.project_held[h.project].0 -= h.count;
            self.project_held[h.project].1 -= 1;
            if h.sensitive {
                self.sensitive_held -= h.count;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_engine::{AllocSpec, Duration, EngineConfig, NodeSpec, Policy, Time};

    /// Two proposals for the same node: the first to commit wins, the second is rejected as a conflict.
    #[test]
    fn first_commit_wins_on_node_conflict() {
        let mut e = Engine::new(
            EngineConfig::new(Policy::EASY),
            vec![NodeSpec::plain("n0"), NodeSpec::plain("n1")],
        )
        .unwrap();
        let t = e.add_tenant("t");
        let v = e.add_vcluster("v");
        let a = e
            .handle_submit(Time(0), AllocSpec::simple(t, v, 1, Duration::from_secs(10)))
            .unwrap();
        let b = e
            .handle_submit(Time(0), AllocSpec::simple(t, v, 1, Duration::from_secs(10)))
            .unwrap();
        let mut q = FakeQuorum::new(2, None);
        // Two schedulers with stale views both chose node 0.
        q.propose(Proposal {
            alloc: a,
            nodes: vec![NodeId(0)],
            backfilled: false,
        });
        q.propose(Proposal {
            alloc: b,
            nodes: vec![NodeId(0)],
            backfilled: false,
        });
        assert!(q.decide(&e, a));
        assert!(!q.decide(&e, b));
        assert_eq!(q.rejections_by_reason.get("node_conflict"), Some(&1));
        q.release(&e, a);
    }
}
