//! Scheduling passes: the solver `GreedyTopologyAwareBackfill` of the scheduling-algorithm seed and the
//! literature policies, one pass per pool whose cycle is due.
//!
//! A pass (1) orders the pool's queue — by arrival, or by `Score(j)` descending when its vCluster has
//! weights; (2) walks the queue: an allocation that can start now gets a placement from the class picker
//! (fewest groups, largest conformance group, power cap) and is proposed; the first `d` that cannot get
//! reservations (DESIGN.md §3 "Backfill") at the earliest time the profile allows, holding concrete
//! classes — groups and conformance groups — so later starts cannot take what a reservation needs.
//!
//! How the two cycle-wide components act (they are equal for every job, so they cannot reorder the queue):
//! - **f6 backlog pressure** scales backfill aggressiveness: with weights, the effective depth is
//!   `max(1, ceil(d · (1 − f6/2)))` — a deep backlog protects fewer jobs with reservations so more
//!   backfill; [`Engine::backlog_pressure`] exposes it to the checkpoint broker.
//! - **f7 energy** lets time-flexible jobs wait for cheap windows: an allocation with preemption class
//!   ≤ 3 whose wait is below its reference wait is *deferred* (not started, no reservation) when the
//!   price series has, before `submit + reference_wait`, a normalised price at least `(1 − w7)/2` below
//!   the current one; the pool's next pass is then due at the next price change.
//!
//! Reservations hold nodes; power, storage bandwidth and GPU-hours budgets are checked per cycle, so an
//! allocation whose nodes are free but whose power is not gets no reservation (no promise) that cycle.
//!
//! And how f4 can make a job *wait for good topology* (the tuning guide's "low w2, high w4"): a job whose
//! placement now spans more groups than it would on its eligible nodes at best is deferred while the
//! score it would gain from the better placement, `w4 · Δf4`, exceeds its wait term `w2 · f2`; as its wait
//! grows, f2 grows and it starts anyway. A job whose topology hint is `any` never waits for topology.

use std::collections::BTreeMap;

use crate::alloc::AllocState;
use crate::classes::{PickRules, Placement, pick, pick_into};
use crate::cost::{CostInputs, ScoreBreakdown, score};
use crate::engine::{Engine, PassStats, Reservation};
use crate::ids::{AllocId, NodeId};
use crate::policy::{Depth, Policy};
use crate::profile::{FitMemo, Picks, Profile};
use crate::time::{Duration, Time};
use crate::waiting::Waiting;
use crate::weights::CostWeights;

/// Preemption classes up to this are time-flexible for energy deferral.
pub const FLEXIBLE_CLASS_MAX: u8 = 3;

/// What the cost function's topology (f4) and conformance (f9) terms read of the free nodes for a
/// request's shape.
#[derive(Clone, Copy, Debug)]
struct TopologyInputs {
    groups_needed: u32,
    max_groups_available: u32,
    largest_conformance_group: u32,
}

/// One pass's [`TopologyInputs`] by shape (nodes, eligible classes): the free counts do not change
/// while the queue is scored.
#[derive(Default)]
struct TopologyMemo<'a>(std::collections::BTreeMap<(u32, &'a [u16]), TopologyInputs>);

impl Engine {
    /// Runs a pass for every pool whose cycle is due at `now`. Proposals are then available from
    /// [`Engine::poll_proposal`].
    pub fn schedule(&mut self, now: Time) -> PassStats {
        self.clock.advance(now);
        if self.scored_any {
            self.ledger.accrue(now);
        }
        if self.scored_any {
            self.project_ledger.accrue(now);
        }
        let staged = self.advance_staging(now);
        if staged > 0 {
            // Newly staged jobs may start: every pool re-plans.
            let keys: Vec<u32> = self.pools.keys().copied().collect();
            for k in keys {
                self.mark_due(k, now);
            }
        }
        let hinted = self.run_broker(now);
        self.last_scale_stats = self.autoscale(now);
        if !self.pools.values().any(|p| p.due_at.is_some_and(|d| d <= now)) {
            return PassStats {
                checkpoint_hints: hinted,
                ..PassStats::default()
            };
        }
        let due: Vec<u32> = self
            .pools
            .iter()
            .filter(|(_, p)| p.due_at.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        let mut total = PassStats {
            checkpoint_hints: hinted,
            ..PassStats::default()
        };
        for key in due {
            let pool = self.pools.get_mut(&key).expect("due pool exists");
            pool.due_at = None;
            pool.reservations.clear();
            self.passes += 1;
            let s = self.pass_pool(now, key);
            total.ran = true;
            total.started += s.started;
            total.backfilled += s.backfilled;
            total.reservations += s.reservations;
            total.deferred += s.deferred;
            total.deferred_topology += s.deferred_topology;
            total.preemptions += s.preemptions;
            total.borrowed += s.borrowed;
        }
        total
    }

    /// The current score breakdown of a pending allocation (what a site reviewer asks: "why did X run
    /// before Y?"). `None` for unknown allocations or vClusters without weights.
    pub fn score_breakdown(&self, id: AllocId) -> Option<ScoreBreakdown> {
        let a = self.allocs.get(id.index())?;
        let w = self.vc_config[a.spec.vcluster.index()].weights?;
        let key = self.pool_key_of(id);
        let ctx = self.score_context(self.clock.now(), key);
        Some(self.score_of(id, &w, &ctx))
    }

    /// f6 of a vCluster's pool: `min(1, queued GPU-hours / running GPU-hours)` (node-hours on CPU pools).
    pub fn backlog_pressure(&self, vcluster: crate::ids::VClusterId) -> f64 {
        let key = self.pool_of_vc.get(vcluster.index()).copied().unwrap_or(0);
        self.pool_backlog(key)
    }

    fn pass_pool(&mut self, now: Time, key: u32) -> PassStats {
        let pool = self.pools.get_mut(&key).expect("pool exists");
        let mut queue = std::mem::take(&mut pool.queue);
        let policy = pool.config.policy;
        if policy == Policy::PyssEasy {
            let (stats, rest) = self.pass_pyss(now, key, queue);
            self.pools.get_mut(&key).expect("pool").queue = rest;
            return stats;
        }
        let scored = self.pool_scored(key);
        let ctx = scored.then(|| self.score_context(now, key));
        let mut scores: Vec<(AllocId, Option<ScoreBreakdown>)> = Vec::new();
        if let Some(ctx) = &ctx {
            let t0 = self.stopwatch.map(|f| f());
            scores.reserve(queue.len());
            // Jobs of one shape (eligible classes, nodes) share their topology inputs: computed
            // once per shape, so scoring a long queue costs little more than its arithmetic.
            let mut memo = TopologyMemo::default();
            for &id in &queue {
                let w = self.vc_config[self.allocs[id.index()].spec.vcluster.index()].weights;
                scores.push((
                    id,
                    w.map(|w| {
                        let (eligible, k) = (&self.meta[id.index()].eligible, self.allocs[id.index()].spec.nodes.min);
                        let topo = *memo
                            .0
                            .entry((k, eligible.as_slice()))
                            .or_insert_with(|| self.topology_inputs(eligible, k));
                        self.score_with(id, &w, ctx, topo)
                    }),
                ));
            }
            if let (Some(f), Some(t0)) = (self.stopwatch, t0) {
                self.cost_ns.push((key, f().saturating_sub(t0)));
            }
            // Highest score first; ties by arrival.
            scores.sort_by(|a, b| {
                let (sa, sb) = (a.1.map_or(0.0, |s| s.total), b.1.map_or(0.0, |s| s.total));
                sb.total_cmp(&sa).then(a.0.cmp(&b.0))
            });
            queue = scores.iter().map(|s| s.0).collect();
        }
        // Sensitive claims first, then allocations that victims were preempted for (stable otherwise).
        let rank = |e: &Engine, id: AllocId| -> u8 {
            if e.allocs[id.index()].spec.sensitive_claim {
                0
            } else if e.meta[id.index()].preemptor {
                1
            } else {
                2
            }
        };
        if queue.iter().any(|&q| rank(self, q) < 2) {
            let mut idx: Vec<usize> = (0..queue.len()).collect();
            idx.sort_by_key(|&i| rank(self, queue[i]));
            queue = idx.iter().map(|&i| queue[i]).collect();
            if !scores.is_empty() {
                scores = idx.iter().map(|&i| scores[i]).collect();
            }
        }
        let depth = match policy {
            Policy::Fcfs | Policy::Reservation => None,
            Policy::BinPack => Some(Depth::Limited(0)),
            Policy::Backfill {
                depth: Depth::Limited(d),
            } if d > 1 && ctx.is_some() => {
                let backlog = ctx.as_ref().map_or(0.0, |c| c.backlog);
                Some(Depth::Limited(
                    ((d as f64) * (1.0 - backlog / 2.0)).ceil().max(1.0) as u32
                ))
            }
            Policy::Backfill { depth } => Some(depth),
            Policy::PyssEasy => unreachable!("handled above"),
        };
        let rules = PickRules {
            conformance_hard: policy == Policy::Reservation,
            power_cap_w: None,
        };
        let (mut stats, mut rest) = self.pass_backfill(now, key, queue, depth, rules, &scores, ctx.as_ref());
        if scored && self.pools.len() > 1 && !rest.is_empty() {
            self.borrow_phase(now, key, &mut rest, &scores, rules, &mut stats);
        }
        // Claims are immediate or refused: none stays queued.
        self.refuse_unplaced_claims(now, &mut rest);
        if scored {
            rest.sort_unstable();
        }
        self.pools.get_mut(&key).expect("pool").queue = rest;
        stats
    }

    #[allow(clippy::too_many_arguments)]
    fn pass_backfill(
        &mut self,
        now: Time,
        key: u32,
        queue: Vec<AllocId>,
        depth: Option<Depth>,
        rules: PickRules,
        scores: &[(AllocId, Option<ScoreBreakdown>)],
        ctx: Option<&ScoreContext>,
    ) -> (PassStats, Vec<AllocId>) {
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
        let mut placement = Placement::default();
        let mut failed_fits = FitMemo::default();
        let mut deferred_any = false;
        // Tenants with work waiting in this pool at the start of the pass (for the burst allowance).
        let mut waiting = Vec::new();
        if ctx.is_some() {
            waiting = vec![false; self.tenant_quota.len()];
            for &id in &queue {
                waiting[self.allocs[id.index()].spec.tenant.index()] = true;
            }
        }
        for (i, &id) in queue.iter().enumerate() {
            let k = self.allocs[id.index()].spec.nodes.min;
            let walltime = self.allocs[id.index()].spec.lifecycle.walltime();
            let breakdown = scores.get(i).and_then(|s| s.1);
            // Data staging below 80 %: held in the queue (f5 already ranks it lower).
            if !self.staged_enough(id) {
                self.meta[id.index()].waiting = Some(Waiting::Staging);
                keep.push(id);
                continue;
            }
            // Task-group concurrency and mutex (singleton) limits: wait without blocking others.
            if self.group_or_mutex_busy(id) {
                self.meta[id.index()].waiting = Some(Waiting::GroupLimit);
                keep.push(id);
                continue;
            }
            // Just requeued: excluded from this cycle's pending set (TOCTOU prevention); the next cycle
            // considers it.
            if self.meta[id.index()].requeued_at == Some(now) {
                self.meta[id.index()].waiting = Some(Waiting::Requeued);
                keep.push(id);
                let pool = self.pools.get_mut(&key).expect("pool");
                let next = now + Duration(1);
                pool.due_at = Some(pool.due_at.map_or(next, |d| d.min(next)));
                continue;
            }
            // A claim is immediate or refused: it never waits for a cheaper window or a tighter fit.
            let claim = self.allocs[id.index()].spec.sensitive_claim;
            if let Some(ctx) = ctx
                && !claim
                && self.defer_for_energy(now, id, ctx)
            {
                self.meta[id.index()].waiting = Some(Waiting::EnergyWindow);
                stats.deferred += 1;
                deferred_any = true;
                keep.push(id);
                continue;
            }
            let budget = self.budgets_allow(id);
            let budget_ok = budget && self.quota_allows(id, key, k, ctx, &waiting);
            // Why it waits if it does not start now (refined below where a reservation is made).
            let held = if !budget {
                Waiting::Budget
            } else if !budget_ok {
                Waiting::Quota
            } else {
                Waiting::Resources
            };
            let start_rules = PickRules {
                power_cap_w: self.power_headroom(),
                conformance_hard: rules.conformance_hard || claim,
            };
            let Some(p) = profile.as_mut() else {
                // Nothing is blocked yet: every start so far is in queue order.
                if budget_ok && self.place_now(id, k, start_rules, &mut placement) {
                    let a = &self.allocs[id.index()];
                    let max = if a.spec.scale.is_some() { k } else { a.spec.nodes.max };
                    if max > k {
                        // Node ranges take as many nodes as are free, up to max.
                        let mut wider = Placement::default();
                        let best = largest_feasible(k, max, |n| self.place_now(id, n, start_rules, &mut wider));
                        if best > k {
                            self.place_now(id, best, start_rules, &mut placement);
                        }
                    }
                    if !claim && self.defer_for_topology(now, id, placement.groups) {
                        self.meta[id.index()].waiting = Some(Waiting::Topology);
                        stats.deferred_topology += 1;
                        keep.push(id);
                        continue;
                    }
                    let pl = std::mem::take(&mut placement);
                    self.start(now, id, &pl, false, breakdown);
                    placement = pl;
                    stats.started += 1;
                    continue;
                }
                // A sensitive claim takes its nodes at once: non-sensitive occupants are preempted.
                // One that cannot have them now blocks nobody: it is refused after the pass.
                if claim {
                    if budget_ok {
                        let hard = PickRules {
                            conformance_hard: true,
                            ..rules
                        };
                        stats.preemptions += self.try_preempt_for_claim(now, id, key, hard);
                    }
                    if self.meta[id.index()].awaiting_victims == 0 {
                        self.meta[id.index()].waiting = Some(held);
                        keep.push(id);
                        continue;
                    }
                }
                // The head (highest priority) is blocked: does the pool want lent nodes back, or may it
                // preempt lower classes?
                else if budget_ok && self.pool_preempts(key) {
                    let reclaimed = self.try_reclaim(now, id, key, rules);
                    stats.preemptions += reclaimed;
                    if reclaimed == 0 {
                        stats.preemptions += self.try_preempt(now, id, key, rules);
                    }
                }
                // FCFS: the head blocks everything behind it.
                let Some(depth) = depth else {
                    self.meta[id.index()].waiting = Some(held);
                    self.behind(&queue[i + 1..], id);
                    keep.extend_from_slice(&queue[i..]);
                    break;
                };
                base = i;
                suffix_min = self.suffix_min_nodes(&queue[i..]);
                let p = profile.insert(self.build_profile(now, key));
                blocked = true;
                let mut why = held;
                if budget_ok
                    && let Some(start) = self.reserve_if_allowed(p, id, k, walltime, depth, rules, &mut stats, key)
                {
                    why = Waiting::Reserved { start };
                }
                self.meta[id.index()].waiting = Some(why);
                keep.push(id);
                continue;
            };
            if p.free_total_now() < suffix_min[i - base] as i64 {
                for &rest in &queue[i..] {
                    self.meta[rest.index()].waiting = Some(Waiting::Resources);
                }
                keep.extend_from_slice(&queue[i..]);
                break;
            }
            let eligible = &self.meta[id.index()].eligible;
            let tried = budget_ok && !failed_fits.known_to_fail(eligible, start_rules, k, walltime);
            let fit = tried
                && p.fit(0, walltime, eligible, k, &self.class_info, start_rules, &mut placement)
                    .is_ok();
            if tried && !fit {
                failed_fits.record_failure(eligible, start_rules, k, walltime);
            }
            let a = &self.allocs[id.index()];
            let max = if a.spec.scale.is_some() { k } else { a.spec.nodes.max };
            if fit && max > k {
                let eligible = &self.meta[id.index()].eligible;
                let mut wider = Placement::default();
                let best = largest_feasible(k, max, |n| {
                    p.fit(0, walltime, eligible, n, &self.class_info, start_rules, &mut wider)
                        .is_ok()
                });
                if best > k {
                    let ok = p.fit(
                        0,
                        walltime,
                        eligible,
                        best,
                        &self.class_info,
                        start_rules,
                        &mut placement,
                    );
                    debug_assert!(ok.is_ok());
                }
            }
            if fit && !claim && self.defer_for_topology(now, id, placement.groups) {
                self.meta[id.index()].waiting = Some(Waiting::Topology);
                stats.deferred_topology += 1;
                keep.push(id);
                continue;
            }
            if fit {
                p.reserve(now, walltime, &placement.picks);
                let pl = std::mem::take(&mut placement);
                self.start(now, id, &pl, blocked, breakdown);
                placement = pl;
                stats.started += 1;
                stats.backfilled += blocked as u32;
            } else {
                let depth = depth.expect("profile is only built for backfill");
                let mut why = held;
                if budget_ok
                    && let Some(start) = self.reserve_if_allowed(p, id, k, walltime, depth, rules, &mut stats, key)
                {
                    why = Waiting::Reserved { start };
                }
                self.meta[id.index()].waiting = Some(why);
                keep.push(id);
            }
        }
        if deferred_any && let Some(t) = self.config.energy_prices.iter().map(|p| p.0).find(|&t| t > now) {
            let pool = self.pools.get_mut(&key).expect("pool");
            pool.due_at = Some(pool.due_at.map_or(t, |d| d.min(t)));
        }
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
        rules: PickRules,
        stats: &mut PassStats,
        key: u32,
    ) -> Option<Time> {
        let allowed = match depth {
            Depth::Unlimited => true,
            Depth::Limited(d) => stats.reservations < d,
        };
        if !allowed {
            return None;
        }
        let mut out = Placement::default();
        let eligible = &self.meta[id.index()].eligible;
        if let Some(start) = p.earliest(walltime, eligible, k, &self.class_info, rules, &mut out) {
            if start == p.now() {
                // Its nodes are free now: only a per-cycle dimension (power, budgets) holds it back.
                // Reservations cover nodes; the next cycle re-checks the rest, so no promise is made.
                return None;
            }
            p.reserve(start, walltime, &out.picks);
            self.pools.get_mut(&key).expect("pool").reservations.push(Reservation {
                alloc: id,
                start,
                made: p.now(),
                end: walltime.map(|w| start + w),
                picks: out.picks,
            });
            stats.reservations += 1;
            return Some(start);
        }
        None
    }

    /// `queue` waits behind `head` (which blocks it).
    fn behind(&mut self, queue: &[AllocId], head: AllocId) {
        for &id in queue {
            self.meta[id.index()].waiting = Some(Waiting::BehindHead { head });
        }
    }

    /// Is the allocation's task group at its concurrency limit, or its mutex held by another running
    /// (or proposed) allocation?
    fn group_or_mutex_busy(&self, id: AllocId) -> bool {
        let a = &self.allocs[id.index()];
        if let Some(tg) = a.spec.task_group
            && let Some(limit) = tg.concurrency
            && self.group_running.get(&tg.group).copied().unwrap_or(0) >= limit
        {
            return true;
        }
        a.spec.mutex.as_ref().is_some_and(|m| self.mutex_held.contains_key(m))
    }

    /// A placement on the nodes free now, written into `out`.
    fn place_now(&self, id: AllocId, k: u32, rules: PickRules, out: &mut Placement) -> bool {
        let eligible = &self.meta[id.index()].eligible;
        if let [c] = eligible[..] {
            return pick_into(&self.class_info, &[(c, self.free_by_class[c as usize])], k, rules, out);
        }
        let avail: Picks = eligible
            .iter()
            .map(|&c| (c, self.free_by_class[c as usize]))
            .filter(|a| a.1 > 0)
            .collect();
        pick_into(&self.class_info, &avail, k, rules, out)
    }

    /// Proposes `id` on concrete nodes: per class of the placement, the lowest free node ids.
    fn start(&mut self, now: Time, id: AllocId, pl: &Placement, backfilled: bool, score: Option<ScoreBreakdown>) {
        self.meta[id.index()].waiting = None;
        let k: u32 = pl.picks.iter().map(|p| p.1).sum();
        let mut need = pl.picks.clone();
        let mut nodes: Vec<NodeId> = Vec::with_capacity(k as usize);
        // Nodes its prologue failed on go last: retried on different nodes where the class has them.
        let avoid = std::mem::take(&mut self.meta[id.index()].avoid);
        if self.class_keys.len() == 1 && avoid.is_empty() {
            // One class (every homogeneous machine): the lowest free ids.
            nodes.extend(self.free.iter().take(k as usize));
            need.clear();
        } else if self.class_keys.len() == 1 {
            need = vec![(0, k)];
        }
        for last in [false, true] {
            for n in self.free.iter() {
                if need.iter().all(|p| p.1 == 0) || nodes.len() == k as usize {
                    break;
                }
                if avoid.contains(&n) != last {
                    continue;
                }
                let c = self.class_of[n.index()];
                if let Some(p) = need.iter_mut().find(|p| p.0 == c)
                    && p.1 > 0
                {
                    p.1 -= 1;
                    nodes.push(n);
                }
            }
            if avoid.is_empty() {
                break;
            }
        }
        self.meta[id.index()].avoid = avoid;
        nodes.sort_unstable();
        assert_eq!(
            nodes.len(),
            k as usize,
            "placement of {id} asked for {k} nodes but only {} were free in its classes",
            nodes.len()
        );
        self.allocs[id.index()].start_score = score.map(Box::new);
        self.propose(now, id, nodes, backfilled);
    }

    /// GPU-hours budget of the vCluster and the storage bandwidth of the site (checked per cycle).
    fn budgets_allow(&self, id: AllocId) -> bool {
        let a = &self.allocs[id.index()];
        let vc = a.spec.vcluster.index();
        let gpu_ok = self.vc_config[vc]
            .gpu_hours_budget
            .is_none_or(|b| self.gpu_hours_committed[vc] + self.meta[id.index()].requested_gpu_hours <= b + 1e-9);
        let storage_ok = match (self.config.storage_bandwidth_gbps, a.spec.storage_gbps) {
            (Some(cap), Some(need)) => self.storage_used_gbps + need <= cap + 1e-9,
            _ => true,
        };
        gpu_ok && storage_ok
    }

    /// The scheduler's own, eventually consistent view of hard quotas: committed usage plus this pool's
    /// outstanding proposals (another vCluster's proposals are only seen once committed, so concurrent
    /// proposals can still conflict; the quorum then rejects the later one). Also the burst allowance:
    /// above `burst × target` a tenant only starts when no other tenant waits in the pool.
    fn quota_allows(&self, id: AllocId, key: u32, k: u32, ctx: Option<&ScoreContext>, waiting: &[bool]) -> bool {
        let a = &self.allocs[id.index()];
        let t = a.spec.tenant.index();
        let q = &self.tenant_quota[t];
        let project = &self.projects[a.spec.project.index()];
        let (mut nodes, mut allocs) = (self.committed_nodes[t], self.committed_allocs[t]);
        let (mut p_nodes, mut p_allocs) = (project.committed_nodes, project.committed_allocs);
        let mut sensitive_pending = 0;
        for &o in &self.outstanding {
            if self.pool_key_of(o) != key {
                continue;
            }
            let oa = &self.allocs[o.index()];
            if oa.spec.tenant.index() == t {
                nodes += oa.nodes.len() as u64;
                allocs += 1;
            }
            if oa.spec.project == a.spec.project {
                p_nodes += oa.nodes.len() as u64;
                p_allocs += 1;
            }
            sensitive_pending += oa.nodes.len() as u64;
        }
        if crate::quota::check_hard("", q, nodes, allocs, k as u64).is_err()
            || crate::quota::check_project("", "", &project.quota, p_nodes, p_allocs, k as u64).is_err()
        {
            return false;
        }
        if let Some(size) = self.config.sensitive_pool_size
            && self.pools[&key].config.policy == Policy::Reservation
            && self.sensitive_nodes + sensitive_pending + k as u64 > size as u64
        {
            return false;
        }
        if let Some(ctx) = ctx
            && let Some(burst) = q.burst_allowance
        {
            let share = ctx.shares.get(t).copied().unwrap_or(0.0);
            let target = ctx.targets.get(t).copied().unwrap_or(0.0);
            if target > 0.0 && share > burst * target {
                let others_wait = waiting.iter().enumerate().any(|(o, &w)| w && o != t);
                if others_wait {
                    return false;
                }
            }
        }
        true
    }

    fn power_headroom(&self) -> Option<u64> {
        self.config.power_budget_w.map(|b| b.saturating_sub(self.power_used_w))
    }

    /// f4's wait-for-topology rule (see the module docs).
    fn defer_for_topology(&self, now: Time, id: AllocId, groups_now: u32) -> bool {
        let a = &self.allocs[id.index()];
        let vc = &self.vc_config[a.spec.vcluster.index()];
        let Some(w) = vc.weights else {
            return false;
        };
        if w.topology <= 0.0 || groups_now <= 1 || a.spec.constraints.topology == Some(crate::TopologyHint::Any) {
            return false;
        }
        let m = &self.meta[id.index()];
        let total: Picks = m.eligible.iter().map(|&c| (c, self.class_total[c as usize])).collect();
        let Some(ideal) = pick(&self.class_info, &total, a.spec.nodes.min, PickRules::default()) else {
            return false;
        };
        if groups_now <= ideal.groups {
            return false;
        }
        let mut groups: Vec<u32> = m
            .eligible
            .iter()
            .map(|&c| self.class_info[c as usize].group.0)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        let gain = w.topology * (groups_now - ideal.groups) as f64 / groups.len().max(1) as f64;
        let wait = crate::cost::f2_wait(now.since(a.submitted).as_secs_f64(), vc.reference_wait.as_secs_f64());
        gain > w.wait_time * wait
    }

    /// f7's deferral rule (see the module docs).
    fn defer_for_energy(&self, now: Time, id: AllocId, ctx: &ScoreContext) -> bool {
        let a = &self.allocs[id.index()];
        let Some(w) = self.vc_config[a.spec.vcluster.index()].weights else {
            return false;
        };
        if w.energy <= 0.0 || a.spec.preemption_class.get() > FLEXIBLE_CLASS_MAX || ctx.price_norm.is_none() {
            return false;
        }
        let horizon = a.submitted + self.vc_config[a.spec.vcluster.index()].reference_wait;
        if now >= horizon {
            return false;
        }
        let current = ctx.price_norm.unwrap_or(0.0);
        let cheapest = self
            .config
            .energy_prices
            .iter()
            .filter(|p| p.0 > now && p.0 < horizon)
            .map(|p| normalise(p.1, ctx.price_min, ctx.price_max))
            .fold(f64::INFINITY, f64::min);
        cheapest <= current - (1.0 - w.energy) / 2.0
    }

    fn pool_scored(&self, key: u32) -> bool {
        self.pools[&key]
            .vclusters
            .iter()
            .any(|v| self.vc_config[v.index()].weights.is_some())
    }

    /// Inputs shared by every allocation of a pool in one cycle.
    fn score_context(&self, now: Time, key: u32) -> ScoreContext {
        let usage = self.tenant_usage();
        let total_usage: f64 = usage.iter().sum();
        let (mut queued, mut running) = (0.0, 0.0);
        for &id in &self.pools[&key].queue {
            let h = self.meta[id.index()].requested_gpu_hours;
            if h.is_finite() {
                queued += h;
            }
        }
        for &(_, id) in self.running.owned_by(key) {
            if self.allocs[id.index()].state == AllocState::Running {
                running += self.meta[id.index()].requested_gpu_hours;
            }
        }
        let backlog = crate::cost::f6_backlog(queued, running);
        let prices = &self.config.energy_prices;
        let (price_min, price_max) = prices.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
        let price_norm = prices
            .iter()
            .rev()
            .find(|p| p.0 <= now)
            .or(prices.first())
            .map(|p| normalise(p.1, price_min, price_max));
        // Budget use per tenant: ended allocations plus the running ones so far (only walked when
        // some tenant has a budget; without budgets every penalty is the ramp's value at 0).
        let budgets = self
            .tenant_quota
            .iter()
            .any(|q| q.gpu_hours_budget.is_some() || q.node_hours_budget.is_some())
            || self
                .projects
                .iter()
                .any(|p| p.quota.gpu_hours_budget.is_some() || p.quota.node_hours_budget.is_some());
        let (budget_penalty, project_penalty) = if budgets {
            self.budget_penalties(now)
        } else {
            (
                vec![crate::quota::budget_penalty(0.0); self.tenant_quota.len()],
                Vec::new(),
            )
        };
        let mut targets = self.tenant_targets();
        if self.tenant_quota.iter().any(|q| q.deserved_nodes.is_some()) {
            targets = self.kai_targets(key);
        }
        // Each tenant's projects: how many, and their decayed usage together (f3's second level).
        let mut projects_of = vec![(0u32, 0.0f64); self.tenant_quota.len()];
        for (q, p) in self.projects.iter().enumerate() {
            if let Some(slot) = p.tenant.and_then(|t| projects_of.get_mut(t)) {
                slot.0 += 1;
                slot.1 += self.project_ledger.decayed(q);
            }
        }
        ScoreContext {
            projects_of,
            budget_penalty,
            project_penalty,
            shares: usage
                .iter()
                .map(|u| if total_usage > 0.0 { u / total_usage } else { 0.0 })
                .collect(),
            targets,
            backlog,
            price_norm,
            price_min,
            price_max,
        }
    }

    /// Each tenant's and each project's soft-budget penalty now: the worse of its GPU-hours and
    /// node-hours use.
    fn budget_penalties(&self, now: Time) -> (Vec<f64>, Vec<f64>) {
        let mut node_s = self.consumed_node_s.clone();
        let mut gpu_s = self.consumed_gpu_s.clone();
        let mut p_node_s: Vec<f64> = self.projects.iter().map(|p| p.consumed_node_s).collect();
        let mut p_gpu_s: Vec<f64> = self.projects.iter().map(|p| p.consumed_gpu_s).collect();
        for &(_, id) in &self.running {
            let a = &self.allocs[id.index()];
            if let Some(st) = a.started {
                let secs = now.since(st).as_secs_f64();
                let (t, p) = (a.spec.tenant.index(), a.spec.project.index());
                let gpus: u64 = a
                    .nodes
                    .iter()
                    .map(|n| self.class_info[self.class_of[n.index()] as usize].gpus as u64)
                    .sum();
                node_s[t] += a.nodes.len() as f64 * secs;
                gpu_s[t] += gpus as f64 * secs;
                p_node_s[p] += a.nodes.len() as f64 * secs;
                p_gpu_s[p] += gpus as f64 * secs;
            }
        }
        let penalty = |gpu_budget: Option<f64>, node_budget: Option<f64>, gpu_s: f64, node_s: f64| {
            let used = |b: f64, s: f64| if b > 0.0 { s / 3600.0 / b } else { f64::INFINITY };
            let g = gpu_budget.map_or(0.0, |b| used(b, gpu_s));
            let n = node_budget.map_or(0.0, |b| used(b, node_s));
            crate::quota::budget_penalty(g.max(n))
        };
        let tenants = self
            .tenant_quota
            .iter()
            .enumerate()
            .map(|(t, q)| penalty(q.gpu_hours_budget, q.node_hours_budget, gpu_s[t], node_s[t]))
            .collect();
        let projects = self
            .projects
            .iter()
            .enumerate()
            .map(|(p, b)| {
                penalty(
                    b.quota.gpu_hours_budget,
                    b.quota.node_hours_budget,
                    p_gpu_s[p],
                    p_node_s[p],
                )
            })
            .collect();
        (tenants, projects)
    }

    /// f3 targets from KAI fair shares of the pool: demand = running + waiting nodes per tenant.
    fn kai_targets(&self, key: u32) -> Vec<f64> {
        let total: f64 = (0..self.class_keys.len())
            .filter(|&c| self.class_keys[c].pool == key)
            .map(|c| self.class_total[c] as f64)
            .sum();
        let mut request = vec![0.0; self.tenant_quota.len()];
        for &id in &self.pools[&key].queue {
            let a = &self.allocs[id.index()];
            request[a.spec.tenant.index()] += a.spec.nodes.min as f64;
        }
        for &(_, id) in self.running.owned_by(key) {
            let a = &self.allocs[id.index()];
            request[a.spec.tenant.index()] += a.nodes.len() as f64;
        }
        let queues: Vec<crate::kai::QueueSpec> = self
            .tenant_quota
            .iter()
            .enumerate()
            .map(|(t, q)| crate::kai::QueueSpec {
                name: self.tenants.get(t as u32).unwrap_or_default().to_string(),
                deserved: q.deserved_nodes.unwrap_or(0.0),
                over_quota_weight: q.over_quota_weight.unwrap_or(1.0),
                request: request[t],
                children: Vec::new(),
            })
            .collect();
        crate::kai::one_level(total, &queues)
            .into_iter()
            .map(|f| if total > 0.0 { f / total } else { 0.0 })
            .collect()
    }

    /// The f3 targets a vCluster's pool uses this cycle, per tenant (configured shares, equal split, or
    /// KAI fair shares when tenants have deserved quotas).
    pub fn fair_share_targets(&self, vcluster: crate::ids::VClusterId) -> Vec<f64> {
        let key = self.pool_of_vc.get(vcluster.index()).copied().unwrap_or(0);
        if self.tenant_quota.iter().any(|q| q.deserved_nodes.is_some()) {
            self.kai_targets(key)
        } else {
            self.tenant_targets()
        }
    }

    /// `Score(j)` with its breakdown.
    fn score_of(&self, id: AllocId, w: &CostWeights, ctx: &ScoreContext) -> ScoreBreakdown {
        let a = &self.allocs[id.index()];
        let topo = self.topology_inputs(&self.meta[id.index()].eligible, a.spec.nodes.min);
        self.score_with(id, w, ctx, topo)
    }

    /// f4's and f9's inputs for a request of `k` nodes over the classes `eligible`: from the free
    /// nodes, or — when it cannot fit now — from the eligible capacity. A function of the request's
    /// shape and the free counts alone, so a pass computes it once per shape ([`TopologyMemo`]).
    fn topology_inputs(&self, eligible: &[u16], k: u32) -> TopologyInputs {
        let free: Picks = eligible.iter().map(|&c| (c, self.free_by_class[c as usize])).collect();
        let total: Picks = eligible.iter().map(|&c| (c, self.class_total[c as usize])).collect();
        let rules = PickRules::default();
        let (basis, placement) = match pick(&self.class_info, &free, k, rules) {
            Some(p) => (&free, Some(p)),
            None => (&total, pick(&self.class_info, &total, k, rules)),
        };
        let mut groups: Vec<u32> = basis
            .iter()
            .filter(|x| x.1 > 0)
            .map(|x| self.class_info[x.0 as usize].group.0)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        let mut by_fp: Vec<(u64, u32)> = Vec::new();
        for &(c, n) in basis {
            let fp = self.class_info[c as usize].conformance.0;
            match by_fp.iter_mut().find(|x| x.0 == fp) {
                Some(x) => x.1 += n,
                None => by_fp.push((fp, n)),
            }
        }
        TopologyInputs {
            groups_needed: placement.as_ref().map_or(groups.len() as u32, |p| p.groups),
            max_groups_available: groups.len() as u32,
            largest_conformance_group: by_fp.iter().map(|x| x.1).max().unwrap_or(0),
        }
    }

    /// The score of `id` with its topology inputs already known.
    fn score_with(&self, id: AllocId, w: &CostWeights, ctx: &ScoreContext, topo: TopologyInputs) -> ScoreBreakdown {
        let a = &self.allocs[id.index()];
        let vc = &self.vc_config[a.spec.vcluster.index()];
        let pool_policy = self.pools[&self.pool_key_of(id)].config.policy;
        let k = a.spec.nodes.min;
        let t = a.spec.tenant.index();
        let inputs = CostInputs {
            priority_class: if pool_policy == Policy::Reservation {
                10
            } else {
                a.spec.preemption_class.get()
            },
            wait_s: self.clock.now().since(a.submitted).as_secs_f64(),
            reference_wait_s: vc.reference_wait.as_secs_f64(),
            target_share: ctx.targets.get(t).copied().unwrap_or(0.0),
            actual_share: ctx.shares.get(t).copied().unwrap_or(0.0),
            groups_needed: topo.groups_needed,
            max_groups_available: topo.max_groups_available,
            hot_data_fraction: self.data_readiness(id),
            queued_gpu_hours: 0.0,
            running_gpu_hours: 0.0,
            normalized_energy_price: ctx.price_norm.unwrap_or(0.0),
            checkpoint_minutes: match a.spec.checkpoint.kind {
                crate::alloc::CheckpointKind::None => None,
                _ => Some(a.spec.checkpoint.estimated_minutes.unwrap_or(0.0)),
            },
            largest_conformance_group: topo.largest_conformance_group,
            requested_nodes: k,
        };
        let mut s = score(w, &inputs);
        // The hierarchy's second level: within its tenant, a project below its (equal) share of the
        // tenant's usage gets the average of both levels' deficits.
        let (siblings, tenant_usage) = ctx.projects_of.get(t).copied().unwrap_or_default();
        if siblings > 1 {
            let p = a.spec.project.index();
            let actual = if tenant_usage > 0.0 {
                self.project_ledger.decayed(p) / tenant_usage
            } else {
                0.0
            };
            let project_f3 = crate::cost::f3_fair_share(1.0 / siblings as f64, actual);
            s.components[2] = 0.5 * (s.components[2] + project_f3);
            s.weighted[2] = w.fair_share * s.components[2];
        }
        // f6 is the pool's backlog (the same for every job this cycle).
        s.components[5] = ctx.backlog;
        s.weighted[5] = w.backlog * ctx.backlog;
        // Soft budgets: the worse of GPU-hours and node-hours used drives the penalty ramp; the
        // worse of the tenant's and the project's.
        let tenant_penalty = ctx.budget_penalty.get(t).copied().unwrap_or(0.0);
        let project_penalty = ctx.project_penalty.get(a.spec.project.index()).copied().unwrap_or(0.0);
        s.penalty = tenant_penalty.max(project_penalty);
        s.total = s.weighted.iter().sum::<f64>() - s.penalty;
        s
    }

    /// `out[i]` = the smallest node request among `queue[i..]`.
    fn suffix_min_nodes(&self, queue: &[AllocId]) -> Vec<u32> {
        let mut out: Vec<u32> = queue.iter().map(|q| self.allocs[q.index()].spec.nodes.min).collect();
        for i in (0..out.len().saturating_sub(1)).rev() {
            out[i] = out[i].min(out[i + 1]);
        }
        out
    }

    /// The availability profile of a pool from now: free nodes plus releases at running allocations'
    /// estimated ends.
    fn build_profile(&self, now: Time, key: u32) -> Profile {
        let mut p = Profile::new(now, &self.free_by_class);
        let single_pool = self.pools.len() == 1;
        // Allocations on this pool's nodes, including borrowers from other pools.
        let on_pool: Box<dyn Iterator<Item = &(Time, AllocId)>> = if single_pool {
            Box::new(self.running.iter())
        } else {
            Box::new(self.running.holding_in(key))
        };
        // Nodes that will not be schedulable when released do not come back: per owner and class.
        let mut withheld: BTreeMap<AllocId, Picks> = BTreeMap::new();
        for n in &self.nodes_not_ready {
            if let Some(o) = self.nodes[n.index()].owner {
                let c = self.class_of[n.index()];
                let w = withheld.entry(o.alloc).or_default();
                match w.iter_mut().find(|p| p.0 == c) {
                    Some(p) => p.1 += 1,
                    None => w.push((c, 1)),
                }
            }
        }
        for &(t, id) in on_pool {
            // A victim being preempted frees its nodes by its stop order's limit, whatever its
            // walltime said: they are for its preemptor, so what would start on them must not
            // delay it past then.
            let t = self.released_by(id).map_or(t, |r| r.min(t));
            let held = &self.meta[id.index()].held;
            match withheld.get(&id) {
                None => p.add_release(t, held),
                Some(w) => {
                    let back: Picks = held
                        .iter()
                        .map(|&(c, n)| {
                            let out = w.iter().find(|x| x.0 == c).map_or(0, |x| x.1);
                            (c, n.saturating_sub(out))
                        })
                        .collect();
                    p.add_release(t, &back);
                }
            }
        }
        p
    }

    /// EASY as pyss implements it (DESIGN.md §3, rule by rule). One homogeneous pool; processors of jobs
    /// past their estimated end were already released by `release_estimated_ends`.
    fn pass_pyss(&mut self, now: Time, key: u32, queue: Vec<AllocId>) -> (PassStats, Vec<AllocId>) {
        let mut stats = PassStats {
            ran: true,
            ..PassStats::default()
        };
        let mut free = self.free.len() as i64;
        // (1) Start queue heads while the head fits.
        let mut h = 0;
        while h < queue.len() {
            let k = self.allocs[queue[h].index()].spec.nodes.min;
            if k as i64 > free {
                break;
            }
            self.start(now, queue[h], &single_class(k), false, None);
            free -= k as i64;
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
        let held = |e: &Engine, id: AllocId| -> i64 { e.meta[id.index()].held.iter().map(|p| p.1 as i64).sum() };
        let mut acc = free;
        let mut shadow = None;
        for &(t, id) in &self.running {
            acc += held(self, id);
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
            .map(|&(_, id)| held(self, id))
            .sum();
        let mut extra = free + released - head_k;
        let mut nonextra = free - extra;
        if nonextra < 0 {
            extra += nonextra;
            nonextra = 0;
        }
        self.pools.get_mut(&key).expect("pool").reservations.push(Reservation {
            alloc: head,
            start: shadow,
            made: now,
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
                self.start(now, id, &single_class(k as u32), true, None);
                stats.started += 1;
                stats.backfilled += 1;
            } else {
                keep.push(id);
            }
        }
        (stats, keep)
    }
}

/// The largest `n` in `[lo, hi]` with `feasible(n)`, given `feasible(lo)` and monotonicity.
fn largest_feasible(lo: u32, hi: u32, mut feasible: impl FnMut(u32) -> bool) -> u32 {
    let (mut good, mut bad) = (lo, hi + 1);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if feasible(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

fn single_class(k: u32) -> Placement {
    Placement {
        picks: vec![(0, k)],
        groups: 1,
        largest_conformance: k,
        power_w: 0,
    }
}

fn normalise(x: f64, lo: f64, hi: f64) -> f64 {
    if hi > lo {
        ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Per-pool, per-cycle inputs of the score.
pub(crate) struct ScoreContext {
    budget_penalty: Vec<f64>,
    /// By project id (empty when no tenant or project has a budget).
    project_penalty: Vec<f64>,
    /// By tenant: its projects' count and decayed usage together.
    projects_of: Vec<(u32, f64)>,
    shares: Vec<f64>,
    targets: Vec<f64>,
    backlog: f64,
    price_norm: Option<f64>,
    price_min: f64,
    price_max: f64,
}

/// Score penalty for starting on borrowed nodes, scaled by how expensive the job is to preempt
/// (`1 − f8`): cheap-to-checkpoint jobs are the better borrowers.
pub const BORROW_PENALTY: f64 = 0.5;

impl Engine {
    /// Elastic sharing: waiting allocations of a score-ordered pool may start on *idle* pools' free nodes
    /// (a pool is idle when nothing waits in it), up to each lender's `lend_cap` share of its nodes. Only
    /// lender nodes are used (never mixed with the borrower's own, so the pool's reservations stay
    /// intact). Non-preemptible allocations (checkpoint `none` and class ≥ 7), sensitive ones and
    /// reactive or unbounded ones (their minimum must stay on home nodes) never borrow. Candidates go in
    /// order of `score − BORROW_PENALTY · (1 − f8)`.
    fn borrow_phase(
        &mut self,
        now: Time,
        key: u32,
        rest: &mut Vec<AllocId>,
        scores: &[(AllocId, Option<ScoreBreakdown>)],
        rules: PickRules,
        stats: &mut PassStats,
    ) {
        // Lendable nodes per idle lender pool.
        let mut lendable: std::collections::BTreeMap<u32, i64> = std::collections::BTreeMap::new();
        for (&lk, lp) in &self.pools {
            if lk == key || !lp.queue.is_empty() || lp.config.policy == Policy::Reservation {
                continue;
            }
            let size: u32 = (0..self.class_keys.len())
                .filter(|&c| self.class_keys[c].pool == lk)
                .map(|c| self.class_total[c])
                .sum();
            let cap = (lp.config.lend_cap.clamp(0.0, 1.0) * size as f64).floor() as i64;
            lendable.insert(lk, cap);
        }
        if lendable.is_empty() {
            return;
        }
        // Subtract what is already lent out: borrowers' nodes in each lender's pool.
        for (&lp, l) in lendable.iter_mut() {
            for &(_, id) in self.running.holding_in(lp) {
                if self.pool_key_of(id) == lp {
                    continue;
                }
                for &(c, n) in &self.meta[id.index()].held {
                    if self.class_keys[c as usize].pool == lp {
                        *l -= n as i64;
                    }
                }
            }
        }
        // Nothing left to lend: no candidate can start (every pick needs a lender with room).
        if lendable.values().all(|&l| l <= 0) {
            return;
        }
        // Borrowing scores, looked up by id (the first entry of an id, as a linear search finds it).
        let mut by_id: std::collections::BTreeMap<AllocId, f64> = std::collections::BTreeMap::new();
        for s in scores {
            by_id
                .entry(s.0)
                .or_insert_with(|| s.1.map_or(0.0, |b| b.total - BORROW_PENALTY * (1.0 - b.components[7])));
        }
        let score_of = |id: AllocId| -> f64 { by_id.get(&id).copied().unwrap_or(0.0) };
        let mut order: Vec<AllocId> = rest.clone();
        order.sort_by(|a, b| score_of(*b).total_cmp(&score_of(*a)).then(a.cmp(b)));
        let mut started = Vec::new();
        for id in order {
            let a = &self.allocs[id.index()];
            let non_preemptible =
                a.spec.checkpoint.kind == crate::alloc::CheckpointKind::None && a.spec.preemption_class.get() >= 7;
            if non_preemptible
                || a.spec.lifecycle.walltime().is_none()
                || self.meta[id.index()].preemptor
                || self.pools[&key].config.policy == Policy::Reservation
                || !self.budgets_allow(id)
            {
                continue;
            }
            let k = a.spec.nodes.min;
            let avail: Picks = self.meta[id.index()]
                .borrow_eligible
                .iter()
                .filter(|&&c| lendable.get(&self.class_keys[c as usize].pool).is_some_and(|&l| l > 0))
                .map(|&c| (c, self.free_by_class[c as usize]))
                .filter(|a| a.1 > 0)
                .collect();
            let start_rules = PickRules {
                power_cap_w: self.power_headroom(),
                ..rules
            };
            let Some(pl) = pick(&self.class_info, &avail, k, start_rules) else {
                continue;
            };
            // Respect every lender's cap.
            let mut per_lender: std::collections::BTreeMap<u32, i64> = std::collections::BTreeMap::new();
            for &(c, n) in &pl.picks {
                *per_lender.entry(self.class_keys[c as usize].pool).or_default() += n as i64;
            }
            if per_lender
                .iter()
                .any(|(l, n)| lendable.get(l).is_none_or(|&cap| *n > cap))
            {
                continue;
            }
            for (l, n) in per_lender {
                *lendable.get_mut(&l).expect("lender") -= n;
            }
            let breakdown = scores.iter().find(|s| s.0 == id).and_then(|s| s.1);
            self.start(now, id, &pl, true, breakdown);
            stats.started += 1;
            stats.borrowed += 1;
            started.push(id);
        }
        rest.retain(|id| !started.contains(id));
    }
}
