//! Allocations: the universal work unit (book: "Allocation Request Schema", "Allocation Lifecycle").

use crate::ids::{AllocId, NodeId, ProjectId, TenantId, VClusterId};
use crate::node::NodeCapabilities;
use crate::time::{Duration, Time};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// Exact node count (`min == max`) or a range `{min, max}` (the engine starts the allocation at `min`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRange {
    pub min: u32,
    pub max: u32,
}

impl NodeRange {
    pub fn exact(n: u32) -> NodeRange {
        NodeRange { min: n, max: n }
    }
}

/// Placement constraints; a node satisfies them when every given field matches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraints {
    pub gpu_type: Option<String>,
    /// Minimum GPUs per node.
    pub gpu_count: Option<u32>,
    pub cpu_cores: Option<u32>,
    /// Minimum memory per node (`memory_gb >=`).
    pub memory_gb: Option<u32>,
    pub features: BTreeSet<String>,
    /// Hard: only nodes with a unified CPU-GPU memory domain (memory-topology chapter).
    pub require_unified_memory: bool,
    /// The topology hint (`None`: as `tight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyHint>,
}

/// The book's topology hint (`constraints.topology`). `tight` packs into the fewest dragonfly
/// groups, and with a positive topology weight (f4) the job may wait for a placement in fewer
/// groups than it would get now (the pass's wait-for-topology rule); `any` also packs, but starts on
/// whatever fits and never waits for topology (the book's advice for a job stuck on topology).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyHint {
    Tight,
    Any,
}

impl TopologyHint {
    /// `tight` or `any`; anything else is `None`.
    pub fn parse(s: &str) -> Option<TopologyHint> {
        match s {
            "tight" => Some(TopologyHint::Tight),
            "any" => Some(TopologyHint::Any),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TopologyHint::Tight => "tight",
            TopologyHint::Any => "any",
        }
    }
}

impl Constraints {
    pub fn is_empty(&self) -> bool {
        self == &Constraints::default()
    }

    pub fn satisfied_by(&self, caps: &NodeCapabilities) -> bool {
        if let Some(t) = &self.gpu_type
            && caps.gpu_type.as_ref() != Some(t)
        {
            return false;
        }
        self.gpu_count.is_none_or(|g| caps.gpu_count >= g)
            && self.cpu_cores.is_none_or(|c| caps.cpu_cores >= c)
            && self.memory_gb.is_none_or(|m| caps.memory_gb >= m)
            && self.features.is_subset(&caps.features)
            && (!self.require_unified_memory || caps.unified_memory)
    }
}

/// Preemption class 0 (lowest) ..= 10; higher is harder to preempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PreemptionClass(u8);

impl PreemptionClass {
    pub const MAX: u8 = 10;

    pub fn new(c: u8) -> Option<PreemptionClass> {
        (c <= Self::MAX).then_some(PreemptionClass(c))
    }
    pub fn get(self) -> u8 {
        self.0
    }
}

/// Checkpoint strategy of the allocation request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The scheduler decides with the checkpoint cost model.
    Auto,
    /// The application manages its own checkpoints.
    Manual,
    /// Not checkpointable: treated as non-preemptible.
    #[default]
    None,
}

/// How the application is told to checkpoint (book: "Checkpoint Broker", application protocol).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMechanism {
    /// SIGUSR1 and a sentinel file (legacy).
    #[default]
    Signal,
    /// A shared-memory flag (low latency).
    Shmem,
    /// A gRPC callback (agent-aware applications).
    Grpc,
    /// Transparent process-level checkpointing (works unmodified, higher overhead).
    Dmtcp,
}

impl CheckpointMechanism {
    pub const ALL: [CheckpointMechanism; 4] = [
        CheckpointMechanism::Signal,
        CheckpointMechanism::Shmem,
        CheckpointMechanism::Grpc,
        CheckpointMechanism::Dmtcp,
    ];

    /// Its name, as requests, traces and the agent protocol spell it (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointMechanism::Signal => "signal",
            CheckpointMechanism::Shmem => "shmem",
            CheckpointMechanism::Grpc => "grpc",
            CheckpointMechanism::Dmtcp => "dmtcp",
        }
    }

    /// Relative duration of a checkpoint written through this mechanism (signal = 1).
    pub fn duration_factor(self) -> f64 {
        match self {
            CheckpointMechanism::Signal => 1.0,
            CheckpointMechanism::Shmem => 0.8,
            CheckpointMechanism::Grpc => 0.9,
            CheckpointMechanism::Dmtcp => 1.5,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    pub kind: CheckpointKind,
    /// Estimated minutes to write a checkpoint (f8, and the broker's write time when given).
    pub estimated_minutes: Option<f64>,
    pub mechanism: CheckpointMechanism,
}

/// Lifecycle variants (ADR: bounded has walltime enforcement, unbounded runs until cancelled, reactive scales).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Lifecycle {
    Bounded { walltime: Duration },
    Unbounded,
    Reactive { min_nodes: u32, max_nodes: u32 },
}

impl Lifecycle {
    /// Requested walltime; `None` means "until cancelled" (reservations treat it as never ending).
    pub fn walltime(&self) -> Option<Duration> {
        match self {
            Lifecycle::Bounded { walltime } => Some(*walltime),
            _ => None,
        }
    }
}

/// What happens to an allocation when it fails (book: "Allocation Requeue Policy").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeuePolicy {
    /// Fail permanently on any failure (default for interactive sessions).
    Never,
    /// Requeue when the failure is node-side (default for batch).
    #[default]
    OnNodeFailure,
    /// Requeue on any failure, including a non-zero exit.
    Always,
}

/// Default and maximum requeue counts.
pub const DEFAULT_MAX_REQUEUES: u32 = 3;
pub const MAX_REQUEUES_LIMIT: u32 = 100;

/// Condition on a dependency edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyCondition {
    /// The upstream allocation completed successfully.
    Success,
    /// The upstream allocation failed.
    Failure,
    /// The upstream allocation reached any terminal state.
    Any,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub on: AllocId,
    pub condition: DependencyCondition,
}

/// Membership in a task group (job array).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskGroupRef {
    pub group: u64,
    pub index: u32,
    /// At most this many elements of the group run at once (`None` = unlimited).
    pub concurrency: Option<u32>,
}

/// What a user asks for (the scheduling-relevant part of the Intent API request).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocSpec {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub vcluster: VClusterId,
    pub nodes: NodeRange,
    pub constraints: Constraints,
    pub lifecycle: Lifecycle,
    pub preemption_class: PreemptionClass,
    pub checkpoint: CheckpointSpec,
    pub depends_on: Vec<Dependency>,
    pub task_group: Option<TaskGroupRef>,
    /// Storage bandwidth the allocation needs while it runs, GB/s (a knapsack dimension).
    pub storage_gbps: Option<f64>,
    /// A sensitive claim by a user identity: class 10, first in line, conformance hard, takes its nodes
    /// at once (preempting non-sensitive occupants), never preempted, wiped on release.
    pub sensitive_claim: bool,
    pub requeue: RequeuePolicy,
    /// Requeues allowed before the allocation fails for good (default 3, at most 100).
    pub max_requeues: u32,
    /// Singleton (the DAG `mutex` condition): allocations sharing this name never run at once.
    pub mutex: Option<String>,
    /// Reactive scaling policy (metric target and windows); boxed: few allocations have one, and
    /// every spec is kept for the whole run.
    pub scale: Option<Box<crate::autoscale::ScalePolicy>>,
    /// Data mounts (size, current tier, tier hint) for pre-staging and f5.
    pub data: Vec<crate::staging::DataMount>,
    /// The network domain it joins (`connectivity.network_domain`; book: "Network Domains"): its
    /// tenant's allocations naming the same domain share a VNI. `None`: a multi-node allocation
    /// gets a domain of its own, a single-node one none.
    pub network_domain: Option<String>,
}

impl AllocSpec {
    /// A bounded, unconstrained allocation of `nodes` nodes (the shape of every SWF job).
    pub fn simple(tenant: TenantId, vcluster: VClusterId, nodes: u32, walltime: Duration) -> AllocSpec {
        AllocSpec {
            tenant,
            project: ProjectId(0),
            vcluster,
            nodes: NodeRange::exact(nodes),
            constraints: Constraints::default(),
            lifecycle: Lifecycle::Bounded { walltime },
            preemption_class: PreemptionClass::default(),
            checkpoint: CheckpointSpec::default(),
            depends_on: Vec::new(),
            task_group: None,
            storage_gbps: None,
            sensitive_claim: false,
            requeue: RequeuePolicy::OnNodeFailure,
            max_requeues: DEFAULT_MAX_REQUEUES,
            mutex: None,
            scale: None,
            data: Vec::new(),
            network_domain: None,
        }
    }
}

/// Allocation lifecycle: Pending → (Staging) → Running → Completed/Failed/Cancelled/Suspended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocState {
    Pending,
    Staging,
    Running,
    Completed,
    Failed,
    Cancelled,
    Suspended,
}

impl AllocState {
    pub fn is_terminal(self) -> bool {
        matches!(self, AllocState::Completed | AllocState::Failed | AllocState::Cancelled)
    }

    /// The allocation state machine; everything not listed is refused.
    pub fn can_transition_to(self, to: AllocState) -> bool {
        use AllocState as S;
        matches!(
            (self, to),
            (S::Pending, S::Staging | S::Running | S::Failed | S::Cancelled)
                | (S::Staging, S::Running | S::Failed | S::Cancelled)
                | (S::Running, S::Completed | S::Failed | S::Cancelled | S::Suspended)
                | (S::Suspended, S::Pending | S::Cancelled)
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AllocState::Pending => "pending",
            AllocState::Staging => "staging",
            AllocState::Running => "running",
            AllocState::Completed => "completed",
            AllocState::Failed => "failed",
            AllocState::Cancelled => "cancelled",
            AllocState::Suspended => "suspended",
        }
    }
}

impl fmt::Display for AllocState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an allocation ended the way it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Exit status 0.
    Success,
    /// Non-zero exit status.
    ExitFailure,
    /// Killed at start + walltime.
    WalltimeExceeded,
    /// A node it ran on went down.
    NodeFailure,
    /// No node in the inventory can ever satisfy the request.
    Unsatisfiable,
    /// A dependency ended in a way its condition rules out.
    DependencyUnsatisfied,
    /// Cancelled by the user or operator.
    UserCancelled,
    /// Preempted and killed: its checkpoint did not complete in time (or storage was down).
    PreemptionKilled,
    /// Its prologue (uenv pull/mount) failed on more nodes than the retry limit allows.
    PrologueFailure,
    /// A sensitive claim its pool could not give the nodes at once (no queue for claims).
    ClaimRefused,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Success => "success",
            EndReason::ExitFailure => "exit_failure",
            EndReason::WalltimeExceeded => "walltime_exceeded",
            EndReason::NodeFailure => "node_failure",
            EndReason::Unsatisfiable => "unsatisfiable",
            EndReason::DependencyUnsatisfied => "dependency_unsatisfied",
            EndReason::UserCancelled => "user_cancelled",
            EndReason::PreemptionKilled => "preemption_killed",
            EndReason::PrologueFailure => "prologue_failure",
            EndReason::ClaimRefused => "claim_refused",
        }
    }
}

/// An allocation inside the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub id: AllocId,
    /// The request, shared with whoever submitted it (a replay's trace holds the same one).
    pub spec: std::sync::Arc<AllocSpec>,
    pub state: AllocState,
    pub submitted: Time,
    /// When the quorum committed its nodes.
    pub started: Option<Time>,
    pub ended: Option<Time>,
    pub end_reason: Option<EndReason>,
    /// Nodes held (proposed or running).
    pub nodes: Vec<NodeId>,
    /// Started ahead of an earlier-queued allocation that was still waiting.
    pub backfilled: bool,
    /// The score breakdown when it started (score-ordered vClusters only).
    pub start_score: Option<Box<crate::cost::ScoreBreakdown>>,
    /// When it first started (`started` is the current run's start after a preemption).
    pub first_started: Option<Time>,
    /// Times it was preempted (suspended and requeued).
    pub preempted: u32,
    /// Its last preemption wrote a checkpoint: it resumes rather than restarts.
    pub resume_from_checkpoint: bool,
    /// Times it was requeued after a failure.
    pub requeues: u32,
}

impl Allocation {
    /// Estimated end used by reservations: start + requested walltime (`None` = never ends).
    pub fn estimated_end(&self) -> Option<Time> {
        Some(self.started? + self.spec.lifecycle.walltime()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_mechanisms_name_is_its_serde_name() {
        for m in CheckpointMechanism::ALL {
            assert_eq!(serde_json::to_value(m).unwrap(), serde_json::json!(m.as_str()));
            assert_eq!(
                serde_json::from_value::<CheckpointMechanism>(m.as_str().into()).unwrap(),
                m
            );
        }
    }

    #[test]
    fn alloc_state_machine() {
        use AllocState as S;
        assert!(S::Pending.can_transition_to(S::Running));
        assert!(S::Pending.can_transition_to(S::Staging));
        assert!(S::Staging.can_transition_to(S::Running));
        assert!(S::Running.can_transition_to(S::Suspended));
        assert!(S::Suspended.can_transition_to(S::Pending));
        assert!(!S::Completed.can_transition_to(S::Running));
        assert!(!S::Pending.can_transition_to(S::Completed));
        assert!(!S::Running.can_transition_to(S::Pending));
        assert!(!S::Cancelled.can_transition_to(S::Pending));
        for s in [S::Completed, S::Failed, S::Cancelled] {
            assert!(s.is_terminal());
        }
    }

    #[test]
    fn preemption_class_bounds() {
        assert!(PreemptionClass::new(10).is_some());
        assert!(PreemptionClass::new(11).is_none());
    }

    #[test]
    fn constraints_match_capabilities() {
        let caps = NodeCapabilities {
            gpu_type: Some("GH200".into()),
            gpu_count: 4,
            cpu_cores: 72,
            memory_gb: 512,
            features: ["nvme_scratch".to_string()].into(),
            power_w: 0,
            unified_memory: true,
        };
        let mut c = Constraints::default();
        assert!(c.satisfied_by(&caps));
        c.gpu_type = Some("GH200".into());
        c.memory_gb = Some(512);
        c.features.insert("nvme_scratch".into());
        assert!(c.satisfied_by(&caps));
        c.memory_gb = Some(513);
        assert!(!c.satisfied_by(&caps));
        c.memory_gb = None;
        c.gpu_type = Some("A100".into());
        assert!(!c.satisfied_by(&caps));
        c.gpu_type = None;
        c.features.insert("infiniband".into());
        assert!(!c.satisfied_by(&caps));
        assert!(
            !Constraints {
                gpu_count: Some(8),
                ..Default::default()
            }
            .satisfied_by(&caps)
        );
    }
}
