//! The invariant checker. It runs after every event and every pass when enabled (tests and debug builds),
//! and re-derives each property from the engine's public state rather than trusting the engine's own
//! bookkeeping:
//!
//! 1. time is monotonic;
//! 2. no node is owned twice, and every owner is a live allocation that lists that node;
//! 3. allocations never exceed available nodes (held nodes are all in a state that runs allocations);
//! 4. no reservation is delayed by a backfilled start: running allocations (until their estimated ends)
//!    plus all reservations never need more nodes of a class than the class has;
//! 5. hard quotas hold: no tenant's running allocations hold more than `max_nodes` nodes or number more
//!    than `max_concurrent_allocations`; sensitive allocations never exceed `sensitive_pool_size`;
//! 6. (when enabled) a promised start never moves later, and an allocation starts no later than its
//!    last promise — EASY's guarantee to the head job, conservative's to every job.

use lattice_engine::{AllocId, AllocState, Engine, Time};
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct InvariantChecker {
    last_time: Time,
    /// Last promised start per waiting allocation (when promises are checked).
    promises: BTreeMap<AllocId, Time>,
    check_promises: bool,
    pub checks: u64,
}

impl InvariantChecker {
    /// `check_promises`: also check that reservations never move later (property 5). It holds for EASY
    /// (one reservation, arrival order, zero commit latency) under any run times, and for deeper backfill
    /// when run times equal walltimes (early completions may legitimately reshuffle later reservations).
    pub fn new(check_promises: bool) -> InvariantChecker {
        InvariantChecker {
            check_promises,
            ..Default::default()
        }
    }

    pub fn on_event(&mut self, engine: &Engine, now: Time) -> Result<(), String> {
        self.checks += 1;
        if now < self.last_time {
            return Err(format!("time went backwards: {} after {}", now, self.last_time));
        }
        self.last_time = now;
        self.check_ownership(engine)
    }

    /// Checks after a pass (and the quorum's decisions on its proposals).
    pub fn after_pass(&mut self, engine: &Engine, now: Time) -> Result<(), String> {
        self.on_event(engine, now)?;
        self.check_reservations(engine, now)?;
        if self.check_promises {
            self.check_promises(engine)?;
        }
        Ok(())
    }

    /// O(nodes + running): every owned node's owner is a live allocation that lists it, and every
    /// allocation that holds nodes owns exactly the nodes it lists (so no node can be held twice).
    fn check_ownership(&self, engine: &Engine) -> Result<(), String> {
        let mut owned: BTreeMap<AllocId, usize> = BTreeMap::new();
        for node in engine.nodes() {
            let Some(o) = node.owner else { continue };
            let a = engine
                .allocation(o.alloc)
                .ok_or_else(|| format!("node {} is owned by unknown allocation {}", node.id, o.alloc))?;
            if !matches!(a.state, AllocState::Running | AllocState::Pending | AllocState::Staging) {
                return Err(format!("node {} is owned by {} which is {}", node.id, a.id, a.state));
            }
            if !a.nodes.contains(&node.id) {
                return Err(format!("node {} names owner {} which does not list it", node.id, a.id));
            }
            // (A start at the quorum may hold a node that went out meanwhile: the commit finds
            // the run lost.)
            if !node.state.runs_allocations() && !engine.is_proposed(a.id) {
                return Err(format!(
                    "allocation {} holds node {} in state {}",
                    a.id, node.id, node.state
                ));
            }
            *owned.entry(o.alloc).or_default() += 1;
        }
        // Hard quotas, recounted from node ownership: committed (running) allocations only.
        let mut per_tenant: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let mut sensitive = 0u64;
        for (&id, &n) in &owned {
            let a = engine.allocation(id).expect("owner exists");
            let listed = a.nodes.len();
            if n != listed {
                return Err(format!(
                    "allocation {id} lists {listed} nodes but owns {n}: a node is held twice"
                ));
            }
            if a.state == AllocState::Running {
                let e = per_tenant.entry(a.spec.tenant.0).or_default();
                e.0 += n as u64;
                e.1 += 1;
                if engine.is_sensitive(id) {
                    sensitive += n as u64;
                }
            }
        }
        for (&t, &(nodes, allocs)) in &per_tenant {
            let q = engine
                .tenant_quota(lattice_engine::TenantId(t))
                .copied()
                .unwrap_or_default();
            if q.max_nodes.is_some_and(|m| nodes > m as u64) {
                return Err(format!(
                    "tenant {t} holds {nodes} nodes, over its max_nodes {:?}",
                    q.max_nodes
                ));
            }
            if q.max_concurrent_allocations.is_some_and(|m| allocs > m as u64) {
                return Err(format!(
                    "tenant {t} runs {allocs} allocations, over max_concurrent_allocations {:?}",
                    q.max_concurrent_allocations
                ));
            }
        }
        if let Some(size) = engine.config().sensitive_pool_size
            && sensitive > size as u64
        {
            return Err(format!(
                "sensitive allocations hold {sensitive} nodes, over sensitive_pool_size {size}"
            ));
        }
        for (end, id) in engine.running_estimates() {
            // pyss releases a job's nodes at its estimated end, just before its termination event.
            let early_release = engine.config().policy == lattice_engine::Policy::PyssEasy && end <= self.last_time;
            let listed = engine.allocation(id).map_or(0, |a| a.nodes.len());
            if !early_release && owned.get(&id).copied().unwrap_or(0) != listed {
                return Err(format!(
                    "running allocation {id} lists {listed} nodes but does not own them all"
                ));
            }
        }
        if owned.values().sum::<usize>() > engine.nodes().len() {
            return Err("more nodes held than exist".into());
        }
        Ok(())
    }

    fn check_reservations(&self, engine: &Engine, now: Time) -> Result<(), String> {
        let classes = engine.class_count();
        // Capacity per class: nodes that are free or held by an allocation that can release them.
        let mut cap = vec![0i64; classes];
        for n in engine.nodes() {
            if n.state.schedulable() {
                cap[engine.class_of(n.id) as usize] += 1;
            }
        }
        // usage deltas over time, per class.
        let mut deltas: BTreeMap<(Time, u8), Vec<(u16, i64)>> = BTreeMap::new();
        let mut usage_now = vec![0i64; classes];
        for (end, id) in engine.running_estimates() {
            // A victim being preempted releases its nodes by its stop order's limit, as the engine
            // plans it (should it take longer, its preemptor's reservation waits for it, not for a
            // backfill).
            let end = engine.released_by(id).map_or(end, |r| r.min(end));
            let a = engine.allocation(id).expect("running alloc exists");
            for n in &a.nodes {
                if engine
                    .node(*n)
                    .is_some_and(|x| x.state.schedulable() && x.owner.map(|o| o.alloc) == Some(id))
                {
                    let c = engine.class_of(*n);
                    usage_now[c as usize] += 1;
                    if end > now {
                        deltas.entry((end, 0)).or_default().push((c, -1));
                    } else {
                        usage_now[c as usize] -= 1;
                    }
                }
            }
        }
        // Allocations without a walltime hold their nodes forever.
        for a in engine.allocations() {
            if a.state == AllocState::Running && a.spec.lifecycle.walltime().is_none() {
                for n in &a.nodes {
                    if engine.node(*n).is_some_and(|x| x.state.schedulable()) {
                        usage_now[engine.class_of(*n) as usize] += 1;
                    }
                }
            }
        }
        for r in engine.reservations() {
            // Only this pass's reservations must lie ahead; an untouched pool's may have gone stale.
            if r.made == now && r.start < now {
                return Err(format!(
                    "reservation of {} starts in the past ({} < {})",
                    r.alloc, r.start, now
                ));
            }
            for &(c, k) in &r.picks {
                deltas.entry((r.start, 1)).or_default().push((c, k as i64));
                if let Some(e) = r.end {
                    deltas.entry((e, 0)).or_default().push((c, -(k as i64)));
                }
            }
        }
        let mut usage = usage_now;
        for c in 0..classes {
            if usage[c] > cap[c] {
                return Err(format!(
                    "class {c}: {} nodes in use but only {} exist",
                    usage[c], cap[c]
                ));
            }
        }
        for ((t, _), ds) in deltas {
            for (c, d) in ds {
                usage[c as usize] += d;
            }
            for c in 0..classes {
                if usage[c] > cap[c] {
                    return Err(format!(
                        "at {t}: class {c} needs {} nodes for running allocations and reservations but has {} \
                         (a backfilled start delayed a reservation)",
                        usage[c], cap[c]
                    ));
                }
            }
        }
        Ok(())
    }

    /// A promised start (a reservation) may move earlier but never later, and the allocation starts no
    /// later than its last promise.
    fn check_promises(&mut self, engine: &Engine) -> Result<(), String> {
        let mut done = Vec::new();
        for (&id, &at) in &self.promises {
            let a = engine.allocation(id).expect("promised allocation exists");
            if let Some(s) = a.started {
                if s > at {
                    return Err(format!(
                        "allocation {id} was promised a start at {at} but started at {s}"
                    ));
                }
                done.push(id);
            }
        }
        for id in done {
            self.promises.remove(&id);
        }
        for r in engine.reservations() {
            if let Some(&old) = self.promises.get(&r.alloc)
                && r.start > old
            {
                return Err(format!(
                    "reservation of {} moved later, from {old} to {} (a reservation was delayed)",
                    r.alloc, r.start
                ));
            }
            self.promises.insert(r.alloc, r.start);
        }
        Ok(())
    }
}
