//! The sans-I/O engine: `handle_*(now, ..)` inputs, `poll_proposal()` outputs, `schedule(now)` passes.
//!
//! Drivers (the simulator, the production runtime) own the clock, the quorum and the nodes; the engine owns
//! the decisions. A pass starts allocations by *proposing* them: their nodes are held at once, and the
//! allocation becomes `Running` when the driver reports the quorum's commit (`handle_commit`) or goes back to
//! the queue on a reject (`handle_reject`).

use crate::alloc::{AllocSpec, AllocState, Allocation, DependencyCondition, EndReason};
use crate::error::{EngineError, SubmitError};
use crate::ids::{AllocId, NodeId, TenantId, VClusterId};
use crate::node::{Node, NodeCapabilities, NodeEvent, NodeSpec, Owner, next_node_state};
use crate::nodeset::NodeSet;
use crate::policy::{ArrivalOrder, Depth, LowestIdFirst, NodeSelector, Policy, QueueOrder};
use crate::profile::{Picks, Profile};
use crate::tenant::{Registry, Tenant, VCluster};
use crate::time::{Clock, Duration, Time};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Engine configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub policy: Policy,
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
    /// `None` for allocations without a walltime.
    pub end: Option<Time>,
    /// Nodes per node class.
    pub picks: Picks,
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// False when no input arrived since the last pass (or pyss's trigger rule said no).
    pub ran: bool,
    pub started: u32,
    pub backfilled: u32,
    pub reservations: u32,
}

#[derive(Clone, Debug, Default)]
struct Meta {
    /// Node classes whose capabilities satisfy the constraints.
    eligible: Vec<u16>,
    /// Nodes held per class while proposed or running.
    held: Picks,
    holding: bool,
    proposed_at: Option<Time>,
    unresolved_deps: u32,
}

/// The scheduling engine. See the crate docs for the contract.
pub struct Engine {
    config: EngineConfig,
    clock: Clock,
    nodes: Vec<Node>,
    class_of: Vec<u16>,
    class_caps: Vec<NodeCapabilities>,
    class_total: Vec<u32>,
    /// Nodes that are `Ready` and unowned.
    free: NodeSet,
    free_by_class: Vec<u32>,
    nodes_not_ready: usize,
    allocs: Vec<Allocation>,
    meta: Vec<Meta>,
    /// Pending allocations whose dependencies are met, in queue order.
    queue: Vec<AllocId>,
    /// Allocations holding nodes with a finite estimated end, by (estimated end, id).
    running: BTreeSet<(Time, AllocId)>,
    proposals: VecDeque<Proposal>,
    dependents: BTreeMap<AllocId, Vec<AllocId>>,
    tenants: Registry,
    vclusters: Registry,
    reservations: Vec<Reservation>,
    pass_due: bool,
    passes: u64,
    order: Box<dyn QueueOrder>,
    selector: Box<dyn NodeSelector>,
    picks: Picks,
}

impl Engine {
    /// An engine over `nodes` (ids are assigned in the given order, from 0).
    pub fn new(config: EngineConfig, nodes: Vec<NodeSpec>) -> Result<Engine, EngineError> {
        let mut class_caps: Vec<NodeCapabilities> = Vec::new();
        let mut index: BTreeMap<NodeCapabilities, u16> = BTreeMap::new();
        let mut class_of = Vec::with_capacity(nodes.len());
        let mut free = NodeSet::new(nodes.len());
        let mut class_total = Vec::new();
        let mut free_by_class = Vec::new();
        let mut nodes_not_ready = 0;
        let nodes: Vec<Node> = nodes
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let c = *index.entry(spec.capabilities.clone()).or_insert_with(|| {
                    class_caps.push(spec.capabilities.clone());
                    class_total.push(0);
                    free_by_class.push(0);
                    (class_caps.len() - 1) as u16
                });
                class_of.push(c);
                class_total[c as usize] += 1;
                let id = NodeId(i as u32);
                if spec.state.schedulable() {
                    free.insert(id);
                    free_by_class[c as usize] += 1;
                } else {
                    nodes_not_ready += 1;
                }
                Node {
                    id,
                    state: spec.state,
                    spec,
                    owner: None,
                }
            })
            .collect();
        if config.policy == Policy::PyssEasy && class_caps.len() > 1 {
            return Err(EngineError::PyssHeterogeneous(class_caps.len()));
        }
        Ok(Engine {
            config,
            clock: Clock::default(),
            nodes,
            class_of,
            class_caps,
            class_total,
            free,
            free_by_class,
            nodes_not_ready,
            allocs: Vec::new(),
            meta: Vec::new(),
            queue: Vec::new(),
            running: BTreeSet::new(),
            proposals: VecDeque::new(),
            dependents: BTreeMap::new(),
            tenants: Registry::default(),
            vclusters: Registry::default(),
            reservations: Vec::new(),
            pass_due: false,
            passes: 0,
            order: Box::new(ArrivalOrder),
            selector: Box::new(LowestIdFirst),
            picks: Vec::new(),
        })
    }

    /// Replaces the queue order (the seam for score-based ordering).
    pub fn with_queue_order(mut self, order: Box<dyn QueueOrder>) -> Engine {
        self.order = order;
        self
    }

    /// Replaces the node selector (the seam for topology-aware placement).
    pub fn with_node_selector(mut self, selector: Box<dyn NodeSelector>) -> Engine {
        self.selector = selector;
        self
    }

    // ----- registries ---------------------------------------------------------------------------------

    pub fn add_tenant(&mut self, name: &str) -> TenantId {
        TenantId(self.tenants.intern(name))
    }

    pub fn add_vcluster(&mut self, name: &str) -> VClusterId {
        VClusterId(self.vclusters.intern(name))
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

    // ----- read access --------------------------------------------------------------------------------

    pub fn config(&self) -> EngineConfig {
        self.config
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
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocs
    }
    /// Pending allocations whose dependencies are met, in queue order.
    pub fn queue(&self) -> &[AllocId] {
        &self.queue
    }
    /// The reservations made by the last pass.
    pub fn reservations(&self) -> &[Reservation] {
        &self.reservations
    }
    pub fn class_of(&self, node: NodeId) -> u16 {
        self.class_of[node.index()]
    }
    pub fn class_count(&self) -> usize {
        self.class_caps.len()
    }
    pub fn class_capabilities(&self, class: u16) -> &NodeCapabilities {
        &self.class_caps[class as usize]
    }
    /// Free (`Ready`, unowned) nodes per class.
    pub fn free_by_class(&self) -> &[u32] {
        &self.free_by_class
    }
    pub fn free_nodes(&self) -> usize {
        self.free.len()
    }
    /// Scheduling passes run so far.
    pub fn passes(&self) -> u64 {
        self.passes
    }
    /// Allocations that hold nodes and have a walltime, with their estimated end, earliest first.
    pub fn running_estimates(&self) -> impl Iterator<Item = (Time, AllocId)> + '_ {
        self.running.iter().copied()
    }

    /// The earliest time at which the engine would act without a new input. Passes are event-driven
    /// (DESIGN.md §3 "Event order"), so nothing is time-triggered yet: always `None` for now. Periodic
    /// cycles and time-dependent scores (wait-time aging, energy windows) will set it.
    pub fn next_wakeup(&self) -> Option<Time> {
        None
    }

    /// The next proposal for the quorum, in the order the pass made them.
    pub fn poll_proposal(&mut self) -> Option<Proposal> {
        self.proposals.pop_front()
    }

    // ----- inputs -------------------------------------------------------------------------------------

    /// A new allocation request. Refused requests create nothing.
    pub fn handle_submit(&mut self, now: Time, spec: AllocSpec) -> Result<AllocId, SubmitError> {
        self.clock.advance(now);
        self.release_estimated_ends(now);
        let (min, max) = (spec.nodes.min, spec.nodes.max);
        if min == 0 {
            return Err(SubmitError::NoNodes(min));
        }
        if min > max {
            return Err(SubmitError::BadRange { min, max });
        }
        if self.tenants.get(spec.tenant.0).is_none() {
            return Err(SubmitError::UnknownTenant(spec.tenant));
        }
        if self.vclusters.get(spec.vcluster.0).is_none() {
            return Err(SubmitError::UnknownVCluster(spec.vcluster));
        }
        if self.config.policy == Policy::PyssEasy && !spec.constraints.is_empty() {
            return Err(SubmitError::PyssConstraints);
        }
        let eligible: Vec<u16> = (0..self.class_caps.len() as u16)
            .filter(|&c| spec.constraints.satisfied_by(&self.class_caps[c as usize]))
            .collect();
        let eligible_total: u32 = eligible.iter().map(|&c| self.class_total[c as usize]).sum();
        if eligible_total < min {
            return Err(SubmitError::Unsatisfiable {
                requested: min,
                eligible: eligible_total,
            });
        }
        if let Some(d) = spec.depends_on.iter().find(|d| d.on.index() >= self.allocs.len()) {
            return Err(SubmitError::UnknownDependency(d.on));
        }
        let id = AllocId(self.allocs.len() as u64);
        let mut unresolved = 0;
        let mut broken = false;
        for d in &spec.depends_on {
            let up = &self.allocs[d.on.index()];
            if up.state.is_terminal() {
                broken |= !condition_met(d.condition, up);
            } else {
                unresolved += 1;
                self.dependents.entry(d.on).or_default().push(id);
            }
        }
        self.allocs.push(Allocation {
            id,
            spec,
            state: AllocState::Pending,
            submitted: now,
            started: None,
            ended: None,
            end_reason: None,
            nodes: Vec::new(),
            backfilled: false,
        });
        self.meta.push(Meta {
            eligible,
            unresolved_deps: unresolved,
            ..Meta::default()
        });
        if broken {
            self.cancel_for_dependency(now, id);
        } else if unresolved == 0 {
            self.enqueue(id);
            self.pass_due |= match self.config.policy {
                // pyss runs a pass on a submission only if the new job fits in free(t).
                Policy::PyssEasy => min as usize <= self.free.len(),
                _ => true,
            };
        }
        Ok(id)
    }

    /// The quorum committed a proposal: the allocation runs from `now`.
    pub fn handle_commit(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let proposed_at = self.meta_of(id)?.proposed_at.ok_or(EngineError::NotProposed(id))?;
        self.transition(id, AllocState::Running)?;
        let a = &mut self.allocs[id.index()];
        a.started = Some(now);
        if let Some(w) = a.spec.lifecycle.walltime() {
            self.running.remove(&(proposed_at + w, id));
            self.running.insert((now + w, id));
        }
        self.meta[id.index()].proposed_at = None;
        Ok(())
    }

    /// The quorum rejected a proposal (e.g. a conflicting commit won): release and requeue.
    pub fn handle_reject(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let proposed_at = self.meta_of(id)?.proposed_at.ok_or(EngineError::NotProposed(id))?;
        if let Some(w) = self.allocs[id.index()].spec.lifecycle.walltime() {
            self.running.remove(&(proposed_at + w, id));
        }
        self.release_nodes(id);
        let a = &mut self.allocs[id.index()];
        a.nodes.clear();
        a.backfilled = false;
        self.meta[id.index()].proposed_at = None;
        self.enqueue(id);
        self.pass_due = true;
        Ok(())
    }

    /// A running allocation ended (its processes exited, or its node agent killed it at walltime).
    pub fn handle_completion(&mut self, now: Time, id: AllocId, reason: EndReason) -> Result<(), EngineError> {
        self.clock.advance(now);
        self.release_estimated_ends(now);
        let to = if reason == EndReason::Success {
            AllocState::Completed
        } else {
            AllocState::Failed
        };
        self.transition(id, to)?;
        self.finish(now, id, reason);
        // pyss: a termination always runs a pass.
        self.pass_due = true;
        Ok(())
    }

    /// User or operator cancel: a pending allocation leaves the queue, a running one frees its nodes.
    pub fn handle_cancel(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let was = self.allocation(id).ok_or(EngineError::UnknownAlloc(id))?.state;
        if was == AllocState::Pending && self.meta[id.index()].proposed_at.is_some() {
            // An outstanding proposal: the driver will still report commit/reject; refuse for clarity.
            return Err(EngineError::InvalidTransition {
                id,
                from: was,
                to: AllocState::Cancelled,
            });
        }
        self.transition(id, AllocState::Cancelled)?;
        self.queue.retain(|&q| q != id);
        self.finish(now, id, EndReason::UserCancelled);
        self.pass_due = true;
        Ok(())
    }

    /// A node state-machine event. Returns the allocations that failed because their node went down.
    pub fn handle_node_event(
        &mut self,
        now: Time,
        node: NodeId,
        event: NodeEvent,
    ) -> Result<Vec<AllocId>, EngineError> {
        self.clock.advance(now);
        let n = self.nodes.get(node.index()).ok_or(EngineError::UnknownNode(node))?;
        let old = n.state;
        let new = next_node_state(old, event, n.owner.is_some()).ok_or(crate::node::InvalidNodeTransition {
            node,
            state: old,
            event,
        })?;
        let owner = n.owner;
        self.nodes[node.index()].state = new;
        let c = self.class_of[node.index()] as usize;
        match (old.schedulable(), new.schedulable()) {
            (true, false) => {
                self.nodes_not_ready += 1;
                if self.free.remove(node) {
                    self.free_by_class[c] -= 1;
                }
            }
            (false, true) => {
                self.nodes_not_ready -= 1;
                if owner.is_none() && self.free.insert(node) {
                    self.free_by_class[c] += 1;
                }
            }
            _ => {}
        }
        let mut failed = Vec::new();
        if let Some(o) = owner
            && !new.runs_allocations()
        {
            let id = o.alloc;
            if self.allocs[id.index()].state == AllocState::Running {
                self.transition(id, AllocState::Failed)?;
                self.finish(now, id, EndReason::NodeFailure);
                failed.push(id);
            }
        }
        self.pass_due = true;
        Ok(failed)
    }

    /// Runs a scheduling pass at `now` if one is due (any input since the last pass; pyss has its own
    /// trigger rule). Proposals are then available from [`Engine::poll_proposal`].
    pub fn schedule(&mut self, now: Time) -> PassStats {
        self.clock.advance(now);
        if !self.pass_due {
            return PassStats::default();
        }
        self.pass_due = false;
        self.passes += 1;
        self.reservations.clear();
        let mut queue = std::mem::take(&mut self.queue);
        self.order.reorder(now, &mut queue, &self.allocs);
        let (stats, rest) = match self.config.policy {
            Policy::Fcfs => self.pass_backfill(now, queue, None),
            Policy::Backfill { depth } => self.pass_backfill(now, queue, Some(depth)),
            Policy::PyssEasy => self.pass_pyss(now, queue),
        };
        self.queue = rest;
        stats
    }

    // ----- passes -------------------------------------------------------------------------------------

    /// FCFS (`depth = None`) or backfill with depth `d` (DESIGN.md §3 "Backfill", "EASY").
    fn pass_backfill(&mut self, now: Time, queue: Vec<AllocId>, depth: Option<Depth>) -> (PassStats, Vec<AllocId>) {
        let mut stats = PassStats {
            ran: true,
            ..PassStats::default()
        };
        let mut keep = Vec::with_capacity(queue.len());
        let mut profile: Option<Profile> = None;
        // suffix_min[i - base] = smallest request among queue[i..]: once fewer nodes are free now, stop.
        let mut suffix_min: Vec<u32> = Vec::new();
        let mut base = 0;
        let mut blocked = false;
        let mut picks = std::mem::take(&mut self.picks);
        for (i, &id) in queue.iter().enumerate() {
            let k = self.allocs[id.index()].spec.nodes.min;
            let walltime = self.allocs[id.index()].spec.lifecycle.walltime();
            let Some(p) = profile.as_mut() else {
                // Nothing is blocked yet: every start so far is in queue order.
                if self.fits_now(id, k) {
                    self.propose(now, id, None, false);
                    stats.started += 1;
                    continue;
                }
                // FCFS: the head blocks everything behind it.
                let Some(depth) = depth else {
                    keep.extend_from_slice(&queue[i..]);
                    break;
                };
                base = i;
                suffix_min = self.suffix_min_nodes(&queue[i..]);
                let p = profile.insert(self.build_profile(now));
                blocked = true;
                self.reserve_if_allowed(p, id, k, walltime, depth, &mut stats, &mut picks);
                keep.push(id);
                continue;
            };
            if p.free_total_now() < suffix_min[i - base] as i64 {
                keep.extend_from_slice(&queue[i..]);
                break;
            }
            let eligible = std::mem::take(&mut self.meta[id.index()].eligible);
            let fit = p.fit(0, walltime, &eligible, k, &mut picks);
            self.meta[id.index()].eligible = eligible;
            match fit {
                Ok(()) => {
                    p.reserve(now, walltime, &picks);
                    self.propose(now, id, Some(&picks), blocked);
                    stats.started += 1;
                    stats.backfilled += blocked as u32;
                }
                Err(_) => {
                    let depth = depth.expect("profile is only built for backfill");
                    self.reserve_if_allowed(p, id, k, walltime, depth, &mut stats, &mut picks);
                    keep.push(id);
                }
            }
        }
        self.picks = picks;
        (stats, keep)
    }

    #[allow(clippy::too_many_arguments)]
    fn reserve_if_allowed(
        &mut self,
        p: &mut Profile,
        id: AllocId,
        k: u32,
        walltime: Option<Duration>,
        depth: Depth,
        stats: &mut PassStats,
        picks: &mut Picks,
    ) {
        let allowed = match depth {
            Depth::Unlimited => true,
            Depth::Limited(d) => stats.reservations < d,
        };
        if !allowed {
            return;
        }
        let eligible = &self.meta[id.index()].eligible;
        if let Some(start) = p.earliest(walltime, eligible, k, picks) {
            p.reserve(start, walltime, picks);
            self.reservations.push(Reservation {
                alloc: id,
                start,
                end: walltime.map(|w| start + w),
                picks: picks.clone(),
            });
            stats.reservations += 1;
        }
    }

    /// EASY as pyss implements it (DESIGN.md §3, rule by rule). One homogeneous pool; processors of jobs
    /// past their estimated end were already released by `release_estimated_ends`.
    fn pass_pyss(&mut self, now: Time, queue: Vec<AllocId>) -> (PassStats, Vec<AllocId>) {
        let mut stats = PassStats {
            ran: true,
            ..PassStats::default()
        };
        let mut free = self.free.len() as i64;
        // (1) Start queue heads while the head fits.
        let mut h = 0;
        while h < queue.len() {
            let k = self.allocs[queue[h].index()].spec.nodes.min as i64;
            if k > free {
                break;
            }
            self.propose(now, queue[h], None, false);
            free -= k;
            stats.started += 1;
            h += 1;
        }
        // (2) Fewer than two waiting: stop.
        if queue.len() - h < 2 {
            return (stats, queue[h..].to_vec());
        }
        // (3) Shadow time and extra processors for the head.
        let head = queue[h];
        let head_k = self.allocs[head.index()].spec.nodes.min as i64;
        let mut acc = free;
        let mut shadow = None;
        for &(t, id) in &self.running {
            acc += self.held_total(id);
            if acc >= head_k {
                shadow = Some(t);
                break;
            }
        }
        let Some(shadow) = shadow else {
            return (stats, queue[h..].to_vec());
        };
        let released: i64 = self
            .running
            .iter()
            .take_while(|&&(t, _)| t <= shadow)
            .map(|&(_, id)| self.held_total(id))
            .sum();
        let mut extra = free + released - head_k;
        let mut nonextra = free - extra;
        if nonextra < 0 {
            extra += nonextra;
            nonextra = 0;
        }
        self.reservations.push(Reservation {
            alloc: head,
            start: shadow,
            end: self.allocs[head.index()].spec.lifecycle.walltime().map(|w| shadow + w),
            picks: vec![(0, head_k as u32)],
        });
        stats.reservations = 1;
        // (4) Scan the other waiting jobs in queue order.
        let mut keep = vec![head];
        let horizon = shadow.since(now);
        for &id in &queue[h + 1..] {
            let a = &self.allocs[id.index()];
            let k = a.spec.nodes.min as i64;
            let long = a.spec.lifecycle.walltime().is_none_or(|w| w > horizon);
            let starts = if long {
                if k <= extra {
                    extra -= k;
                    true
                } else {
                    false
                }
            } else if k <= extra + nonextra {
                nonextra -= k;
                if nonextra < 0 {
                    extra += nonextra;
                    nonextra = 0;
                }
                true
            } else {
                false
            };
            if starts {
                self.propose(now, id, None, true);
                stats.started += 1;
                stats.backfilled += 1;
            } else {
                keep.push(id);
            }
        }
        (stats, keep)
    }

    // ----- helpers ------------------------------------------------------------------------------------

    fn meta_of(&self, id: AllocId) -> Result<&Meta, EngineError> {
        self.meta.get(id.index()).ok_or(EngineError::UnknownAlloc(id))
    }

    fn transition(&mut self, id: AllocId, to: AllocState) -> Result<(), EngineError> {
        let a = self.allocs.get_mut(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        if !a.state.can_transition_to(to) {
            return Err(EngineError::InvalidTransition { id, from: a.state, to });
        }
        a.state = to;
        Ok(())
    }

    /// `out[i]` = the smallest node request among `queue[i..]`.
    fn suffix_min_nodes(&self, queue: &[AllocId]) -> Vec<u32> {
        let mut out: Vec<u32> = queue.iter().map(|q| self.allocs[q.index()].spec.nodes.min).collect();
        for i in (0..out.len().saturating_sub(1)).rev() {
            out[i] = out[i].min(out[i + 1]);
        }
        out
    }

    fn held_total(&self, id: AllocId) -> i64 {
        self.meta[id.index()].held.iter().map(|p| p.1 as i64).sum()
    }

    fn fits_now(&self, id: AllocId, k: u32) -> bool {
        let free: u32 = self.meta[id.index()]
            .eligible
            .iter()
            .map(|&c| self.free_by_class[c as usize])
            .sum();
        free >= k
    }

    fn enqueue(&mut self, id: AllocId) {
        match self.queue.last() {
            Some(&last) if last > id => {
                let at = self.queue.partition_point(|&q| q < id);
                self.queue.insert(at, id);
            }
            _ => self.queue.push(id),
        }
    }

    /// The availability profile from now: free nodes plus releases at running allocations' estimated ends.
    fn build_profile(&self, now: Time) -> Profile {
        let mut p = Profile::new(now, &self.free_by_class);
        for &(t, id) in &self.running {
            let m = &self.meta[id.index()];
            if self.nodes_not_ready == 0 {
                p.add_release(t, &m.held);
            } else {
                // Only nodes that will be schedulable when released come back.
                let mut back: Picks = Vec::new();
                for n in &self.allocs[id.index()].nodes {
                    if self.nodes[n.index()].state.schedulable() {
                        let c = self.class_of[n.index()];
                        match back.iter_mut().find(|p| p.0 == c) {
                            Some(p) => p.1 += 1,
                            None => back.push((c, 1)),
                        }
                    }
                }
                p.add_release(t, &back);
            }
        }
        p
    }

    fn propose(&mut self, now: Time, id: AllocId, picks: Option<&Picks>, backfilled: bool) {
        let k = self.allocs[id.index()].spec.nodes.min;
        let mut caps: Picks = match picks {
            Some(p) => p.clone(),
            None => self.meta[id.index()].eligible.iter().map(|&c| (c, u32::MAX)).collect(),
        };
        let mut nodes = Vec::with_capacity(k as usize);
        self.selector
            .select(&self.free, &self.class_of, &mut caps, k, &mut nodes);
        assert_eq!(
            nodes.len(),
            k as usize,
            "node selector {} gave {} nodes for a request of {k}: the pass believed more nodes were free",
            self.selector.name(),
            nodes.len()
        );
        let a = &self.allocs[id.index()];
        let owner = Owner {
            tenant: a.spec.tenant,
            vcluster: a.spec.vcluster,
            alloc: id,
        };
        let walltime = a.spec.lifecycle.walltime();
        let mut held: Picks = Vec::new();
        for &n in &nodes {
            let removed = self.free.remove(n);
            assert!(removed, "node selector chose node {n} which is not free");
            let c = self.class_of[n.index()];
            self.free_by_class[c as usize] -= 1;
            self.nodes[n.index()].owner = Some(owner);
            match held.iter_mut().find(|p| p.0 == c) {
                Some(p) => p.1 += 1,
                None => held.push((c, 1)),
            }
        }
        let m = &mut self.meta[id.index()];
        m.held = held;
        m.holding = true;
        m.proposed_at = Some(now);
        if let Some(w) = walltime {
            self.running.insert((now + w, id));
        }
        let a = &mut self.allocs[id.index()];
        a.nodes = nodes.clone();
        a.backfilled = backfilled;
        self.proposals.push_back(Proposal {
            alloc: id,
            nodes,
            backfilled,
        });
    }

    fn release_nodes(&mut self, id: AllocId) {
        if !std::mem::take(&mut self.meta[id.index()].holding) {
            return;
        }
        for i in 0..self.allocs[id.index()].nodes.len() {
            let n = self.allocs[id.index()].nodes[i];
            let node = &mut self.nodes[n.index()];
            node.owner = None;
            if node.state.schedulable() {
                self.free.insert(n);
                self.free_by_class[self.class_of[n.index()] as usize] += 1;
            } else if node.state == crate::node::NodeState::Draining {
                node.state = crate::node::NodeState::Drained;
            }
        }
    }

    /// pyss counts a job's processors as free from its estimated end, before its termination event is
    /// handled at the same timestamp; release them now so `free(t)` and node ownership agree.
    fn release_estimated_ends(&mut self, now: Time) {
        if self.config.policy != Policy::PyssEasy {
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
    fn finish(&mut self, now: Time, id: AllocId, reason: EndReason) {
        let a = &mut self.allocs[id.index()];
        a.ended = Some(now);
        a.end_reason = Some(reason);
        if let Some(s) = a.started
            && let Some(w) = a.spec.lifecycle.walltime()
        {
            self.running.remove(&(s + w, id));
        }
        self.release_nodes(id);
        self.resolve_dependents(now, id);
    }

    fn cancel_for_dependency(&mut self, now: Time, id: AllocId) {
        let a = &mut self.allocs[id.index()];
        a.state = AllocState::Cancelled;
        a.ended = Some(now);
        a.end_reason = Some(EndReason::DependencyUnsatisfied);
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
                if self.allocs[w.index()].state != AllocState::Pending {
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
                    work.push(w);
                    continue;
                }
                let m = &mut self.meta[w.index()];
                m.unresolved_deps -= 1;
                if m.unresolved_deps == 0 {
                    self.enqueue(w);
                    self.pass_due = true;
                }
            }
        }
    }
}

fn condition_met(c: DependencyCondition, up: &Allocation) -> bool {
    match c {
        DependencyCondition::Success => up.state == AllocState::Completed,
        DependencyCondition::Failure => up.state == AllocState::Failed,
        DependencyCondition::Any => up.state.is_terminal(),
    }
}
