//! Nodes: capabilities, topology position, conformance fingerprint, owner and the node state machine of the
//! book's "Node Lifecycle" chapter.

use crate::ids::{AllocId, GroupId, NodeId, TenantId, VClusterId};
use crate::time::Duration;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What a node offers. Two nodes with equal capabilities are interchangeable for constraint matching.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeCapabilities {
    /// GPU model (e.g. "GH200"), `None` for CPU-only nodes.
    pub gpu_type: Option<String>,
    pub gpu_count: u32,
    pub cpu_cores: u32,
    pub memory_gb: u32,
    /// Features such as `nvme_scratch`; a `BTreeSet` so equality and order are deterministic.
    pub features: BTreeSet<String>,
    /// Nominal power draw when busy, watts (for the power budget).
    pub power_w: u32,
    /// CPU and GPU share one memory domain (GH200, MI300A superchips).
    pub unified_memory: bool,
}

/// Hash of GPU driver, NIC firmware, BIOS/BMC firmware and kernel parameters (the agent computes it).
/// Nodes with equal fingerprints form a conformance group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ConformanceFingerprint(pub u64);

/// The node state machine (book: "Node Lifecycle").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Unknown,
    Booting,
    Ready,
    Degraded,
    Down,
    Draining,
    Drained,
    Failed,
}

impl NodeState {
    /// May new allocations be placed here? Only `Ready` nodes are candidates.
    pub fn schedulable(self) -> bool {
        self == NodeState::Ready
    }

    /// May existing allocations keep running here?
    pub fn runs_allocations(self) -> bool {
        matches!(self, NodeState::Ready | NodeState::Degraded | NodeState::Draining)
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            NodeState::Unknown => "unknown",
            NodeState::Booting => "booting",
            NodeState::Ready => "ready",
            NodeState::Degraded => "degraded",
            NodeState::Down => "down",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Failed => "failed",
        };
        f.write_str(s)
    }
}

/// Inputs that move a node through its state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeEvent {
    /// OpenCHAMI starts booting/reimaging the node (Unknown/Down → Booting).
    Boot,
    /// The agent passed its health check (Booting → Ready).
    HealthOk,
    /// Boot timeout or repeated boot failure (Booting → Failed).
    BootFail,
    /// Operator or scheduler drain (Ready/Degraded → Draining; → Drained at once if idle).
    Drain,
    /// Operator undrain (Draining/Drained → Ready).
    Undrain,
    /// First missed heartbeat (Ready → Degraded).
    HeartbeatMiss,
    /// Heartbeat back within the grace period (Degraded → Ready).
    HeartbeatResume,
    /// Grace period expired (Degraded → Down).
    GraceTimeout,
    /// Critical hardware failure or `lattice node disable` (any → Down).
    HardwareFailure,
    /// Reboot/reimage after a failure (Down → Booting, Failed → Unknown after wipe).
    Reboot,
    /// `lattice node enable` (Down → Ready).
    Enable,
}

/// A transition the state machine does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: event {event:?} is not allowed in state {state}")]
pub struct InvalidNodeTransition {
    pub node: NodeId,
    pub state: NodeState,
    pub event: NodeEvent,
}

/// The pure transition function. `busy` tells whether allocations still run on the node (a drain of an
/// idle node goes straight to `Drained`).
pub fn next_node_state(state: NodeState, event: NodeEvent, busy: bool) -> Option<NodeState> {
    use NodeEvent as E;
    use NodeState as S;
    Some(match (state, event) {
        (_, E::HardwareFailure) => S::Down,
        (S::Unknown | S::Down, E::Boot) => S::Booting,
        (S::Booting, E::HealthOk) => S::Ready,
        (S::Booting, E::BootFail) => S::Failed,
        (S::Ready | S::Degraded, E::Drain) if busy => S::Draining,
        (S::Ready | S::Degraded, E::Drain) => S::Drained,
        (S::Draining | S::Drained, E::Undrain) => S::Ready,
        (S::Ready, E::HeartbeatMiss) => S::Degraded,
        (S::Degraded, E::HeartbeatResume) => S::Ready,
        (S::Degraded, E::GraceTimeout) => S::Down,
        (S::Down, E::Reboot) => S::Booting,
        (S::Failed, E::Reboot) => S::Unknown,
        (S::Down, E::Enable) => S::Ready,
        _ => return None,
    })
}

/// Who holds a node right now (the seed's `owner: Option<(TenantId, VClusterId, AllocId)>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub tenant: TenantId,
    pub vcluster: VClusterId,
    pub alloc: AllocId,
}

/// A node as the inventory describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub capabilities: NodeCapabilities,
    pub group: GroupId,
    pub conformance: ConformanceFingerprint,
    /// The vCluster this node belongs to by contract (home); `None` = shared pool.
    pub home_vcluster: Option<VClusterId>,
    pub state: NodeState,
}

impl NodeSpec {
    /// A plain ready CPU node, as SWF replays use (one node per `--procs-per-node` processors).
    pub fn plain(name: impl Into<String>) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            capabilities: NodeCapabilities::default(),
            group: GroupId(0),
            conformance: ConformanceFingerprint(0),
            home_vcluster: None,
            state: NodeState::Ready,
        }
    }
}

/// A node inside the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: NodeId,
    pub spec: NodeSpec,
    pub state: NodeState,
    pub owner: Option<Owner>,
}

/// How long a node may boot before it is Failed, by node kind: its GPU model (`cpu` for a node
/// without GPUs), else `default`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BootTimeouts {
    pub default: Option<Duration>,
    pub by_kind: BTreeMap<String, Duration>,
}

impl BootTimeouts {
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.by_kind.is_empty()
    }

    /// The timeout of a node with these capabilities (`None`: it boots as long as it takes).
    pub fn of(&self, caps: &NodeCapabilities) -> Option<Duration> {
        let kind = caps.gpu_type.as_deref().unwrap_or("cpu");
        self.by_kind.get(kind).copied().or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeEvent as E;
    use NodeState as S;

    #[test]
    fn lifecycle_happy_path() {
        let mut s = S::Unknown;
        for (e, want) in [(E::Boot, S::Booting), (E::HealthOk, S::Ready)] {
            s = next_node_state(s, e, false).unwrap();
            assert_eq!(s, want);
        }
        assert!(s.schedulable());
    }

    #[test]
    fn drain_waits_for_allocations() {
        assert_eq!(next_node_state(S::Ready, E::Drain, true), Some(S::Draining));
        assert_eq!(next_node_state(S::Ready, E::Drain, false), Some(S::Drained));
        assert_eq!(next_node_state(S::Drained, E::Undrain, false), Some(S::Ready));
        assert!(!S::Draining.schedulable());
        assert!(S::Draining.runs_allocations());
    }

    #[test]
    fn degraded_keeps_running_but_not_schedulable() {
        let s = next_node_state(S::Ready, E::HeartbeatMiss, true).unwrap();
        assert_eq!(s, S::Degraded);
        assert!(!s.schedulable() && s.runs_allocations());
        assert_eq!(next_node_state(s, E::HeartbeatResume, true), Some(S::Ready));
        assert_eq!(next_node_state(s, E::GraceTimeout, true), Some(S::Down));
        assert!(!S::Down.runs_allocations());
    }

    #[test]
    fn hardware_failure_from_any_state() {
        for s in [
            S::Unknown,
            S::Booting,
            S::Ready,
            S::Degraded,
            S::Draining,
            S::Drained,
            S::Failed,
        ] {
            assert_eq!(next_node_state(s, E::HardwareFailure, true), Some(S::Down));
        }
    }

    #[test]
    fn invalid_transitions_are_refused() {
        assert_eq!(next_node_state(S::Unknown, E::HealthOk, false), None);
        assert_eq!(next_node_state(S::Ready, E::Undrain, false), None);
        assert_eq!(next_node_state(S::Down, E::HeartbeatResume, false), None);
        assert_eq!(next_node_state(S::Booting, E::Drain, false), None);
        assert_eq!(next_node_state(S::Failed, E::Enable, false), None);
    }

    #[test]
    fn recovery_paths() {
        assert_eq!(next_node_state(S::Down, E::Reboot, false), Some(S::Booting));
        assert_eq!(next_node_state(S::Down, E::Enable, false), Some(S::Ready));
        assert_eq!(next_node_state(S::Booting, E::BootFail, false), Some(S::Failed));
        assert_eq!(next_node_state(S::Failed, E::Reboot, false), Some(S::Unknown));
    }
}
