//! The invariant checker. It runs after every event and every pass when enabled (tests and debug builds),
//! and re-derives each property from the engine's public state rather than trusting the engine's own
//! bookkeeping:
//!
//! 1. time is monotonic;
//! 2. no node is owned twice, and every owner is a live allocation that lists that node;
//! 3. allocations never exceed available nodes (held nodes are all in a state that runs allocations);
//! 4. no reservation is delayed by a backfilled start: running allocations (until their estimated ends)
//!    plus all reservations never need more nodes of a class than the class has;
//! 5. for EASY-style policies (one reservation, arrival order, zero commit latency), the head's reservation
//!    never moves later while it waits, and it starts no later than its reservation.

use lattice_engine::{AllocId, AllocState, Engine, Time};
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct InvariantChecker {
    last_time: Time,
    /// (alloc, reserved start) of the EASY head at the last pass.
    head: Option<(AllocId, Time)>,
    check_head: bool,
    pub checks: u64,
}

impl InvariantChecker {
    pub fn new(check_head_monotonic: bool) -> InvariantChecker {
        InvariantChecker {
            check_head: check_head_monotonic,
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
        if self.check_head {
            self.check_easy_head(engine)?;
        }
        Ok(())
    }

    fn check_ownership(&self, engine: &Engine) -> Result<(), String> {
        let mut seen: BTreeMap<u32, AllocId> = BTreeMap::new();
        for a in engine.allocations() {
            let holds = matches!(a.state, AllocState::Running | AllocState::Pending) && !a.nodes.is_empty();
            if !holds {
                continue;
            }
            for n in &a.nodes {
                let node = engine
                    .node(*n)
                    .ok_or_else(|| format!("alloc {} holds unknown node {n}", a.id))?;
                match node.owner {
                    Some(o) if o.alloc == a.id => {
                        if let Some(other) = seen.insert(n.0, a.id) {
                            return Err(format!("node {n} is owned by both {other} and {}", a.id));
                        }
                        if !node.state.runs_allocations() {
                            return Err(format!("alloc {} holds node {n} in state {}", a.id, node.state));
                        }
                    }
                    // pyss releases a job's nodes at its estimated end, just before its termination event.
                    _ if a.state == AllocState::Running && a.estimated_end().is_some_and(|e| e <= self.last_time) => {}
                    other => return Err(format!("alloc {} lists node {n} but its owner is {other:?}", a.id)),
                }
            }
        }
        for node in engine.nodes() {
            if let Some(o) = node.owner
                && seen.get(&node.id.0) != Some(&o.alloc)
            {
                return Err(format!(
                    "node {} names owner {} which does not hold it",
                    node.id, o.alloc
                ));
            }
        }
        if seen.len() > engine.nodes().len() {
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
            if r.start < now {
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

    fn check_easy_head(&mut self, engine: &Engine) -> Result<(), String> {
        if let Some((id, at)) = self.head {
            let a = engine.allocation(id).expect("head exists");
            if let Some(s) = a.started
                && s > at
            {
                return Err(format!("EASY head {id} was reserved for {at} but started at {s}"));
            }
        }
        let current = engine.reservations().first().map(|r| (r.alloc, r.start));
        if let (Some((prev_id, prev_at)), Some((id, at))) = (self.head, current)
            && prev_id == id
            && at > prev_at
        {
            return Err(format!(
                "EASY head {id}: reservation moved later, from {prev_at} to {at}"
            ));
        }
        self.head = current;
        Ok(())
    }
}
