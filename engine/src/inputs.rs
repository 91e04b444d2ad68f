//! The engine's inputs: what the driver reports (`handle_*(now, ..)`): submissions, the quorum's
//! commits and rejects, adoptions after a leadership change, walltime updates, completions, cancels,
//! prologue failures and node events. Each advances the clock to `now` and changes the engine's state;
//! decisions come from the next pass ([`crate::Engine::schedule`]).

use crate::alloc::{AllocSpec, AllocState, Allocation, EndReason, Lifecycle};
use crate::engine::*;
use crate::error::{EngineError, SubmitError};
use crate::ids::{AllocId, NodeId};
use crate::node::{NodeEvent, next_node_state};
use crate::policy::Policy;
use crate::time::Time;

impl Engine {
    /// A new allocation request. Refused requests create nothing. The request is kept as given
    /// (shared, not copied: a replay hands in the trace's own).
    pub fn handle_submit(
        &mut self,
        now: Time,
        spec: impl Into<std::sync::Arc<AllocSpec>>,
    ) -> Result<AllocId, SubmitError> {
        self.clock.advance(now);
        let mut spec: std::sync::Arc<AllocSpec> = spec.into();
        let claim = spec.sensitive_claim;
        if spec.sensitive_claim {
            // Sensitive claims are class 10: highest, never preempted.
            std::sync::Arc::make_mut(&mut spec).preemption_class =
                crate::alloc::PreemptionClass::new(10).expect("10 is valid");
        }
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
        let Some(&pool_key) = self.pool_of_vc.get(spec.vcluster.index()) else {
            return Err(SubmitError::UnknownVCluster(spec.vcluster));
        };
        let policy = self.pools[&pool_key].config.policy;
        if policy == Policy::PyssEasy && !spec.constraints.is_empty() {
            return Err(SubmitError::PyssConstraints);
        }
        let eligible: Vec<u16> = (0..self.class_keys.len() as u16)
            .filter(|&c| {
                let k = &self.class_keys[c as usize];
                k.pool == pool_key && spec.constraints.satisfied_by(&k.capabilities)
            })
            .collect();
        let borrow_eligible: Vec<u16> = (0..self.class_keys.len() as u16)
            .filter(|&c| {
                let k = &self.class_keys[c as usize];
                k.pool != pool_key && spec.constraints.satisfied_by(&k.capabilities)
            })
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
        self.project_book(spec.project).tenant = Some(spec.tenant.index());
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
        // GPUs per node: the smallest eligible class (what the request is guaranteed).
        let gpus_per_node = eligible
            .iter()
            .map(|&c| self.class_info[c as usize].gpus)
            .min()
            .unwrap_or(0);
        let per_node = if self.pools[&pool_key].has_gpus {
            gpus_per_node as f64
        } else {
            1.0
        };
        let requested_gpu_hours = spec
            .lifecycle
            .walltime()
            .map_or(f64::INFINITY, |w| per_node * min as f64 * w.as_secs_f64() / 3600.0);
        self.hot.push(Hot {
            vcluster: spec.vcluster.0,
            class: spec.preemption_class.get(),
            checkpoints: spec.checkpoint.kind != crate::alloc::CheckpointKind::None,
        });
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
            start_score: None,
            first_started: None,
            preempted: 0,
            resume_from_checkpoint: false,
            requeues: 0,
        });
        self.meta.push(Meta {
            eligible,
            borrow_eligible,
            unresolved_deps: unresolved,
            requested_gpu_hours,
            ..Meta::default()
        });
        self.start_staging(now, id);
        if broken {
            self.cancel_for_dependency(now, id);
        } else if unresolved == 0 {
            let fits_free = min as usize <= self.free.len();
            self.enqueue(id);
            // pyss runs a pass on a submission only if the new job fits in free(t).
            if claim {
                // A sensitive claim is immediate: its pool's pass runs now, not at the next cycle tick.
                if let Some(p) = self.pools.get_mut(&pool_key) {
                    p.due_at = Some(now);
                }
            } else if policy != Policy::PyssEasy || fits_free {
                self.mark_due(pool_key, now);
            }
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
        a.first_started.get_or_insert(now);
        let tenant = a.spec.tenant.index();
        if let Some(w) = a.spec.lifecycle.walltime() {
            self.running.remove(&(proposed_at + w, id));
            self.add_running(now + w, id);
        }
        let m = &mut self.meta[id.index()];
        m.proposed_at = None;
        // It runs: the nodes its victims freed were for this start. Should it wait again (requeued,
        // preempted), it queues as anyone else, not ahead of the pool.
        m.preemptor = false;
        if self.scored_any {
            self.ledger.start(now, tenant, m.usage_rate);
            let p = self.allocs[id.index()].spec.project.index();
            self.project_ledger.start(now, p, self.meta[id.index()].usage_rate);
        }
        let held = self.allocs[id.index()].nodes.len() as u64;
        self.committed_nodes[tenant] += held;
        self.committed_allocs[tenant] += 1;
        let p = &mut self.projects[self.allocs[id.index()].spec.project.index()];
        p.committed_nodes += held;
        p.committed_allocs += 1;
        if self.is_sensitive(id) {
            self.sensitive_nodes += held;
        }
        self.outstanding.retain(|&o| o != id);
        if self.scored_any
            && self.broker_next.is_none()
            && self.allocs[id.index()].spec.checkpoint.kind != crate::alloc::CheckpointKind::None
        {
            self.broker_next = Some(now + self.broker.interval);
        }
        if now != proposed_at {
            // The estimated end moved by the commit latency: the pool's reservations are re-planned.
            let key = self.pool_key_of(id);
            self.mark_due(key, now);
        }
        Ok(())
    }

    /// The quorum rejected a proposal (e.g. a conflicting commit won): release and requeue.
    pub fn handle_reject(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.unpropose(now, id)?;
        let key = self.pool_key_of(id);
        self.mark_due(key, now);
        Ok(())
    }

    /// The driver refused its own proposal before it reached the quorum (its network domain needs
    /// a VNI the pool has not): as a rejection, but retried at the pool's next cycle tick, not at
    /// once (nothing that could change the answer happened yet).
    pub fn handle_refused(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.unpropose(now, id)?;
        let key = self.pool_key_of(id);
        self.mark_due(key, now + crate::time::Duration(1));
        Ok(())
    }

    /// A proposal that will not be committed: the allocation gives its nodes back and queues again.
    fn unpropose(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let proposed_at = self.meta_of(id)?.proposed_at.ok_or(EngineError::NotProposed(id))?;
        if let Some(w) = self.allocs[id.index()].spec.lifecycle.walltime() {
            self.running.remove(&(proposed_at + w, id));
        }
        self.release_nodes(id);
        self.refund_budgets(id);
        self.outstanding.retain(|&o| o != id);
        let a = &mut self.allocs[id.index()];
        a.nodes.clear();
        a.backfilled = false;
        a.start_score = None;
        self.meta[id.index()].proposed_at = None;
        self.enqueue(id);
        Ok(())
    }

    /// Recovery after a driver restart: `id` (submitted again, still queued) already runs on `nodes`
    /// since `started` — the quorum still records them as its and its node agents never stopped it.
    /// It takes those nodes and runs from `started` (its estimated end is `started` + walltime), as if
    /// the quorum had just committed it; nothing is proposed. `submitted` restores its original
    /// submission time. Refused (nothing changes) when it is not a queued allocation without a
    /// proposal, or a node is unknown or not free.
    pub fn handle_adopt(
        &mut self,
        now: Time,
        id: AllocId,
        nodes: &[NodeId],
        submitted: Time,
        started: Time,
    ) -> Result<(), EngineError> {
        self.clock.advance(now);
        let a = self.allocs.get(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        if a.state != AllocState::Pending || self.meta[id.index()].proposed_at.is_some() || nodes.is_empty() {
            return Err(EngineError::InvalidTransition {
                id,
                from: a.state,
                to: AllocState::Running,
            });
        }
        for &n in nodes {
            if n.index() >= self.nodes.len() {
                return Err(EngineError::UnknownNode(n));
            }
            if !self.free.contains(n) {
                return Err(EngineError::NodeNotFree(n));
            }
        }
        let key = self.pool_key_of(id);
        if let Some(p) = self.pools.get_mut(&key) {
            p.queue.retain(|&q| q != id);
        }
        let mut nodes = nodes.to_vec();
        nodes.sort_unstable();
        self.propose(now, id, nodes, false);
        // The quorum already holds them: no proposal goes out.
        self.proposals.retain(|p| p.alloc != id);
        self.handle_commit(now, id)?;
        let started = started.min(now);
        let a = &mut self.allocs[id.index()];
        a.submitted = submitted.min(started);
        a.started = Some(started);
        a.first_started = Some(started);
        if let Some(w) = a.spec.lifecycle.walltime() {
            self.running.remove(&(now + w, id));
            self.add_running(started + w, id);
        }
        self.mark_due(key, now);
        Ok(())
    }

    /// Recovery after a driver restart: the queued allocation `id` was first submitted at
    /// `submitted` (before the restart); its wait counts from then.
    pub fn handle_resubmitted(&mut self, now: Time, id: AllocId, submitted: Time) -> Result<(), EngineError> {
        self.clock.advance(now);
        let a = self.allocs.get_mut(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        if a.state.is_terminal() {
            return Err(EngineError::InvalidTransition {
                id,
                from: a.state,
                to: AllocState::Pending,
            });
        }
        a.submitted = a.submitted.min(submitted);
        Ok(())
    }

    /// `PATCH /v1/allocations/{id}` with a new walltime (e.g. an extension): a bounded allocation that
    /// has not ended gets `walltime`; a holder's estimated end moves with it, and its pool re-plans its
    /// reservations at the next pass (an extension may push a promised start later; that is the
    /// operator's decision, not a backfill's).
    pub fn handle_walltime_update(
        &mut self,
        now: Time,
        id: AllocId,
        walltime: crate::time::Duration,
    ) -> Result<(), EngineError> {
        self.clock.advance(now);
        let a = self.allocs.get(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        let old = match a.spec.lifecycle {
            Lifecycle::Bounded { walltime } if !a.state.is_terminal() => walltime,
            _ => return Err(EngineError::WalltimeFixed(id)),
        };
        let since = self.meta[id.index()]
            .proposed_at
            .or(a.started.filter(|_| a.state == AllocState::Running));
        if let Some(t) = since
            && self.running.remove(&(t + old, id))
        {
            self.add_running(t + walltime, id);
        }
        std::sync::Arc::make_mut(&mut self.allocs[id.index()].spec).lifecycle = Lifecycle::Bounded { walltime };
        let key = self.pool_key_of(id);
        self.mark_due(key, now);
        Ok(())
    }

    /// A running allocation ended (its processes exited, or its node agent killed it at walltime).
    pub fn handle_completion(&mut self, now: Time, id: AllocId, reason: EndReason) -> Result<(), EngineError> {
        self.clock.advance(now);
        self.release_estimated_ends(now);
        if matches!(reason, EndReason::ExitFailure | EndReason::NodeFailure) && self.requeue_allowed(id, reason) {
            self.requeue(now, id)?;
            return Ok(());
        }
        let to = if reason == EndReason::Success {
            AllocState::Completed
        } else {
            AllocState::Failed
        };
        self.transition(id, to)?;
        self.finish(now, id, reason);
        // pyss: a termination always runs a pass.
        let key = self.pool_key_of(id);
        self.mark_due(key, now);
        // Hard quotas span pools: the tenant's (or project's) jobs waiting elsewhere may fit now.
        let spec = &self.allocs[id.index()].spec;
        let q = self.tenant_quota[spec.tenant.index()];
        if q.max_nodes.is_some()
            || q.max_concurrent_allocations.is_some()
            || self.projects[spec.project.index()].quota.is_hard()
        {
            let keys: Vec<u32> = self.pools.keys().copied().collect();
            for k in keys {
                self.mark_due(k, now);
            }
        }
        Ok(())
    }

    /// User or operator cancel: a pending allocation leaves the queue, a running one frees its nodes.
    /// A run lost as soon as it was committed: one of its nodes went out of service while its start
    /// was at the quorum (the quorum does not know node health). Requeued, or failed, as a node
    /// failure under a running allocation would be.
    pub fn handle_run_lost(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let a = self.allocation(id).ok_or(EngineError::UnknownAlloc(id))?;
        if a.state != AllocState::Running {
            return Err(EngineError::InvalidTransition {
                id,
                from: a.state,
                to: AllocState::Pending,
            });
        }
        self.lose_run(now, id)?;
        let key = self.pool_key_of(id);
        self.mark_due(key, now);
        Ok(())
    }

    /// A running allocation lost a node: requeued when its policy allows, else failed.
    fn lose_run(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        if self.requeue_allowed(id, EndReason::NodeFailure) {
            self.requeue(now, id)
        } else {
            self.transition(id, AllocState::Failed)?;
            self.finish(now, id, EndReason::NodeFailure);
            Ok(())
        }
    }

    /// Is the allocation's start at the quorum (proposed, not yet committed or rejected)?
    pub fn is_proposed(&self, id: AllocId) -> bool {
        self.allocation(id)
            .is_some_and(|a| matches!(a.state, AllocState::Pending | AllocState::Staging))
            && self.meta.get(id.index()).is_some_and(|m| m.proposed_at.is_some())
    }

    pub fn handle_cancel(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.clock.advance(now);
        let was = self.allocation(id).ok_or(EngineError::UnknownAlloc(id))?.state;
        if matches!(was, AllocState::Pending | AllocState::Staging) && self.meta[id.index()].proposed_at.is_some() {
            // An outstanding proposal: the driver will still report commit/reject; refuse for clarity.
            return Err(EngineError::InvalidTransition {
                id,
                from: was,
                to: AllocState::Cancelled,
            });
        }
        self.transition(id, AllocState::Cancelled)?;
        let key = self.pool_key_of(id);
        if let Some(p) = self.pools.get_mut(&key) {
            p.queue.retain(|&q| q != id);
        }
        self.finish(now, id, EndReason::UserCancelled);
        self.mark_due(key, now);
        Ok(())
    }

    /// May `id` be requeued after failing with `reason`? (Sensitive allocations never auto-requeue.)
    pub(crate) fn requeue_allowed(&self, id: AllocId, reason: EndReason) -> bool {
        let a = &self.allocs[id.index()];
        if self.is_sensitive(id) || a.requeues >= a.spec.max_requeues.min(crate::alloc::MAX_REQUEUES_LIMIT) {
            return false;
        }
        match a.spec.requeue {
            crate::alloc::RequeuePolicy::Never => false,
            crate::alloc::RequeuePolicy::OnNodeFailure => reason == EndReason::NodeFailure,
            crate::alloc::RequeuePolicy::Always => true,
        }
    }

    /// The node agent reports that the allocation's prologue (uenv pull/mount) failed on `node`. The
    /// allocation leaves its nodes and is retried on different nodes (the failed ones are taken last),
    /// keeping its submit time and sitting out this cycle; past `max_prologue_retries` it fails. Does
    /// not count against the requeue policy. Returns whether it was retried.
    pub fn handle_prologue_failure(&mut self, now: Time, id: AllocId, node: NodeId) -> Result<bool, EngineError> {
        self.clock.advance(now);
        let a = self.allocs.get(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        if a.state != AllocState::Running {
            return Err(EngineError::InvalidTransition {
                id,
                from: a.state,
                to: AllocState::Pending,
            });
        }
        if !a.nodes.contains(&node) {
            return Err(EngineError::UnknownNode(node));
        }
        let m = &mut self.meta[id.index()];
        m.prologue_failures += 1;
        if !m.avoid.contains(&node) {
            m.avoid.push(node);
        }
        if m.prologue_failures > self.config.max_prologue_retries {
            self.transition(id, AllocState::Failed)?;
            self.finish(now, id, EndReason::PrologueFailure);
            let key = self.pool_key_of(id);
            self.mark_due(key, now);
            return Ok(false);
        }
        self.requeue(now, id)?;
        self.allocs[id.index()].requeues -= 1;
        Ok(true)
    }

    /// Puts a failed running allocation back in the queue: original submit time kept, excluded from the
    /// pass of the cycle in which it failed.
    pub(crate) fn requeue(&mut self, now: Time, id: AllocId) -> Result<(), EngineError> {
        self.transition(id, AllocState::Suspended)?;
        self.stop_running(now, id);
        self.transition(id, AllocState::Pending)?;
        let a = &mut self.allocs[id.index()];
        a.requeues += 1;
        a.nodes.clear();
        a.started = None;
        a.backfilled = false;
        self.meta[id.index()].requeued_at = Some(now);
        self.enqueue(id);
        let key = self.pool_key_of(id);
        // Not in this cycle: the next one.
        self.mark_due(key, now + crate::time::Duration(1));
        Ok(())
    }

    /// A node state-machine event. Returns the allocations that lost their node (failed, or requeued per
    /// their requeue policy).
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
                self.nodes_not_ready.insert(node);
                if self.free.remove(node) {
                    self.free_by_class[c] -= 1;
                }
            }
            (false, true) => {
                self.nodes_not_ready.remove(&node);
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
                self.lose_run(now, id)?;
                failed.push(id);
            }
        }
        let key = self.class_keys[c].pool;
        self.mark_due(key, now);
        Ok(failed)
    }
}
