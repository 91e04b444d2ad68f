//! Reactive autoscaling (book: "Autoscaling"): a reactive allocation starts at `min_nodes`; every
//! evaluation interval the scheduler compares its metric with the target — above it for the scale-up
//! window adds one node, below `target × 0.5` for the scale-down window removes one (the most recently
//! added), a cooldown follows every scale event, `max_nodes` and the tenant's hard `max_nodes` cap growth,
//! and without a (fresh) metric nothing happens. Scale events that keep alternating raise an oscillation
//! alert after 5 cycles.

use crate::alloc::{AllocState, Lifecycle};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids::{AllocId, NodeId};
use crate::time::{Duration, Time};

/// Scaling parameters (the seed's defaults).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScalePolicy {
    pub target: f64,
    pub evaluation_interval: Duration,
    pub scale_up_window: Duration,
    pub scale_down_window: Duration,
    pub scale_down_threshold: f64,
    pub cooldown: Duration,
}

impl ScalePolicy {
    pub fn with_target(target: f64) -> ScalePolicy {
        ScalePolicy {
            target,
            evaluation_interval: Duration::from_secs(60),
            scale_up_window: Duration::from_mins(2),
            scale_down_window: Duration::from_mins(5),
            scale_down_threshold: 0.5,
            cooldown: Duration::from_mins(3),
        }
    }
}

/// Per-allocation autoscaler state.
#[derive(Clone, Debug, Default)]
pub(crate) struct ScaleState {
    pub metric: Option<(Time, f64)>,
    pub above_since: Option<Time>,
    pub below_since: Option<Time>,
    pub last_scale: Option<Time>,
    /// +1 / −1 of the last scale event, and how many consecutive events alternated.
    pub last_dir: i8,
    pub alternations: u32,
}

/// What the autoscaler did in one evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleStats {
    pub ups: u32,
    pub downs: u32,
    pub oscillation_alerts: u32,
    /// Scale-ups that a quota or a lack of free nodes turned into a no-op.
    pub blocked: u32,
    /// Evaluations of a reactive allocation that had no fresh metric (none, or older than three
    /// intervals): nothing was decided for it.
    pub metric_unavailable: u32,
}

impl Engine {
    /// A metric sample for a reactive allocation.
    pub fn handle_metric(&mut self, now: Time, id: AllocId, value: f64) -> Result<(), EngineError> {
        self.clock.advance(now);
        let a = self.allocs.get(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        let Some(policy) = a.spec.scale.as_deref().copied() else {
            return Ok(());
        };
        let st = self.scale_state.entry(id).or_default();
        st.metric = Some((now, value));
        if value > policy.target {
            st.above_since.get_or_insert(now);
        } else {
            st.above_since = None;
        }
        if value < policy.target * policy.scale_down_threshold {
            st.below_since.get_or_insert(now);
        } else {
            st.below_since = None;
        }
        if self.autoscale_next.is_none() {
            self.autoscale_next = Some(now + policy.evaluation_interval);
        }
        Ok(())
    }

    /// Stop evaluating after this time (the driver's end of trace), so services don't tick forever.
    pub fn set_autoscale_until(&mut self, until: Option<Time>) {
        self.autoscale_until = until;
    }

    /// Runs the scaling loop if an evaluation is due.
    pub(crate) fn autoscale(&mut self, now: Time) -> ScaleStats {
        let mut stats = ScaleStats::default();
        if self.autoscale_next.is_none_or(|t| t > now) {
            return stats;
        }
        let reactive: Vec<AllocId> = self
            .allocs
            .iter()
            .filter(|a| {
                a.state == AllocState::Running
                    && a.spec.scale.is_some()
                    && self.meta[a.id.index()].proposed_at.is_none()
            })
            .map(|a| a.id)
            .collect();
        let mut interval = None::<Duration>;
        for id in reactive {
            let a = &self.allocs[id.index()];
            let policy = *a.spec.scale.as_deref().expect("filtered");
            interval = Some(interval.map_or(policy.evaluation_interval, |i| i.min(policy.evaluation_interval)));
            let (min, max) = match a.spec.lifecycle {
                Lifecycle::Reactive { min_nodes, max_nodes } => (min_nodes, max_nodes),
                _ => (a.spec.nodes.min, a.spec.nodes.max),
            };
            let n = a.nodes.len() as u32;
            let st = self.scale_state.entry(id).or_default().clone();
            // No metric, or a stale one (3 intervals): no action.
            let fresh = st
                .metric
                .is_some_and(|(t, _)| now.since(t) <= Duration(policy.evaluation_interval.0 * 3));
            if !fresh {
                stats.metric_unavailable += 1;
                continue;
            }
            if st.last_scale.is_some_and(|t| now.since(t) < policy.cooldown) {
                continue;
            }
            let up = st.above_since.is_some_and(|t| now.since(t) >= policy.scale_up_window) && n < max;
            let down = st.below_since.is_some_and(|t| now.since(t) >= policy.scale_down_window) && n > min;
            let dir: i8 = if up && self.scale_up(now, id) {
                stats.ups += 1;
                1
            } else if up {
                stats.blocked += 1;
                0
            } else if down {
                self.scale_down(now, id);
                stats.downs += 1;
                -1
            } else {
                0
            };
            if dir != 0 {
                let s = self.scale_state.entry(id).or_default();
                s.alternations = if s.last_dir == -dir { s.alternations + 1 } else { 0 };
                s.last_dir = dir;
                s.last_scale = Some(now);
                // The windows restart after a scale event.
                s.above_since = s.above_since.map(|_| now);
                s.below_since = s.below_since.map(|_| now);
                if s.alternations > 5 {
                    stats.oscillation_alerts += 1;
                    s.alternations = 0;
                }
            }
        }
        self.autoscale_next = interval
            .map(|i| now + i)
            .filter(|t| self.autoscale_until.is_none_or(|u| *t <= u));
        stats
    }

    /// Adds one free node of the allocation's pool (fewest groups first: the picker), if the tenant's
    /// and the project's hard max_nodes allow. Returns false (a no-op) otherwise.
    fn scale_up(&mut self, now: Time, id: AllocId) -> bool {
        let a = &self.allocs[id.index()];
        let t = a.spec.tenant.index();
        let p = &self.projects[a.spec.project.index()];
        if self.tenant_quota[t]
            .max_nodes
            .is_some_and(|m| self.committed_nodes[t] + 1 > m as u64)
            || p.quota.max_nodes.is_some_and(|m| p.committed_nodes + 1 > m as u64)
        {
            return false;
        }
        let eligible = &self.meta[id.index()].eligible;
        let Some(node) = self.free.iter().find(|n| eligible.contains(&self.class_of[n.index()])) else {
            return false;
        };
        self.attach_node(now, id, node);
        true
    }

    /// Removes the most recently added node.
    fn scale_down(&mut self, _now: Time, id: AllocId) {
        if let Some(&node) = self.allocs[id.index()].nodes.last() {
            self.detach_node(id, node);
        }
    }

    fn attach_node(&mut self, _now: Time, id: AllocId, node: NodeId) {
        let c = self.class_of[node.index()];
        self.free.remove(node);
        self.free_by_class[c as usize] -= 1;
        let a = &mut self.allocs[id.index()];
        a.nodes.push(node);
        let owner = crate::node::Owner {
            tenant: a.spec.tenant,
            vcluster: a.spec.vcluster,
            alloc: id,
        };
        let t = a.spec.tenant.index();
        self.nodes[node.index()].owner = Some(owner);
        self.power_used_w += self.class_info[c as usize].power_w as u64;
        self.committed_nodes[t] += 1;
        self.projects[a.spec.project.index()].committed_nodes += 1;
        let m = &mut self.meta[id.index()];
        match m.held.iter_mut().find(|h| h.0 == c) {
            Some(h) => h.1 += 1,
            None => m.held.push((c, 1)),
        }
        self.refile_running(id);
        self.scale_log.push((id, node, true));
    }

    fn detach_node(&mut self, id: AllocId, node: NodeId) {
        let c = self.class_of[node.index()];
        let a = &mut self.allocs[id.index()];
        a.nodes.retain(|&n| n != node);
        let t = a.spec.tenant.index();
        self.nodes[node.index()].owner = None;
        if self.nodes[node.index()].state.schedulable() {
            self.free.insert(node);
            self.free_by_class[c as usize] += 1;
        }
        self.power_used_w -= self.class_info[c as usize].power_w as u64;
        self.committed_nodes[t] -= 1;
        self.projects[a.spec.project.index()].committed_nodes -= 1;
        let m = &mut self.meta[id.index()];
        if let Some(h) = m.held.iter_mut().find(|h| h.0 == c) {
            h.1 -= 1;
        }
        m.held.retain(|h| h.1 > 0);
        self.refile_running(id);
        self.scale_log.push((id, node, false));
        let key = self.pool_key_of(id);
        let now = self.clock.now();
        self.mark_due(key, now);
        self.settle_capabilities(node);
    }

    /// Node changes made by the autoscaler since the last call: `(allocation, node, added)` — the
    /// driver reports them to the quorum.
    pub fn drain_scale_log(&mut self) -> Vec<(AllocId, NodeId, bool)> {
        std::mem::take(&mut self.scale_log)
    }
}
