//! Preemption (book: "Preemption Policy"): classes 0-10 where preemption only moves down, the
//! `PreemptionDecision` algorithm, and the engine side of the preemption sequence.
//!
//! A pass that finds its head allocation (the highest-priority waiting one) blocked, with class > 0, asks
//! [`Engine::try_preempt`] for victims: running allocations of the same pool with a lower class, not
//! sensitive, not already checkpointing, not near completion (within `near_completion` of their
//! walltime), and not non-preemptible (checkpoint `none` and class ≥ 7). They are ranked by
//! `preemption_cost = checkpoint_time + recompute_if_no_checkpoint + remaining_walltime_value` (GPU-minutes;
//! node-minutes on CPU pools) and taken greedily, cheapest first, at most `max_victims`, until the freed
//! nodes give the pending allocation a valid placement (same topology/conformance rules as any start). The
//! total cost must stay below the pending allocation's value (its requested GPU-minutes). The engine then
//! emits [`Command::Preempt`] per victim; the driver runs the checkpoint (hint → timeout, +50 % once) and
//! reports [`Engine::handle_suspended`] (requeued with its original submit time) or a
//! `PreemptionKilled` completion.

use crate::alloc::{AllocState, CheckpointKind};
use crate::classes::{PickRules, pick};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids::AllocId;
use crate::policy::Policy;
use crate::profile::Picks;
use crate::time::{Duration, Time};
use serde::Serialize;

/// Why an allocation is preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptReason {
    /// A higher-class allocation needs the nodes.
    Priority,
    /// The home vCluster reclaims borrowed nodes.
    Reclaim,
    /// A sensitive claim takes the nodes.
    Sensitive,
}

impl PreemptReason {
    pub const ALL: [PreemptReason; 3] = [
        PreemptReason::Priority,
        PreemptReason::Reclaim,
        PreemptReason::Sensitive,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PreemptReason::Priority => "priority",
            PreemptReason::Reclaim => "reclaim",
            PreemptReason::Sensitive => "sensitive",
        }
    }
}

/// Commands for the driver besides proposals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Checkpoint (if it can) and suspend `alloc` so `for_alloc` can start.
    Preempt {
        alloc: AllocId,
        for_alloc: AllocId,
        reason: PreemptReason,
    },
    /// The checkpoint broker's hint: write a checkpoint now (the allocation keeps running).
    Checkpoint { alloc: AllocId },
}

/// Preemption settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionConfig {
    pub max_victims: u32,
    /// Allocations this close to their walltime end are not preempted.
    pub near_completion: Duration,
    /// Checkpoint timeout (extended by 50 % once before the victim is killed).
    pub checkpoint_timeout: Duration,
    /// How long a borrower keeps reclaimed nodes before its checkpoint hint (the return grace period).
    pub reclaim_grace: Duration,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            max_victims: 3,
            near_completion: Duration::from_mins(5),
            checkpoint_timeout: Duration::from_mins(10),
            reclaim_grace: Duration::from_secs(60),
        }
    }
}

/// Minutes a checkpoint is assumed to take when the request gives no estimate.
pub const DEFAULT_CHECKPOINT_MINUTES: f64 = 5.0;

/// How a preempted allocation leaves its nodes (book: "Preemption Sequence").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PreemptHow {
    /// Checkpoint hint through its declared mechanism; once the checkpoint is written the process stops
    /// and the world reports `Suspended(checkpointed = true)`. Not written by `deadline` (the
    /// checkpoint timeout extended by 50 % once): SIGTERM, then SIGKILL, reported as an exit with
    /// `EndReason::PreemptionKilled`.
    CheckpointThenStop { deadline: Duration },
    /// It does not checkpoint: SIGTERM, `grace`, SIGKILL; reported as `Suspended(checkpointed =
    /// false)` (it restarts from its last checkpoint, if any, when it runs again).
    Stop { grace: Duration },
    /// It would checkpoint but checkpoint storage is down: no checkpoint can be written; SIGTERM,
    /// `grace`, SIGKILL, reported as an exit with `EndReason::PreemptionKilled`.
    Kill { grace: Duration },
}

impl PreemptHow {
    /// How long after its start the victim is surely off its nodes (the SIGTERM → SIGKILL grace after
    /// a checkpoint's deadline).
    pub fn limit(self) -> Duration {
        match self {
            PreemptHow::CheckpointThenStop { deadline } => deadline + PREEMPT_GRACE,
            PreemptHow::Stop { grace } | PreemptHow::Kill { grace } => grace,
        }
    }
}

/// SIGTERM → SIGKILL grace of a preempted allocation that does not checkpoint.
pub const PREEMPT_GRACE: Duration = Duration(30_000);

impl Engine {
    /// May `victim` be preempted for an allocation of class `class`?
    pub fn preemptible_by(&self, victim: AllocId, class: u8, now: Time) -> bool {
        let Some(a) = self.allocs.get(victim.index()) else {
            return false;
        };
        let m = &self.meta[victim.index()];
        let c = a.spec.preemption_class.get();
        a.state == AllocState::Running
            && m.proposed_at.is_none()
            && !m.preempting
            && c < class
            && c < 10
            && !self.is_sensitive(victim)
            && !(a.spec.checkpoint.kind == CheckpointKind::None && c >= 7)
            // During a storage outage nothing can checkpoint: checkpointable work is not preempted.
            && (self.storage_available || a.spec.checkpoint.kind == CheckpointKind::None)
            && a.estimated_end()
                .is_none_or(|e| e.since(now) > self.preemption.near_completion)
    }

    /// The seed's `preemption_cost(c)`, in GPU-minutes (node-minutes on CPU pools).
    pub fn preemption_cost(&self, victim: AllocId, now: Time) -> f64 {
        let a = &self.allocs[victim.index()];
        let nodes = a.nodes.len().max(1) as f64;
        let gpus: u32 = a
            .nodes
            .iter()
            .map(|n| self.class_info[self.class_of[n.index()] as usize].gpus)
            .sum();
        let per_node = (gpus as f64 / nodes).max(1.0);
        let ran_min = a.started.map_or(0.0, |s| now.since(s).as_secs_f64() / 60.0);
        let checkpoint = match a.spec.checkpoint.kind {
            CheckpointKind::Auto | CheckpointKind::Manual => a
                .spec
                .checkpoint
                .estimated_minutes
                .unwrap_or(DEFAULT_CHECKPOINT_MINUTES),
            CheckpointKind::None => 0.0,
        };
        let recompute = if a.spec.checkpoint.kind == CheckpointKind::None {
            ran_min * nodes * per_node
        } else {
            0.0
        };
        let used = match a.spec.lifecycle.walltime() {
            Some(w) if w.as_millis() > 0 => ran_min * 60.0 / w.as_secs_f64(),
            _ => 0.5,
        };
        let remaining_value = if used > 0.9 {
            1e12
        } else if used < 0.1 {
            0.0
        } else {
            used * ran_min * nodes * per_node
        };
        checkpoint * nodes * per_node + recompute + remaining_value
    }

    /// How victim `v` leaves its nodes when preempted now for `reason`, and from when (a reclaim
    /// leaves the borrower its return grace first) (book: "Preemption Sequence"). Slow but responding
    /// applications get the checkpoint timeout extended by 50 %, once.
    pub fn preemption_how(&self, v: AllocId, reason: PreemptReason, now: Time) -> (Time, PreemptHow) {
        let pc = self.preemption;
        let deadline = Duration(pc.checkpoint_timeout.0 + pc.checkpoint_timeout.0 / 2);
        let at = if reason == PreemptReason::Reclaim {
            now + pc.reclaim_grace
        } else {
            now
        };
        let kind = self
            .allocs
            .get(v.index())
            .map_or(CheckpointKind::None, |a| a.spec.checkpoint.kind);
        let how = if kind == CheckpointKind::None {
            PreemptHow::Stop { grace: PREEMPT_GRACE }
        } else if !self.storage_available() {
            PreemptHow::Kill { grace: PREEMPT_GRACE }
        } else {
            PreemptHow::CheckpointThenStop { deadline }
        };
        (at, how)
    }

    /// Marks `v` preempted for `id` and orders it stopped; its nodes count as free for `id` from
    /// when it is surely off them.
    fn order_preemption(&mut self, now: Time, v: AllocId, id: AllocId, reason: PreemptReason) {
        let (at, how) = self.preemption_how(v, reason, now);
        let m = &mut self.meta[v.index()];
        m.preempting = true;
        m.preempt_for = Some(id);
        m.released_by = Some(at + how.limit());
        self.commands.push_back(Command::Preempt {
            alloc: v,
            for_alloc: id,
            reason,
        });
    }

    /// `PreemptionDecision(pending_job, candidates)`: emits preemption commands and returns the number of
    /// victims, or 0 when no valid victim set exists (the job stays queued).
    pub(crate) fn try_preempt(&mut self, now: Time, id: AllocId, key: u32, rules: PickRules) -> u32 {
        let a = &self.allocs[id.index()];
        let class = a.spec.preemption_class.get();
        if class == 0 || self.meta[id.index()].awaiting_victims > 0 {
            return 0;
        }
        let k = a.spec.nodes.min;
        let eligible = self.meta[id.index()].eligible.clone();
        let mut candidates: Vec<(f64, u8, AllocId)> = self
            .running
            .owned_by(key)
            .map(|&(_, v)| v)
            .filter(|&v| self.preemptible_by(v, class, now))
            .filter(|&v| self.meta[v.index()].held.iter().any(|h| eligible.contains(&h.0)))
            .map(|v| {
                (
                    self.preemption_cost(v, now),
                    self.allocs[v.index()].spec.preemption_class.get(),
                    v,
                )
            })
            .collect();
        candidates.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let mut avail: Picks = eligible.iter().map(|&c| (c, self.free_by_class[c as usize])).collect();
        let mut victims = Vec::new();
        let mut cost = 0.0;
        for &(c, _, v) in candidates.iter().take(self.preemption.max_victims as usize) {
            victims.push(v);
            cost += c;
            for &(cls, n) in &self.meta[v.index()].held {
                if let Some(x) = avail.iter_mut().find(|x| x.0 == cls) {
                    x.1 += n;
                }
            }
            if pick(&self.class_info, &avail, k, rules).is_some() {
                break;
            }
        }
        if victims.is_empty() || pick(&self.class_info, &avail, k, rules).is_none() {
            return 0;
        }
        // The pending job's value: its requested GPU-minutes (node-minutes on CPU pools).
        let value = self.meta[id.index()].requested_gpu_hours * 60.0;
        if cost >= value {
            return 0;
        }
        for &v in &victims {
            self.order_preemption(now, v, id, PreemptReason::Priority);
        }
        let m = &mut self.meta[id.index()];
        m.awaiting_victims = victims.len() as u32;
        // The freed nodes are for this allocation: it goes first until it starts.
        m.preemptor = true;
        victims.len() as u32
    }

    /// Reclaim: the pool's head is blocked and other vClusters hold some of the pool's nodes. Borrowers'
    /// allocations on them (cheapest first, any class — lending was conditional) are preempted with
    /// reason `reclaim` until the head fits on the returned nodes. Returns the number of victims.
    pub(crate) fn try_reclaim(&mut self, now: Time, id: AllocId, key: u32, rules: PickRules) -> u32 {
        if self.meta[id.index()].awaiting_victims > 0 {
            return 0;
        }
        let k = self.allocs[id.index()].spec.nodes.min;
        let eligible = self.meta[id.index()].eligible.clone();
        // Borrowers hold nodes of this pool (every eligible class is one of its classes).
        debug_assert!(eligible.iter().all(|&c| self.class_keys[c as usize].pool == key));
        let mut borrowers: Vec<(f64, AllocId)> = self
            .running
            .holding_in(key)
            .map(|&(_, v)| v)
            .filter(|&v| {
                self.pool_key_of(v) != key
                    && self.allocs[v.index()].state == AllocState::Running
                    && self.meta[v.index()].proposed_at.is_none()
                    && !self.meta[v.index()].preempting
                    && !self.is_sensitive(v)
                    && self.allocs[v.index()].spec.preemption_class.get() < 10
                    && self.meta[v.index()].held.iter().any(|h| eligible.contains(&h.0))
            })
            .map(|v| (self.preemption_cost(v, now), v))
            .collect();
        if borrowers.is_empty() {
            return 0;
        }
        borrowers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut avail: Picks = eligible.iter().map(|&c| (c, self.free_by_class[c as usize])).collect();
        let mut victims = Vec::new();
        let mut fits = false;
        for &(_, v) in &borrowers {
            victims.push(v);
            for &(cls, n) in &self.meta[v.index()].held {
                if let Some(x) = avail.iter_mut().find(|x| x.0 == cls) {
                    x.1 += n;
                }
            }
            if pick(&self.class_info, &avail, k, rules).is_some() {
                fits = true;
                break;
            }
        }
        if !fits {
            return 0;
        }
        for &v in &victims {
            self.order_preemption(now, v, id, PreemptReason::Reclaim);
        }
        let m = &mut self.meta[id.index()];
        m.awaiting_victims = victims.len() as u32;
        m.preemptor = true;
        victims.len() as u32
    }

    /// A sensitive claim that does not fit on free nodes takes them from non-sensitive occupants (any
    /// class below 10, near completion or not, checkpoint or not — the claim is immediate), cheapest
    /// first, until the claim has a placement with one conformance fingerprint.
    pub(crate) fn try_preempt_for_claim(&mut self, now: Time, id: AllocId, key: u32, rules: PickRules) -> u32 {
        if self.meta[id.index()].awaiting_victims > 0 {
            return 0;
        }
        let k = self.allocs[id.index()].spec.nodes.min;
        let eligible = self.meta[id.index()].eligible.clone();
        let mut occupants: Vec<(f64, AllocId)> = self
            .running
            .iter()
            .map(|&(_, v)| v)
            .chain(self.unbounded_holding.iter().copied().filter(|&v| {
                let a = &self.allocs[v.index()];
                a.state == AllocState::Running && a.spec.lifecycle.walltime().is_none()
            }))
            .filter(|&v| {
                self.allocs[v.index()].state == AllocState::Running
                    && self.meta[v.index()].proposed_at.is_none()
                    && !self.meta[v.index()].preempting
                    && !self.is_sensitive(v)
                    && self.allocs[v.index()].spec.preemption_class.get() < 10
                    && self.meta[v.index()].held.iter().any(|h| eligible.contains(&h.0))
            })
            .map(|v| (self.preemption_cost(v, now), v))
            .collect();
        let _ = key;
        occupants.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        occupants.dedup_by_key(|x| x.1);
        let mut avail: Picks = eligible.iter().map(|&c| (c, self.free_by_class[c as usize])).collect();
        let mut victims = Vec::new();
        let mut fits = false;
        for &(_, v) in &occupants {
            victims.push(v);
            for &(cls, n) in &self.meta[v.index()].held {
                if let Some(x) = avail.iter_mut().find(|x| x.0 == cls) {
                    x.1 += n;
                }
            }
            if pick(&self.class_info, &avail, k, rules).is_some() {
                fits = true;
                break;
            }
        }
        if !fits {
            return 0;
        }
        for &v in &victims {
            self.order_preemption(now, v, id, PreemptReason::Sensitive);
        }
        let m = &mut self.meta[id.index()];
        m.awaiting_victims = victims.len() as u32;
        m.preemptor = true;
        victims.len() as u32
    }

    /// The next command for the driver (preemptions), in the order the passes made them.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// A preempted allocation stopped: `checkpointed` tells whether its checkpoint completed (it will
    /// resume) or not (it restarts). It is suspended and requeued with its original submit time.
    pub fn handle_suspended(&mut self, now: Time, id: AllocId, checkpointed: bool) -> Result<(), EngineError> {
        self.clock.advance(now);
        if !self.meta.get(id.index()).is_some_and(|m| m.preempting) {
            return Err(EngineError::NotPreempting(id));
        }
        self.transition(id, AllocState::Suspended)?;
        self.stop_running(now, id);
        self.transition(id, AllocState::Pending)?;
        let a = &mut self.allocs[id.index()];
        a.preempted += 1;
        a.resume_from_checkpoint = checkpointed;
        a.nodes.clear();
        a.started = None;
        a.backfilled = false;
        self.enqueue(id);
        let key = self.pool_key_of(id);
        self.mark_due(key, now);
        Ok(())
    }

    /// Is a pool allowed to preempt (score-ordered, preemption on, not a literature policy)?
    pub(crate) fn pool_preempts(&self, key: u32) -> bool {
        let p = &self.pools[&key];
        p.config.preemption
            && !matches!(p.config.policy, Policy::PyssEasy)
            && p.vclusters.iter().any(|v| self.vc_config[v.index()].weights.is_some())
    }
}
