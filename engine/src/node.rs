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

/// Which of a node's capabilities its inventory left unset: what its agent discovers fills them
/// (the GPUs — count and model — when the inventory names neither; cores; memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsetCapabilities {
    pub gpus: bool,
    pub cpu_cores: bool,
    pub memory_gb: bool,
}

impl UnsetCapabilities {
    pub fn any(&self) -> bool {
        self.gpus || self.cpu_cores || self.memory_gb
    }

    /// The discovered values of the unset capabilities: GPU count and model (the model's short
    /// name, [`gpu_type_of`]), cores, and memory in GB rounded down to a multiple of 8 (what the
    /// kernel reports varies a little between identical nodes; they must stay one class).
    pub fn fill(
        &self,
        gpu_count: u32,
        gpu_model: Option<&str>,
        cpu_cores: u32,
        memory_bytes: u64,
    ) -> DiscoveredCapabilities {
        let gb = memory_bytes / 1_000_000_000;
        DiscoveredCapabilities {
            gpu_count: self.gpus.then_some(gpu_count),
            gpu_type: if self.gpus && gpu_count > 0 {
                gpu_model.and_then(gpu_type_of)
            } else {
                None
            },
            cpu_cores: (self.cpu_cores && cpu_cores > 0).then_some(cpu_cores),
            memory_gb: (self.memory_gb && gb >= 8).then(|| u32::try_from(gb - gb % 8).unwrap_or(u32::MAX)),
        }
    }
}

/// A GPU model's short name as users ask for it: `NVIDIA H200` → `H200`, `NVIDIA GH200 480GB` →
/// `GH200`, `NVIDIA A100-SXM4-80GB` → `A100`, `AMD Instinct MI300A` → `MI300A`.
pub fn gpu_type_of(model: &str) -> Option<String> {
    const VENDOR: [&str; 6] = ["nvidia", "amd", "instinct", "tesla", "geforce", "radeon"];
    model
        .split_whitespace()
        .find(|w| !VENDOR.contains(&w.to_lowercase().as_str()))
        .and_then(|w| w.split('-').next())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
}

/// What a node's agent discovered for the capabilities its inventory left unset, as the quorum
/// records it (`None`: set by the inventory, or nothing to fill).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveredCapabilities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<u32>,
}

impl DiscoveredCapabilities {
    pub fn is_empty(&self) -> bool {
        *self == DiscoveredCapabilities::default()
    }

    /// The inventory's capabilities with the discovered ones filled in.
    pub fn filled(&self, inventory: &NodeCapabilities) -> NodeCapabilities {
        let mut c = inventory.clone();
        if let Some(n) = self.gpu_count {
            c.gpu_count = n;
            c.gpu_type = self.gpu_type.clone();
        }
        if let Some(n) = self.cpu_cores {
            c.cpu_cores = n;
        }
        if let Some(n) = self.memory_gb {
            c.memory_gb = n;
        }
        c
    }
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
    fn gpu_models_have_short_names() {
        for (model, short) in [
            ("NVIDIA H200", "H200"),
            ("NVIDIA GH200 480GB", "GH200"),
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("AMD Instinct MI300A", "MI300A"),
            ("Tesla V100-SXM2-16GB", "V100"),
        ] {
            assert_eq!(gpu_type_of(model).as_deref(), Some(short), "{model}");
        }
        assert_eq!(gpu_type_of("NVIDIA"), None);
    }

    #[test]
    fn discovery_fills_only_what_is_unset() {
        let unset = UnsetCapabilities {
            gpus: true,
            cpu_cores: false,
            memory_gb: true,
        };
        // 125.9 GiB installed: 135.2 GB, 128 in steps of 8.
        let fill = unset.fill(1, Some("NVIDIA H200"), 16, 135_183_000_000);
        assert_eq!(
            fill,
            DiscoveredCapabilities {
                gpu_count: Some(1),
                gpu_type: Some("H200".into()),
                cpu_cores: None,
                memory_gb: Some(128),
            }
        );
        let inventory = NodeCapabilities {
            cpu_cores: 72,
            ..NodeCapabilities::default()
        };
        let c = fill.filled(&inventory);
        assert_eq!(
            (c.gpu_count, c.gpu_type.as_deref(), c.cpu_cores, c.memory_gb),
            (1, Some("H200"), 72, 128)
        );
        assert!(
            UnsetCapabilities::default()
                .fill(4, Some("H100"), 8, 1 << 40)
                .is_empty()
        );
    }

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
