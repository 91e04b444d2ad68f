//! The sans-I/O engine: `handle_*(now, ..)` inputs, `poll_proposal()` outputs, `schedule(now)` passes.
//!
//! Drivers (the simulator, the production runtime) own the clock, the quorum and the nodes; the engine owns
//! the decisions. A pass starts allocations by *proposing* them: their nodes are held at once, and the
//! allocation becomes `Running` when the driver reports the quorum's commit (`handle_commit`) or goes back to
//! the queue on a reject (`handle_reject`).
//!
//! **Pools.** Each vCluster schedules its own nodes (those whose home is that vCluster) with its own
//! [`VClusterConfig`]. Nodes without a home form the shared pool, scheduled in one pass for all vClusters
//! that have no nodes of their own (each allocation still scored with its own vCluster's weights).

use crate::alloc::{AllocState, Allocation, DependencyCondition, EndReason};
use crate::broker::BrokerConfig;
use crate::classes::{ClassInfo, ClassKey};
use crate::error::EngineError;
use crate::fairshare::{FairShareConfig, UsageLedger};
use crate::ids::{AllocId, NodeId, ProjectId, TenantId, VClusterId};
pub(crate) use crate::meta::{Meta, MetaTable};
use crate::node::{Node, NodeCapabilities, NodeSpec, NodeState, Owner};
use crate::nodeset::NodeSet;
use crate::policy::{Policy, VClusterConfig};
use crate::preempt::{Command, PreemptionConfig};
use crate::profile::Picks;
use crate::quota::{ProjectQuota, TenantQuota};
use crate::tenant::{Registry, Tenant, VCluster};
use crate::time::{Clock, Time};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// An allocation's request fields that a pass's filters read for every queued or running
/// allocation (its vCluster, preemption class and whether it checkpoints), kept in one array.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hot {
    pub vcluster: u32,
    pub class: u8,
    pub checkpoints: bool,
}

/// Site-wide engine configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Policy of vClusters that get no [`VClusterConfig`] (and of the shared pool when several vClusters
    /// share it).
    pub policy: Policy,
    /// Cluster power budget (knapsack dimension "power"), watts of busy nodes.
    pub power_budget_w: Option<u64>,
    /// Storage bandwidth the running allocations may use together, GB/s.
    pub storage_bandwidth_gbps: Option<f64>,
    /// Electricity price series `(from, price)`, a step function (f7).
    pub energy_prices: Vec<(Time, f64)>,
    /// Usage decay for fair share (f3).
    pub fair_share: FairShareConfig,
    /// Hard, system-wide: nodes that allocations of `reservation` (sensitive) vClusters may hold.
    pub sensitive_pool_size: Option<u32>,
    /// Prologue failures an allocation is retried after (on other nodes) before it fails (default 3).
    pub max_prologue_retries: u32,
}

impl EngineConfig {
    pub fn new(policy: Policy) -> EngineConfig {
        EngineConfig {
            policy,
            power_budget_w: None,
            storage_bandwidth_gbps: None,
            energy_prices: Vec::new(),
            fair_share: FairShareConfig::default(),
            sensitive_pool_size: None,
            max_prologue_retries: 3,
        }
    }
}

/// "Give these nodes to this allocation": the engine's request to the quorum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub alloc: AllocId,
    pub nodes: Vec<NodeId>,
    /// Started ahead of an earlier-queued allocation that still waits.
    pub backfilled: bool,
}

/// A future start the last pass promised to a blocked allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub alloc: AllocId,
    pub start: Time,
    /// The pass that made it. A pool's reservations stand until its next pass, so one made earlier may
    /// start in the past when the running estimates it rests on have passed without an event (an
    /// allocation still awaiting its commit under quorum latency).
    pub made: Time,
    /// `None` for allocations without a walltime.
    pub end: Option<Time>,
    /// Nodes per node class (a class lies in one group and one conformance group).
    pub picks: Picks,
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// False when no pool had a pass due.
    pub ran: bool,
    pub started: u32,
    pub backfilled: u32,
    pub reservations: u32,
    /// Allocations kept waiting for a cheaper energy window (f7).
    pub deferred: u32,
    /// Allocations kept waiting for a placement in fewer groups (f4).
    pub deferred_topology: u32,
    /// Preemption commands issued.
    pub preemptions: u32,
    /// Allocations started on borrowed nodes.
    pub borrowed: u32,
    /// Checkpoint hints the broker issued.
    pub checkpoint_hints: u32,
}

/// One scheduler instance: a vCluster's nodes, queue and settings.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    pub config: VClusterConfig,
    pub vclusters: Vec<VClusterId>,
    /// Pending allocations whose dependencies are met, in arrival order (the pass reorders a copy).
    pub queue: Vec<AllocId>,
    /// A pass is due at this time (the next cycle tick after an input).
    pub due_at: Option<Time>,
    pub reservations: Vec<Reservation>,
    pub has_gpus: bool,
}

impl Pool {
    fn empty(policy: Policy) -> Pool {
        Pool {
            config: VClusterConfig::new(policy),
            vclusters: Vec::new(),
            queue: Vec::new(),
            due_at: None,
            reservations: Vec::new(),
            has_gpus: false,
        }
    }
}

/// A project's contract and what its quotas count (committed nodes and allocations, node- and
/// GPU-seconds of its ended allocations).
#[derive(Clone, Debug, Default)]
pub(crate) struct ProjectBook {
    /// Its tenant (set by its first submission or its quota).
    pub(crate) tenant: Option<usize>,
    pub(crate) quota: ProjectQuota,
    pub(crate) committed_nodes: u64,
    pub(crate) committed_allocs: u64,
    pub(crate) consumed_node_s: f64,
    pub(crate) consumed_gpu_s: f64,
}

/// The scheduling engine. See the crate docs for the contract.
#[derive(Clone, Debug)]
pub struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) clock: Clock,
    pub(crate) nodes: Vec<Node>,
    pub(crate) class_of: Vec<u16>,
    pub(crate) class_info: Vec<ClassInfo>,
    pub(crate) class_keys: Vec<ClassKey>,
    pub(crate) class_total: Vec<u32>,
    /// Nodes that are `Ready` and unowned.
    pub(crate) free: NodeSet,
    pub(crate) free_by_class: Vec<u32>,
    /// Nodes that are not schedulable (down, draining, drained, ...).
    pub(crate) nodes_not_ready: BTreeSet<NodeId>,
    /// New capabilities of held nodes, taken when they are released ([`Engine::set_capabilities`]).
    pub(crate) pending_caps: BTreeMap<NodeId, NodeCapabilities>,
    pub(crate) allocs: Vec<Allocation>,
    pub(crate) meta: MetaTable,
    /// What a pass's filters read of every queued or running allocation's request, by allocation
    /// index, beside the request itself (which lives behind a shared pointer).
    pub(crate) hot: Vec<Hot>,
    /// Pools by key: 0 = shared (nodes without a home), `v + 1` = home nodes of vCluster `v`.
    pub(crate) pools: BTreeMap<u32, Pool>,
    pub(crate) pool_of_vc: Vec<u32>,
    pub(crate) vc_config: Vec<VClusterConfig>,
    /// Allocations holding nodes with a finite estimated end, by (estimated end, id).
    pub(crate) running: crate::running::RunningSet,
    /// Allocations without a walltime that hold nodes (they are not in `running`): the claim's
    /// victim search reads them here instead of scanning every allocation ever submitted.
    pub(crate) unbounded_holding: BTreeSet<AllocId>,
    pub(crate) proposals: VecDeque<Proposal>,
    pub(crate) commands: VecDeque<Command>,
    /// Sensitive claims refused since [`Engine::take_claim_refusals`] last took them.
    pub(crate) claim_refusals: Vec<(AllocId, crate::refusal::ClaimRefusal)>,
    /// Running (or proposed) elements per task group, and holders of mutex names.
    pub(crate) group_running: BTreeMap<u64, u32>,
    pub(crate) mutex_held: BTreeMap<String, AllocId>,
    pub(crate) scale_state: BTreeMap<AllocId, crate::autoscale::ScaleState>,
    pub(crate) autoscale_next: Option<Time>,
    pub(crate) autoscale_until: Option<Time>,
    pub(crate) scale_log: Vec<(AllocId, NodeId, bool)>,
    /// What the autoscaler did in the last `schedule` call.
    pub(crate) last_scale_stats: crate::autoscale::ScaleStats,
    /// A monotonic nanosecond counter the caller lends for measuring the cost function (never
    /// read by a decision; `None`: nothing is measured).
    pub(crate) stopwatch: Option<fn() -> u64>,
    /// (pool, nanoseconds) of each scored pass's cost-function evaluation since the last take.
    pub(crate) cost_ns: Vec<(u32, u64)>,
    pub(crate) staging: BTreeMap<AllocId, crate::staging::StagingState>,
    pub(crate) staging_last: Time,
    pub(crate) staging_next: Option<Time>,
    pub(crate) staging_alerts: u64,
    pub(crate) vast_write_gbps: f64,
    pub(crate) preemption: PreemptionConfig,
    pub(crate) broker: BrokerConfig,
    /// GPU memory per GPU by node, GB, where agents reported it (else `broker.gpu_memory_gb`).
    pub(crate) gpu_memory_gb: BTreeMap<NodeId, f64>,
    pub(crate) broker_next: Option<Time>,
    pub(crate) storage_available: bool,
    pub(crate) dependents: BTreeMap<AllocId, Vec<AllocId>>,
    pub(crate) tenants: Registry,
    pub(crate) tenant_target: Vec<Option<f64>>,
    /// Decayed fair-share usage per tenant, and per project (the hierarchy's second level).
    pub(crate) ledger: UsageLedger,
    pub(crate) project_ledger: UsageLedger,
    /// Every project seen or given a quota (projects are global ids, each in one tenant), in id order.
    pub(crate) projects: Vec<ProjectBook>,
    /// Some vCluster orders by score: only then does the fair-share ledger (read by f3) need updates.
    pub(crate) scored_any: bool,
    pub(crate) tenant_quota: Vec<TenantQuota>,
    /// Committed (running) nodes and allocations per tenant: the quorum's view of hard quotas.
    pub(crate) committed_nodes: Vec<u64>,
    pub(crate) committed_allocs: Vec<u64>,
    /// Node- and GPU-seconds of ended allocations per tenant (soft budgets).
    pub(crate) consumed_node_s: Vec<f64>,
    pub(crate) consumed_gpu_s: Vec<f64>,
    /// Proposals not yet committed or rejected.
    pub(crate) outstanding: Vec<AllocId>,
    /// Nodes held by running allocations of `reservation` pools.
    pub(crate) sensitive_nodes: u64,
    pub(crate) vclusters: Registry,
    pub(crate) gpu_hours_committed: Vec<f64>,
    pub(crate) power_used_w: u64,
    pub(crate) storage_used_gbps: f64,
    pub(crate) passes: u64,
    /// Allocations that ended since the last [`Engine::take_ended`] (`None`: not kept).
    pub(crate) ended_log: Option<Vec<AllocId>>,
}

impl Engine {
    /// An engine over `nodes` (ids are assigned in the given order, from 0). A node's `home_vcluster`
    /// refers to the id the vCluster will get from [`Engine::add_vcluster`] (register names in order).
    pub fn new(config: EngineConfig, nodes: Vec<NodeSpec>) -> Result<Engine, EngineError> {
        let mut index: BTreeMap<ClassKey, u16> = BTreeMap::new();
        let mut class_keys: Vec<ClassKey> = Vec::new();
        let mut class_info: Vec<ClassInfo> = Vec::new();
        let mut class_of = Vec::with_capacity(nodes.len());
        let mut free = NodeSet::new(nodes.len());
        let mut class_total = Vec::new();
        let mut free_by_class = Vec::new();
        let mut nodes_not_ready = BTreeSet::new();
        let mut pools: BTreeMap<u32, Pool> = BTreeMap::new();
        let nodes: Vec<Node> = nodes
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let pool = spec.home_vcluster.map_or(0, |v| v.0 + 1);
                let key = ClassKey {
                    pool,
                    capabilities: spec.capabilities.clone(),
                    group: spec.group,
                    conformance: spec.conformance,
                };
                let c = *index.entry(key.clone()).or_insert_with(|| {
                    class_info.push(ClassInfo {
                        group: spec.group,
                        conformance: spec.conformance,
                        power_w: spec.capabilities.power_w,
                        gpus: spec.capabilities.gpu_count,
                    });
                    class_keys.push(key);
                    class_total.push(0);
                    free_by_class.push(0);
                    (class_keys.len() - 1) as u16
                });
                let p = pools.entry(pool).or_insert_with(|| Pool::empty(config.policy));
                p.has_gpus |= spec.capabilities.gpu_count > 0;
                class_of.push(c);
                class_total[c as usize] += 1;
                let id = NodeId(i as u32);
                if spec.state.schedulable() {
                    free.insert(id);
                    free_by_class[c as usize] += 1;
                } else {
                    nodes_not_ready.insert(id);
                }
                Node {
                    id,
                    state: spec.state,
                    spec,
                    owner: None,
                }
            })
            .collect();
        if config.policy == Policy::PyssEasy && class_keys.len() > 1 {
            return Err(EngineError::PyssHeterogeneous(class_keys.len()));
        }
        let ledger = UsageLedger::new(config.fair_share);
        let config_fair_share = config.fair_share;
        let single_pool = pools.len() == 1;
        Ok(Engine {
            config,
            clock: Clock::default(),
            nodes,
            class_of,
            class_info,
            class_keys,
            class_total,
            free,
            free_by_class,
            nodes_not_ready,
            pending_caps: BTreeMap::new(),
            allocs: Vec::new(),
            meta: MetaTable::default(),
            hot: Vec::new(),
            pools,
            pool_of_vc: Vec::new(),
            vc_config: Vec::new(),
            running: crate::running::RunningSet::new(single_pool),
            unbounded_holding: BTreeSet::new(),
            proposals: VecDeque::new(),
            commands: VecDeque::new(),
            group_running: BTreeMap::new(),
            mutex_held: BTreeMap::new(),
            scale_state: BTreeMap::new(),
            autoscale_next: None,
            autoscale_until: None,
            scale_log: Vec::new(),
            last_scale_stats: Default::default(),
            stopwatch: None,
            cost_ns: Vec::new(),
            staging: BTreeMap::new(),
            staging_last: Time::ZERO,
            staging_next: None,
            staging_alerts: 0,
            vast_write_gbps: 100.0,
            preemption: PreemptionConfig::default(),
            broker: BrokerConfig::default(),
            gpu_memory_gb: BTreeMap::new(),
            broker_next: None,
            storage_available: true,
            dependents: BTreeMap::new(),
            tenants: Registry::default(),
            tenant_target: Vec::new(),
            project_ledger: UsageLedger::new(config_fair_share),
            projects: Vec::new(),
            ledger,
            scored_any: false,
            tenant_quota: Vec::new(),
            committed_nodes: Vec::new(),
            committed_allocs: Vec::new(),
            consumed_node_s: Vec::new(),
            consumed_gpu_s: Vec::new(),
            outstanding: Vec::new(),
            sensitive_nodes: 0,
            claim_refusals: Vec::new(),
            vclusters: Registry::default(),
            gpu_hours_committed: Vec::new(),
            power_used_w: 0,
            storage_used_gbps: 0.0,
            passes: 0,
            ended_log: None,
        })
    }

    // ----- registries and configuration ---------------------------------------------------------------

    /// Moves every allocation's start score out (a replay that has ended writes them once instead of
    /// holding a second copy), in allocation order.
    pub fn take_start_scores(&mut self) -> Vec<(AllocId, Box<crate::cost::ScoreBreakdown>)> {
        self.allocs
            .iter_mut()
            .filter_map(|a| Some((a.id, a.start_score.take()?)))
            .collect()
    }

    /// Room for `additional` more allocations, made now: a caller that knows how many will arrive (a
    /// replay knows its trace) spares the lists' doubling slack, up to as much again.
    pub fn reserve_allocations(&mut self, additional: usize) {
        self.allocs.reserve_exact(additional);
        self.hot.reserve_exact(additional);
    }

    /// From now on, note every allocation that ends (completes, fails or is cancelled) for
    /// [`Engine::take_ended`]: a replay takes each one's record as it ends.
    pub fn track_ended(&mut self) {
        self.ended_log.get_or_insert_with(Vec::new);
    }

    /// The allocations that ended since the last call, in the order they ended (empty unless
    /// [`Engine::track_ended`] was called).
    pub fn take_ended(&mut self) -> Vec<AllocId> {
        self.ended_log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Moves an ended allocation's node list out (a replay that kept it elsewhere, compactly, frees
    /// the engine's copy); empty for an allocation that has not ended, and for a sensitive one (its
    /// wipes and audit entries name its nodes after its end).
    pub fn take_nodes(&mut self, id: AllocId) -> Vec<NodeId> {
        if self.is_sensitive(id) {
            return Vec::new();
        }
        match self.allocs.get_mut(id.index()) {
            Some(a) if a.state.is_terminal() => std::mem::take(&mut a.nodes),
            _ => Vec::new(),
        }
    }

    pub fn add_tenant(&mut self, name: &str) -> TenantId {
        let id = TenantId(self.tenants.intern(name));
        while self.tenant_target.len() < self.tenants.len() {
            self.tenant_target.push(None);
            self.tenant_quota.push(TenantQuota::default());
            self.committed_nodes.push(0);
            self.committed_allocs.push(0);
            self.consumed_node_s.push(0.0);
            self.consumed_gpu_s.push(0.0);
        }
        id
    }

    /// The tenant's contracted share in (0, 1] (f3's target); tenants without one share what the others
    /// leave equally.
    pub fn set_tenant_share(&mut self, tenant: TenantId, share: f64) {
        if let Some(t) = self.tenant_target.get_mut(tenant.index()) {
            *t = Some(share.clamp(0.0, 1.0));
            // A contracted share makes fair-share accounting worth keeping.
            self.scored_any = true;
        }
    }

    /// Sets the preemption settings (victim cap, near-completion protection, checkpoint timeout).
    pub fn set_preemption(&mut self, config: PreemptionConfig) {
        self.preemption = config;
    }

    pub fn preemption_config(&self) -> PreemptionConfig {
        self.preemption
    }

    /// Sets a tenant's quotas (its `fair_share_target`, if given, becomes its f3 target).
    pub fn set_tenant_quota(&mut self, tenant: TenantId, quota: TenantQuota) {
        if let Some(q) = self.tenant_quota.get_mut(tenant.index()) {
            *q = quota;
            if let Some(t) = quota.fair_share_target {
                self.tenant_target[tenant.index()] = Some(t.clamp(0.0, 1.0));
            }
        }
    }

    /// Sets a project's quotas (its hard limits apply with its tenant's; its budgets' penalty with
    /// the tenant's, the worse of the two).
    pub fn set_project_quota(&mut self, project: ProjectId, tenant: TenantId, quota: ProjectQuota) {
        let p = self.project_book(project);
        p.tenant = Some(tenant.index());
        p.quota = quota;
    }

    pub fn project_quota(&self, project: ProjectId) -> Option<&ProjectQuota> {
        self.projects.get(project.index()).map(|p| &p.quota)
    }

    /// Committed nodes and running allocations of a project (what its hard quotas count).
    pub fn project_committed(&self, project: ProjectId) -> (u64, u64) {
        self.projects
            .get(project.index())
            .map_or((0, 0), |p| (p.committed_nodes, p.committed_allocs))
    }

    pub(crate) fn project_book(&mut self, project: ProjectId) -> &mut ProjectBook {
        let p = project.index();
        if self.projects.len() <= p {
            self.projects.resize(p + 1, ProjectBook::default());
        }
        &mut self.projects[p]
    }

    pub fn tenant_quota(&self, tenant: TenantId) -> Option<&TenantQuota> {
        self.tenant_quota.get(tenant.index())
    }

    /// Committed nodes and running allocations of a tenant (what hard quotas count).
    pub fn tenant_committed(&self, tenant: TenantId) -> (u64, u64) {
        (
            self.committed_nodes.get(tenant.index()).copied().unwrap_or(0),
            self.committed_allocs.get(tenant.index()).copied().unwrap_or(0),
        )
    }

    /// Nodes of `id` outside its own vCluster's pool (borrowed).
    pub fn borrowed_nodes(&self, id: AllocId) -> u32 {
        if self.pools.len() == 1 {
            return 0;
        }
        let Some(a) = self.allocs.get(id.index()) else { return 0 };
        self.borrowed_among(id, &a.nodes)
    }

    /// How many of `nodes` are outside allocation `id`'s home pool ([`Engine::borrowed_nodes`] of a
    /// node list kept outside the engine).
    pub fn borrowed_among(&self, id: AllocId, nodes: &[NodeId]) -> u32 {
        if self.pools.len() == 1 {
            return 0;
        }
        let Some(a) = self.allocs.get(id.index()) else { return 0 };
        let own = self.pool_of_vc[a.spec.vcluster.index()];
        nodes
            .iter()
            .filter(|n| self.class_keys[self.class_of[n.index()] as usize].pool != own)
            .count() as u32
    }

    /// Is this a sensitive node: held by a sensitive allocation, or at home in a sensitive
    /// (`reservation`) vCluster?
    pub fn is_sensitive_node(&self, node: NodeId) -> bool {
        let Some(n) = self.node(node) else { return false };
        n.owner.is_some_and(|o| self.is_sensitive(o.alloc))
            || n.spec.home_vcluster.is_some_and(|vc| {
                self.pool_of_vc
                    .get(vc.index())
                    .and_then(|p| self.pools.get(p))
                    .is_some_and(|p| p.config.policy == Policy::Reservation)
            })
    }

    /// Does this allocation belong to a sensitive (`reservation`) vCluster?
    pub fn is_sensitive(&self, id: AllocId) -> bool {
        self.allocs.get(id.index()).is_some_and(|a| {
            a.spec.sensitive_claim
                || self
                    .pools
                    .get(&self.pool_of_vc[a.spec.vcluster.index()])
                    .is_some_and(|p| p.config.policy == Policy::Reservation)
        })
    }

    /// Registers a vCluster. It schedules its home nodes if it has any, else the shared pool.
    pub fn add_vcluster(&mut self, name: &str) -> VClusterId {
        let id = VClusterId(self.vclusters.intern(name));
        while self.pool_of_vc.len() < self.vclusters.len() {
            let v = self.pool_of_vc.len() as u32;
            let key = if self.pools.contains_key(&(v + 1)) { v + 1 } else { 0 };
            let new_pool = !self.pools.contains_key(&key);
            let pool = self.pools.entry(key).or_insert_with(|| Pool::empty(self.config.policy));
            pool.vclusters.push(VClusterId(v));
            self.pool_of_vc.push(key);
            if new_pool {
                self.second_pool();
            }
            self.vc_config.push(VClusterConfig::new(self.config.policy));
            self.gpu_hours_committed.push(0.0);
        }
        id
    }

    /// A pool was added: with two, the running set files its entries per pool from now on.
    fn second_pool(&mut self) {
        if self.running.single_pool() && self.pools.len() > 1 {
            let entries: Vec<(Time, AllocId)> = self.running.iter().copied().collect();
            self.running = crate::running::RunningSet::new(false);
            for (t, a) in entries {
                self.add_running(t, a);
            }
        }
    }

    /// A node joins the running site at `now` (the inventory gained it: book, "Bootstrap Sequence":
    /// nodes are registered in SMD, which the scheduler reads periodically). It gets the next id, joins
    /// its class (a new one if no node is like it) and pool, and — if its state is `Ready` — the free
    /// set; its pool runs a pass at the next cycle tick. Refused, with nothing changed: a name already
    /// in the inventory; a home vCluster that already schedules on the shared pool (it got no home
    /// nodes at the start); a second node class under the pyss-compatible policy.
    pub fn add_node(&mut self, now: Time, spec: NodeSpec) -> Result<NodeId, EngineError> {
        if self.nodes.iter().any(|n| n.spec.name == spec.name) {
            return Err(EngineError::DuplicateNode(spec.name));
        }
        let pool = spec.home_vcluster.map_or(0, |v| v.0 + 1);
        if let Some(v) = spec.home_vcluster
            && self.pool_of_vc.get(v.index()).is_some_and(|&k| k != pool)
        {
            return Err(EngineError::HomeAfterStart {
                node: spec.name,
                vcluster: v,
            });
        }
        let key = ClassKey {
            pool,
            capabilities: spec.capabilities.clone(),
            group: spec.group,
            conformance: spec.conformance,
        };
        let c = self.class_for(key)?;
        self.clock.advance(now);
        let policy = self.config.policy;
        let new_pool = !self.pools.contains_key(&pool);
        self.pools.entry(pool).or_insert_with(|| Pool::empty(policy)).has_gpus |= spec.capabilities.gpu_count > 0;
        if new_pool {
            self.second_pool();
        }
        let id = NodeId(self.nodes.len() as u32);
        self.class_of.push(c as u16);
        self.class_total[c] += 1;
        self.free.grow(self.nodes.len() + 1);
        if spec.state.schedulable() {
            self.free.insert(id);
            self.free_by_class[c] += 1;
        } else {
            self.nodes_not_ready.insert(id);
        }
        self.nodes.push(Node {
            id,
            state: spec.state,
            spec,
            owner: None,
        });
        self.mark_due(pool, now);
        Ok(id)
    }

    /// The class of nodes like `key`: an existing one, or a new one (allocations not ended that
    /// its capabilities satisfy may run on it, or borrow it). Refused under the pyss-compatible
    /// policy, which schedules one class only.
    fn class_for(&mut self, key: ClassKey) -> Result<usize, EngineError> {
        if let Some(c) = self.class_keys.iter().position(|k| *k == key) {
            return Ok(c);
        }
        self.class_admissible(&key)?;
        self.class_info.push(ClassInfo {
            group: key.group,
            conformance: key.conformance,
            power_w: key.capabilities.power_w,
            gpus: key.capabilities.gpu_count,
        });
        self.class_keys.push(key);
        self.class_total.push(0);
        self.free_by_class.push(0);
        let c = self.class_keys.len() - 1;
        let key = &self.class_keys[c];
        for a in self.allocs.iter().filter(|a| a.ended.is_none()) {
            if a.spec.constraints.satisfied_by(&key.capabilities) {
                let m = &mut self.meta[a.id.index()];
                if self.pool_of_vc[a.spec.vcluster.index()] == key.pool {
                    m.eligible.push(c as u16);
                } else {
                    m.borrow_eligible.push(c as u16);
                }
            }
        }
        Ok(c)
    }

    /// Whether nodes like `key` may be scheduled: an existing class, or a new one unless the
    /// pyss-compatible policy (one class only) is in force.
    fn class_admissible(&self, key: &ClassKey) -> Result<(), EngineError> {
        let pyss =
            self.config.policy == Policy::PyssEasy || self.vc_config.iter().any(|c| c.policy == Policy::PyssEasy);
        if pyss && !self.class_keys.is_empty() && !self.class_keys.contains(key) {
            return Err(EngineError::PyssHeterogeneous(self.class_keys.len() + 1));
        }
        Ok(())
    }

    /// The node's capabilities are now `caps` (what its agent discovered where the inventory left
    /// them unset, as the quorum recorded it): it moves to the class of nodes like it, and its pool
    /// runs a pass (work that waited for such a node may start). A node that is held takes them
    /// when it is released (an allocation's resources are counted by the class it started on):
    /// `Ok(false)` until then. Refused, with nothing changed, under the pyss-compatible policy when
    /// no node is like it. The same capabilities again change nothing.
    pub fn set_capabilities(&mut self, now: Time, id: NodeId, caps: NodeCapabilities) -> Result<bool, EngineError> {
        let n = self.nodes.get(id.index()).ok_or(EngineError::UnknownNode(id))?;
        let old = self.class_of[id.index()] as usize;
        let key = ClassKey {
            capabilities: caps.clone(),
            ..self.class_keys[old].clone()
        };
        if n.spec.capabilities != caps {
            // Refused now, not when a held node is released.
            self.class_admissible(&key)?;
        }
        if n.owner.is_some() {
            if n.spec.capabilities == caps {
                self.pending_caps.remove(&id);
            } else {
                self.pending_caps.insert(id, caps);
            }
            return Ok(false);
        }
        self.pending_caps.remove(&id);
        if n.spec.capabilities == caps {
            return Ok(true);
        }
        let pool = key.pool;
        let c = self.class_for(key)?;
        self.clock.advance(now);
        self.class_total[old] -= 1;
        self.class_total[c] += 1;
        if self.free.contains(id) {
            self.free_by_class[old] -= 1;
            self.free_by_class[c] += 1;
        }
        self.class_of[id.index()] = c as u16;
        self.pools.get_mut(&pool).expect("pool exists").has_gpus |= caps.gpu_count > 0;
        self.nodes[id.index()].spec.capabilities = caps;
        self.mark_due(pool, now);
        Ok(true)
    }

    /// A released node takes the capabilities recorded while it was held (checked when recorded; a
    /// vCluster switched to the pyss-compatible policy since keeps the node as it was).
    pub(crate) fn settle_capabilities(&mut self, id: NodeId) {
        if let Some(caps) = self.pending_caps.remove(&id) {
            let now = self.clock.now();
            let _ = self.set_capabilities(now, id, caps);
        }
    }

    /// Sets a vCluster's scheduler config. A pool's policy and cycle are its vCluster's; the shared pool
    /// takes them from its vCluster only when exactly one vCluster uses it.
    pub fn configure_vcluster(&mut self, v: VClusterId, config: VClusterConfig) -> Result<(), EngineError> {
        let key = *self.pool_of_vc.get(v.index()).ok_or(EngineError::UnknownVCluster(v))?;
        if config.policy == Policy::PyssEasy && self.class_keys.len() > 1 {
            return Err(EngineError::PyssHeterogeneous(self.class_keys.len()));
        }
        self.scored_any |= config.weights.is_some();
        self.vc_config[v.index()] = config;
        let pool = self.pools.get_mut(&key).expect("pool exists");
        if key != 0 || pool.vclusters.len() == 1 {
            pool.config = config;
        } else {
            // Shared by several: keep the site policy and cycle; scores still use each vCluster's weights.
            pool.config.weights = pool.config.weights.or(config.weights);
        }
        Ok(())
    }

    pub fn tenant(&self, id: TenantId) -> Option<Tenant> {
        self.tenants.get(id.0).map(|n| Tenant {
            id,
            name: n.to_string(),
        })
    }

    pub fn vcluster(&self, id: VClusterId) -> Option<VCluster> {
        self.vclusters.get(id.0).map(|n| VCluster {
            id,
            name: n.to_string(),
        })
    }

    pub fn vcluster_config(&self, id: VClusterId) -> Option<&VClusterConfig> {
        self.vc_config.get(id.index())
    }

    // ----- read access --------------------------------------------------------------------------------

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    pub fn now(&self) -> Time {
        self.clock.now()
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }
    pub fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.allocs.get(id.index())
    }

    /// Why a pending allocation is not running, as far as the engine knows: its unmet dependencies, or
    /// what its pool's last pass found (`None`: not pending, or no pass has looked at it yet).
    pub fn waiting(&self, id: AllocId) -> Option<crate::waiting::Waiting> {
        let a = self.allocs.get(id.index())?;
        use crate::alloc::AllocState as S;
        if !matches!(a.state, S::Pending | S::Staging | S::Suspended) {
            return None;
        }
        let m = &self.meta[id.index()];
        if m.unresolved_deps > 0 {
            return Some(crate::waiting::Waiting::Dependencies {
                unresolved: m.unresolved_deps,
            });
        }
        m.waiting
    }
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocs
    }
    /// Pending allocations whose dependencies are met, over all pools (pool order, then arrival order).
    pub fn queue(&self) -> Vec<AllocId> {
        self.pools.values().flat_map(|p| p.queue.iter().copied()).collect()
    }
    /// The reservations made by each pool's last pass.
    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> + '_ {
        self.pools.values().flat_map(|p| p.reservations.iter())
    }
    pub fn class_of(&self, node: NodeId) -> u16 {
        self.class_of[node.index()]
    }
    pub fn class_count(&self) -> usize {
        self.class_keys.len()
    }
    pub fn class_key(&self, class: u16) -> &ClassKey {
        &self.class_keys[class as usize]
    }
    /// Free (`Ready`, unowned) nodes per class.
    pub fn free_by_class(&self) -> &[u32] {
        &self.free_by_class
    }
    pub fn free_nodes(&self) -> usize {
        self.free.len()
    }
    /// Scheduling passes run so far (over all pools).
    pub fn passes(&self) -> u64 {
        self.passes
    }
    /// Watts drawn by busy nodes.
    pub fn power_used_w(&self) -> u64 {
        self.power_used_w
    }
    /// Allocations that hold nodes and have a walltime, with their estimated end, earliest first.
    pub fn running_estimates(&self) -> impl Iterator<Item = (Time, AllocId)> + '_ {
        self.running.iter().copied()
    }

    /// When `id`, being preempted, is surely off its nodes (its stop order's start plus its limit;
    /// `None`: it is not being preempted). Reservations count its nodes free from then, whatever its
    /// walltime said: they are for the allocation it is preempted for.
    pub fn released_by(&self, id: AllocId) -> Option<Time> {
        self.meta
            .get(id.index())
            .filter(|m| m.preempting)
            .and_then(|m| m.released_by)
    }

    /// The earliest time at which the engine wants [`Engine::schedule`] called without a new input: the
    /// next cycle tick of a pool with a pass due, or the next energy-price change while allocations wait
    /// for a cheaper window.
    pub fn next_wakeup(&self) -> Option<Time> {
        [
            self.pools.values().filter_map(|p| p.due_at).min(),
            self.broker_next,
            self.autoscale_next,
            self.staging_next,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Lends the engine a monotonic nanosecond counter to time its cost-function evaluations with
    /// (`lattice_scheduling_cost_function_duration_seconds`). The engine has no clock of its own; the
    /// timings are written for the caller and no decision reads them.
    pub fn set_stopwatch(&mut self, stopwatch: Option<fn() -> u64>) {
        self.stopwatch = stopwatch;
    }

    /// The cost-function timings since the last take: for each scored pass, the vClusters its pool
    /// serves and the seconds it took to score every candidate.
    pub fn take_cost_timings(&mut self) -> Vec<(Vec<crate::ids::VClusterId>, f64)> {
        let taken = std::mem::take(&mut self.cost_ns);
        taken
            .into_iter()
            .map(|(key, ns)| {
                let vcs = self
                    .pool_of_vc
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| **k == key)
                    .map(|(i, _)| crate::ids::VClusterId(i as u32))
                    .collect();
                (vcs, ns as f64 / 1e9)
            })
            .collect()
    }

    /// What the autoscaler did in the last `schedule` call.
    pub fn scale_stats(&self) -> crate::autoscale::ScaleStats {
        self.last_scale_stats
    }

    /// Stagings that failed more than the retry limit (alerts raised).
    pub fn staging_alerts(&self) -> u64 {
        self.staging_alerts
    }

    /// The next proposal for the quorum, in the order the passes made them.
    pub fn poll_proposal(&mut self) -> Option<Proposal> {
        self.proposals.pop_front()
    }

    // ----- helpers ------------------------------------------------------------------------------------

    pub(crate) fn pool_key_of(&self, id: AllocId) -> u32 {
        self.pool_of_vc[self.hot[id.index()].vcluster as usize]
    }

    /// The pools whose nodes `id` holds.
    fn pools_held(&self, id: AllocId) -> Vec<u32> {
        self.meta[id.index()]
            .held
            .iter()
            .map(|h| self.class_keys[h.0 as usize].pool)
            .collect()
    }

    /// Files `id` in the running set with estimated end `at` (its held nodes are set).
    pub(crate) fn add_running(&mut self, at: Time, id: AllocId) {
        let own = self.pool_key_of(id);
        let holds = self.pools_held(id);
        self.running.insert(at, id, own, holds);
    }

    /// `id`'s held nodes changed while it runs: its pool filings follow.
    pub(crate) fn refile_running(&mut self, id: AllocId) {
        let holds = self.pools_held(id);
        self.running.refile(id, holds);
    }

    /// An input arrived for `key`'s pool: its next pass is due at the next cycle tick.
    /// Every pool runs a pass at its next chance (a change that may affect them all).
    pub(crate) fn mark_all_due(&mut self, now: Time) {
        let keys: Vec<u32> = self.pools.keys().copied().collect();
        for k in keys {
            self.mark_due(k, now);
        }
    }

    pub(crate) fn mark_due(&mut self, key: u32, now: Time) {
        if let Some(p) = self.pools.get_mut(&key) {
            let interval = p.config.cycle_interval.as_millis();
            let tick = if interval == 0 {
                now
            } else {
                Time(now.0.div_ceil(interval) * interval)
            };
            p.due_at = Some(p.due_at.map_or(tick, |d| d.min(tick)));
        }
    }

    pub(crate) fn meta_of(&self, id: AllocId) -> Result<&Meta, EngineError> {
        self.meta.get(id.index()).ok_or(EngineError::UnknownAlloc(id))
    }

    pub(crate) fn transition(&mut self, id: AllocId, to: AllocState) -> Result<(), EngineError> {
        let a = self.allocs.get_mut(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        if !a.state.can_transition_to(to) {
            return Err(EngineError::InvalidTransition { id, from: a.state, to });
        }
        a.state = to;
        Ok(())
    }

    pub(crate) fn enqueue(&mut self, id: AllocId) {
        let key = self.pool_key_of(id);
        let queue = &mut self.pools.get_mut(&key).expect("pool exists").queue;
        match queue.last() {
            Some(&last) if last > id => {
                let at = queue.partition_point(|&q| q < id);
                queue.insert(at, id);
            }
            _ => queue.push(id),
        }
    }

    /// Holds `nodes` for `id` and queues the proposal.
    pub(crate) fn propose(&mut self, now: Time, id: AllocId, nodes: Vec<NodeId>, backfilled: bool) {
        let a = &self.allocs[id.index()];
        let owner = Owner {
            tenant: a.spec.tenant,
            vcluster: a.spec.vcluster,
            alloc: id,
        };
        let walltime = a.spec.lifecycle.walltime();
        let storage = a.spec.storage_gbps.unwrap_or(0.0);
        let vc = a.spec.vcluster.index();
        let mut held: Picks = Vec::new();
        let mut power = 0u64;
        let mut gpus = 0u64;
        for &n in &nodes {
            let removed = self.free.remove(n);
            assert!(removed, "placement chose node {n} which is not free");
            let c = self.class_of[n.index()];
            self.free_by_class[c as usize] -= 1;
            self.nodes[n.index()].owner = Some(owner);
            power += self.class_info[c as usize].power_w as u64;
            gpus += self.class_info[c as usize].gpus as u64;
            match held.iter_mut().find(|p| p.0 == c) {
                Some(p) => p.1 += 1,
                None => held.push((c, 1)),
            }
        }
        self.power_used_w += power;
        self.storage_used_gbps += storage;
        let m = &mut self.meta[id.index()];
        self.gpu_hours_committed[vc] += m.requested_gpu_hours;
        m.usage_rate = if gpus > 0 { gpus as f64 } else { nodes.len() as f64 };
        m.held = held;
        m.holding = true;
        m.proposed_at = Some(now);
        match walltime {
            Some(w) => {
                self.add_running(now + w, id);
            }
            None => {
                self.unbounded_holding.insert(id);
            }
        }
        let a = &mut self.allocs[id.index()];
        a.nodes = nodes.clone();
        a.backfilled = backfilled;
        self.outstanding.push(id);
        let spec = &self.allocs[id.index()].spec;
        if let Some(tg) = spec.task_group {
            *self.group_running.entry(tg.group).or_default() += 1;
        }
        if let Some(m) = spec.mutex.clone() {
            self.mutex_held.insert(m, id);
        }
        self.proposals.push_back(Proposal {
            alloc: id,
            nodes,
            backfilled,
        });
    }

    pub(crate) fn refund_budgets(&mut self, id: AllocId) {
        let vc = self.allocs[id.index()].spec.vcluster.index();
        self.gpu_hours_committed[vc] -= self.meta[id.index()].requested_gpu_hours;
    }

    pub(crate) fn release_nodes(&mut self, id: AllocId) {
        if !std::mem::take(&mut self.meta[id.index()].holding) {
            return;
        }
        self.unbounded_holding.remove(&id);
        let spec = &self.allocs[id.index()].spec;
        if let Some(tg) = spec.task_group
            && let Some(n) = self.group_running.get_mut(&tg.group)
        {
            *n = n.saturating_sub(1);
        }
        if let Some(m) = &spec.mutex
            && self.mutex_held.get(m) == Some(&id)
        {
            self.mutex_held.remove(m);
        }
        self.storage_used_gbps -= self.allocs[id.index()].spec.storage_gbps.unwrap_or(0.0);
        for i in 0..self.allocs[id.index()].nodes.len() {
            let n = self.allocs[id.index()].nodes[i];
            let c = self.class_of[n.index()] as usize;
            self.power_used_w -= self.class_info[c].power_w as u64;
            let node = &mut self.nodes[n.index()];
            node.owner = None;
            if node.state.schedulable() {
                self.free.insert(n);
                self.free_by_class[c] += 1;
            } else if node.state == NodeState::Draining {
                node.state = NodeState::Drained;
            }
        }
        if !self.pending_caps.is_empty() {
            for i in 0..self.allocs[id.index()].nodes.len() {
                self.settle_capabilities(self.allocs[id.index()].nodes[i]);
            }
        }
    }

    /// pyss counts a job's processors as free from its estimated end, before its termination event is
    /// handled at the same timestamp; release them now so `free(t)` and node ownership agree.
    pub(crate) fn release_estimated_ends(&mut self, now: Time) {
        if !self.pools.values().any(|p| p.config.policy == Policy::PyssEasy) {
            return;
        }
        while let Some(&(t, id)) = self.running.first() {
            if t > now || self.meta[id.index()].proposed_at.is_some() {
                break;
            }
            self.running.pop_first();
            self.release_nodes(id);
        }
    }

    /// Bookkeeping shared by every way a started or pending allocation ends.
    pub(crate) fn finish(&mut self, now: Time, id: AllocId, reason: EndReason) {
        let a = &mut self.allocs[id.index()];
        a.ended = Some(now);
        a.end_reason = Some(reason);
        self.stop_running(now, id);
        self.resolve_dependents(now, id);
        // Only a waiting or running allocation needs its classes: a year's ended ones keep none.
        // Only a waiting or running allocation needs its bookkeeping: a year's ended ones keep none.
        self.meta.release(id.index());
        self.log_ended(id);
    }

    /// Notes that `id` ended, for [`Engine::take_ended`].
    fn log_ended(&mut self, id: AllocId) {
        if let Some(log) = &mut self.ended_log {
            log.push(id);
        }
    }

    /// A running allocation stops holding its nodes (it ended, or it was suspended).
    pub(crate) fn stop_running(&mut self, now: Time, id: AllocId) {
        // Every pool whose nodes come free re-plans (a borrower frees its lender's nodes).
        if self.pools.len() > 1 {
            let mut keys: Vec<u32> = self.meta[id.index()]
                .held
                .iter()
                .map(|h| self.class_keys[h.0 as usize].pool)
                .collect();
            keys.sort_unstable();
            keys.dedup();
            for k in keys {
                self.mark_due(k, now);
            }
        }
        if let Some(for_alloc) = self.meta[id.index()].preempt_for.take() {
            let m = &mut self.meta[for_alloc.index()];
            m.awaiting_victims = m.awaiting_victims.saturating_sub(1);
        }
        self.meta[id.index()].preempting = false;
        self.meta[id.index()].released_by = None;
        let a = &self.allocs[id.index()];
        if let Some(s) = a.started {
            if let Some(w) = a.spec.lifecycle.walltime() {
                self.running.remove(&(s + w, id));
            }
            let t = a.spec.tenant.index();
            let held = a.nodes.len() as u64;
            let secs = now.since(s).as_secs_f64();
            let rate = self.meta[id.index()].usage_rate;
            if self.scored_any {
                self.ledger.stop(now, t, rate);
                self.project_ledger.stop(now, a.spec.project.index(), rate);
            }
            self.committed_nodes[t] -= held;
            self.committed_allocs[t] -= 1;
            self.consumed_node_s[t] += held as f64 * secs;
            let gpus: u64 = a
                .nodes
                .iter()
                .map(|n| self.class_info[self.class_of[n.index()] as usize].gpus as u64)
                .sum();
            self.consumed_gpu_s[t] += gpus as f64 * secs;
            let p = &mut self.projects[a.spec.project.index()];
            p.committed_nodes -= held;
            p.committed_allocs -= 1;
            p.consumed_node_s += held as f64 * secs;
            p.consumed_gpu_s += gpus as f64 * secs;
            if self.is_sensitive(id) {
                self.sensitive_nodes -= held;
            }
        }
        self.release_nodes(id);
    }

    pub(crate) fn cancel_for_dependency(&mut self, now: Time, id: AllocId) {
        let a = &mut self.allocs[id.index()];
        a.state = AllocState::Cancelled;
        a.ended = Some(now);
        a.end_reason = Some(EndReason::DependencyUnsatisfied);
        self.log_ended(id);
        self.resolve_dependents(now, id);
    }

    /// An allocation reached a terminal state: release or cancel the allocations waiting on it.
    fn resolve_dependents(&mut self, now: Time, id: AllocId) {
        let mut work = vec![id];
        while let Some(up) = work.pop() {
            let Some(waiting) = self.dependents.remove(&up) else {
                continue;
            };
            for w in waiting {
                if !matches!(self.allocs[w.index()].state, AllocState::Pending | AllocState::Staging) {
                    continue;
                }
                let cond = self.allocs[w.index()]
                    .spec
                    .depends_on
                    .iter()
                    .filter(|d| d.on == up)
                    .all(|d| condition_met(d.condition, &self.allocs[up.index()]));
                if !cond {
                    let a = &mut self.allocs[w.index()];
                    a.state = AllocState::Cancelled;
                    a.ended = Some(now);
                    a.end_reason = Some(EndReason::DependencyUnsatisfied);
                    self.meta[w.index()].unresolved_deps = 0;
                    self.log_ended(w);
                    work.push(w);
                    continue;
                }
                let m = &mut self.meta[w.index()];
                m.unresolved_deps -= 1;
                if m.unresolved_deps == 0 {
                    self.enqueue(w);
                    let key = self.pool_key_of(w);
                    self.mark_due(key, now);
                }
            }
        }
    }

    /// Decayed fair-share usage of every tenant (node- or GPU-seconds) as of the last accrual, for f3.
    pub(crate) fn tenant_usage(&self) -> Vec<f64> {
        (0..self.tenants.len()).map(|i| self.ledger.decayed(i)).collect()
    }

    /// The fair-share ledger (decayed usage per tenant).
    pub fn usage_ledger(&self) -> &UsageLedger {
        &self.ledger
    }

    /// Target share per tenant: configured shares, the rest split equally among the others.
    pub(crate) fn tenant_targets(&self) -> Vec<f64> {
        let set: f64 = self.tenant_target.iter().flatten().sum();
        let unset = self.tenant_target.iter().filter(|t| t.is_none()).count();
        let rest = if unset > 0 {
            (1.0 - set).max(0.0) / unset as f64
        } else {
            0.0
        };
        self.tenant_target.iter().map(|t| t.unwrap_or(rest)).collect()
    }
}

pub(crate) fn condition_met(c: DependencyCondition, up: &Allocation) -> bool {
    match c {
        DependencyCondition::Success => up.state == AllocState::Completed,
        DependencyCondition::Failure => up.state == AllocState::Failed,
        DependencyCondition::Any => up.state.is_terminal(),
    }
}
