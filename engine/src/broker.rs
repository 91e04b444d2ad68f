//! The checkpoint broker (book: "Checkpoint Broker"): every `interval` it weighs each running,
//! checkpointable allocation's `Value(j, t)` against `Cost(j, t)` and hints a checkpoint when
//! `Value > Cost`.
//!
//! - `Cost = write_time + compute_waste + storage_cost`: write time from the request's estimate, or from
//!   checkpoint size (GPU memory × GPUs) over the storage write bandwidth, scaled by the mechanism
//!   (signal 1, shmem 0.8, grpc 0.9, dmtcp 1.5); compute waste = write time × GPUs (GPU-seconds);
//!   storage cost = size × cost per GB. With storage down the write time is infinite: no checkpoints.
//! - `Value = recompute_saved · failure_probability + preemptability + backlog_relief`: GPU-seconds since
//!   the last checkpoint, weighted by `1 − exp(−λ·nodes·hours)` (λ ×10 on degraded nodes); waiting
//!   higher-class jobs in the pool (more on borrowed nodes); and the pool's backlog pressure f6 times a
//!   minute of the allocation's GPUs.

use crate::alloc::AllocState;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids::AllocId;
use crate::node::NodeState;
use crate::preempt::Command;
use crate::time::{Duration, Time};

/// Broker settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BrokerConfig {
    /// How often running allocations are evaluated (the seed: 30-60 s).
    pub interval: Duration,
    /// Per-node failure rate, per hour.
    pub node_failure_rate_per_h: f64,
    /// GPU memory per GPU, GB (checkpoint size estimate).
    pub gpu_memory_gb: f64,
    /// Storage write bandwidth for checkpoints, GB/s.
    pub storage_write_gbps: f64,
    /// Storage cost, GPU-seconds per GB written.
    pub storage_cost_per_gb: f64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            interval: Duration::from_secs(60),
            node_failure_rate_per_h: 1e-4,
            gpu_memory_gb: 96.0,
            storage_write_gbps: 100.0,
            storage_cost_per_gb: 0.1,
        }
    }
}

/// One evaluation of the cost model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckpointDecision {
    pub value: f64,
    pub cost: f64,
    /// Seconds the checkpoint would take (∞ while storage is down).
    pub write_time_s: f64,
}

impl CheckpointDecision {
    pub fn should_checkpoint(&self) -> bool {
        self.value > self.cost
    }
}

impl Engine {
    fn gpus_and_nodes(&self, id: AllocId) -> (f64, f64) {
        let a = &self.allocs[id.index()];
        let nodes = a.nodes.len().max(1) as f64;
        let gpus: u32 = a
            .nodes
            .iter()
            .map(|n| self.class_info[self.class_of[n.index()] as usize].gpus)
            .sum();
        (nodes, (gpus as f64).max(nodes))
    }

    /// The checkpoint store's write bandwidth the broker uses, GB/s.
    pub fn checkpoint_bandwidth(&self) -> f64 {
        self.broker.storage_write_gbps
    }

    /// The checkpoint store's measured write bandwidth (GB/s) from now on; a value that is not a
    /// positive number changes nothing.
    pub fn set_checkpoint_bandwidth(&mut self, gbps: f64) {
        if gbps.is_finite() && gbps > 0.0 {
            self.broker.storage_write_gbps = gbps;
        }
    }

    /// The memory of each of `node`'s GPUs (GB) as its agent reported it; a value that is not a
    /// positive number changes nothing.
    pub fn set_gpu_memory(&mut self, node: crate::ids::NodeId, gb: f64) -> Result<(), EngineError> {
        if node.index() >= self.nodes.len() {
            return Err(EngineError::UnknownNode(node));
        }
        if gb.is_finite() && gb > 0.0 {
            self.gpu_memory_gb.insert(node, gb);
        }
        Ok(())
    }

    /// The broker's checkpoint size of `id`, GB: its GPUs' memory — each node's GPUs at the memory
    /// its agent reported, others (and a CPU-only node as one GPU) at `gpu_memory_gb`.
    fn checkpoint_size_gb(&self, id: AllocId) -> f64 {
        let (_, gpus) = self.gpus_and_nodes(id);
        let mut size = gpus * self.broker.gpu_memory_gb;
        if !self.gpu_memory_gb.is_empty() {
            for n in &self.allocs[id.index()].nodes {
                if let Some(gb) = self.gpu_memory_gb.get(n) {
                    let g = self.class_info[self.class_of[n.index()] as usize].gpus as f64;
                    size += g * (gb - self.broker.gpu_memory_gb);
                }
            }
        }
        size
    }

    /// Seconds a checkpoint of `id` takes now (∞ while checkpoint storage is unavailable).
    pub fn checkpoint_write_time_s(&self, id: AllocId) -> f64 {
        if !self.storage_available {
            return f64::INFINITY;
        }
        let a = &self.allocs[id.index()];
        let base = match a.spec.checkpoint.estimated_minutes {
            Some(m) => m * 60.0,
            None => self.checkpoint_size_gb(id) / self.broker.storage_write_gbps.max(1e-9),
        };
        base * a.spec.checkpoint.mechanism.duration_factor()
    }

    /// The broker's cost model for a running allocation at `now`.
    pub fn checkpoint_decision(&self, id: AllocId, now: Time) -> CheckpointDecision {
        let key = self.pool_key_of(id);
        let class = self.allocs[id.index()].spec.preemption_class.get();
        self.checkpoint_decision_with(id, now, self.pool_urgency(key, class), self.pool_backlog(key))
    }

    /// Waiting higher-class work in a pool, as seen by an allocation of `class`:
    /// `Σ (c − class) / 10` over queued allocations of class `c > class`, in queue order.
    fn pool_urgency(&self, key: u32, class: u8) -> f64 {
        self.pools[&key]
            .queue
            .iter()
            .map(|&w| self.hot[w.index()].class)
            .filter(|&c| c > class)
            .map(|c| (c - class) as f64 / 10.0)
            .sum()
    }

    /// [`Engine::checkpoint_decision`] with the pool's urgency for the allocation's class and the
    /// pool's backlog given (the broker computes each once per pool and class, not per candidate).
    fn checkpoint_decision_with(&self, id: AllocId, now: Time, urgency: f64, backlog: f64) -> CheckpointDecision {
        let a = &self.allocs[id.index()];
        let m = &self.meta[id.index()];
        let (nodes, gpus) = self.gpus_and_nodes(id);
        let write = self.checkpoint_write_time_s(id);
        let size_gb = self.checkpoint_size_gb(id);
        let cost = write + write * gpus + size_gb * self.broker.storage_cost_per_gb;
        let since = a
            .started
            .map(|s| m.last_checkpoint.map_or(s, |c| c.max(s)))
            .unwrap_or(now);
        let elapsed = now.since(since).as_secs_f64();
        let degraded = a
            .nodes
            .iter()
            .any(|n| self.nodes[n.index()].state == NodeState::Degraded);
        let lambda = self.broker.node_failure_rate_per_h * if degraded { 10.0 } else { 1.0 };
        let p_fail = 1.0 - (-lambda * nodes * elapsed / 3600.0).exp();
        let recompute = elapsed * gpus * p_fail;
        let borrowed = self.borrowed_nodes(id) > 0;
        let preemptability = urgency * if borrowed { 1.0 } else { 0.5 } * gpus * 60.0;
        let backlog_relief = backlog * gpus * 60.0;
        CheckpointDecision {
            value: recompute + preemptability + backlog_relief,
            cost,
            write_time_s: write,
        }
    }

    /// Runs the broker if its evaluation is due: hints checkpoints where `Value > Cost`.
    pub(crate) fn run_broker(&mut self, now: Time) -> u32 {
        if !self.scored_any || self.broker_next.is_none_or(|t| t > now) {
            return 0;
        }
        let candidates: Vec<AllocId> = self
            .running
            .iter()
            .map(|&(_, id)| id)
            .filter(|&id| {
                let a = &self.allocs[id.index()];
                let m = &self.meta[id.index()];
                a.state == AllocState::Running
                    && self.hot[id.index()].checkpoints
                    && m.proposed_at.is_none()
                    && !m.preempting
                    && !m.checkpointing
            })
            .collect();
        let mut hinted = 0;
        // Per pool: its backlog, and its urgency per preemption class (the same sums, in the same
        // order, as `checkpoint_decision` computes for one allocation).
        let mut backlog: std::collections::BTreeMap<u32, f64> = std::collections::BTreeMap::new();
        let mut urgency: std::collections::BTreeMap<(u32, u8), f64> = std::collections::BTreeMap::new();
        for id in &candidates {
            let key = self.pool_key_of(*id);
            let class = self.hot[id.index()].class;
            let b = *backlog.entry(key).or_insert_with(|| self.pool_backlog(key));
            let u = *urgency
                .entry((key, class))
                .or_insert_with(|| self.pool_urgency(key, class));
            if self.checkpoint_decision_with(*id, now, u, b).should_checkpoint() {
                self.meta[id.index()].checkpointing = true;
                self.commands.push_back(Command::Checkpoint { alloc: *id });
                hinted += 1;
            }
        }
        self.broker_next = (!candidates.is_empty()).then(|| now + self.broker.interval);
        hinted
    }

    /// A broker checkpoint finished (`ok`) or failed.
    pub fn handle_checkpointed(&mut self, now: Time, id: AllocId, ok: bool) -> Result<(), EngineError> {
        self.clock.advance(now);
        let m = self.meta.get_mut(id.index()).ok_or(EngineError::UnknownAlloc(id))?;
        m.checkpointing = false;
        if ok {
            m.last_checkpoint = Some(now);
        }
        Ok(())
    }

    /// Checkpoint storage became unavailable or came back.
    pub fn handle_storage(&mut self, now: Time, available: bool) {
        self.clock.advance(now);
        if !available {
            // Staging progress up to the outage counts; nothing moves during it.
            self.advance_staging(now);
            self.staging_next = None;
        } else {
            self.staging_last = now;
            let keys: Vec<u32> = self.pools.keys().copied().collect();
            for k in keys {
                self.mark_due(k, now);
            }
        }
        self.storage_available = available;
    }

    pub fn storage_available(&self) -> bool {
        self.storage_available
    }

    pub fn set_broker(&mut self, config: BrokerConfig) {
        self.broker = config;
    }

    /// f6 of a pool, for the broker and `backlog_pressure`.
    pub(crate) fn pool_backlog(&self, key: u32) -> f64 {
        let queued: f64 = self.pools[&key]
            .queue
            .iter()
            .map(|q| self.meta[q.index()].requested_gpu_hours)
            .filter(|h| h.is_finite())
            .sum();
        let running: f64 = self
            .running
            .iter()
            .filter(|&&(_, id)| self.pool_key_of(id) == key && self.allocs[id.index()].state == AllocState::Running)
            .map(|&(_, id)| self.meta[id.index()].requested_gpu_hours)
            .sum();
        crate::cost::f6_backlog(queued, running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AllocSpec, CheckpointKind, CheckpointSpec, CostWeights, EngineConfig, NodeSpec, Policy, VClusterConfig,
    };

    fn running(minutes: Option<f64>, nodes: u32) -> (Engine, AllocId) {
        let mut e = Engine::new(
            EngineConfig::new(Policy::EASY),
            (0..8)
                .map(|i| {
                    let mut n = NodeSpec::plain(format!("n{i}"));
                    n.capabilities.gpu_count = 4;
                    n
                })
                .collect(),
        )
        .unwrap();
        let t = e.add_tenant("t");
        let v = e.add_vcluster("v");
        let mut c = VClusterConfig::new(Policy::EASY);
        c.weights = Some(CostWeights::default());
        e.configure_vcluster(v, c).unwrap();
        let mut s = AllocSpec::simple(t, v, nodes, Duration::from_hours(48));
        s.checkpoint = CheckpointSpec {
            kind: CheckpointKind::Auto,
            estimated_minutes: minutes,
            ..Default::default()
        };
        let id = e.handle_submit(Time(0), s).unwrap();
        e.schedule(Time(0));
        let p = e.poll_proposal().unwrap();
        e.handle_commit(Time(0), p.alloc).unwrap();
        (e, id)
    }

    #[test]
    fn value_grows_with_time_since_checkpoint_until_it_exceeds_cost() {
        let (e, id) = running(None, 4);
        // 16 GPUs × 96 GB / 100 GB/s = 15.36 s write time.
        let early = e.checkpoint_decision(id, Time::from_secs(60));
        assert!((early.write_time_s - 15.36).abs() < 1e-9);
        assert!(!early.should_checkpoint(), "{early:?}");
        let late = e.checkpoint_decision(id, Time::from_secs(12 * 3600));
        assert!(late.value > early.value);
        assert!(late.should_checkpoint(), "{late:?}");
    }

    /// The measured bandwidth and the GPU memory agents report replace the settings: 4 nodes × 4
    /// GPUs, two nodes reporting 141 GB per GPU (the others at the 96 GB setting), written at a
    /// measured 20 GB/s: (8 × 96 + 8 × 141) / 20 = 94.8 s. Values that are not positive numbers
    /// change nothing.
    #[test]
    fn measured_bandwidth_and_gpu_memory_set_the_write_time() {
        let (mut e, id) = running(None, 4);
        let nodes = e.allocation(id).unwrap().nodes.clone();
        e.set_checkpoint_bandwidth(20.0);
        for n in &nodes[..2] {
            e.set_gpu_memory(*n, 141.0).unwrap();
        }
        let d = e.checkpoint_decision(id, Time::from_secs(60));
        assert!((d.write_time_s - 94.8).abs() < 1e-9, "{d:?}");
        e.set_checkpoint_bandwidth(f64::NAN);
        e.set_checkpoint_bandwidth(0.0);
        e.set_gpu_memory(nodes[0], -1.0).unwrap();
        assert_eq!(e.checkpoint_decision(id, Time::from_secs(60)), d);
        assert!(e.set_gpu_memory(crate::ids::NodeId(99), 80.0).is_err());
    }

    #[test]
    fn storage_outage_suppresses_checkpoints() {
        let (mut e, id) = running(Some(2.0), 4);
        e.handle_storage(Time::from_secs(10), false);
        let d = e.checkpoint_decision(id, Time::from_secs(48 * 3600));
        assert!(d.write_time_s.is_infinite() && !d.should_checkpoint());
        e.handle_storage(Time::from_secs(20), true);
        assert!(
            e.checkpoint_decision(id, Time::from_secs(40 * 3600))
                .should_checkpoint()
        );
    }
}
