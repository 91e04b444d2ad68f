//! What the control plane answers with: allocation and node views, usage and accounting rows, node
//! orders, its clock, and the id rules.

use super::request::*;
/// The agent wire types (declared once, with the agent: `lattice-agent-protocol`).
pub use lattice_agent_protocol::TaskGroup as TaskGroupView;
use lattice_engine::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The control plane's clock in production: the wall clock read once, when the member starts,
/// advanced by the monotonic clock from then on. A jump of the system clock afterwards moves
/// nothing — heartbeat timeouts, walltimes, preemption deadlines and rate-limit windows all read
/// this. The monotonic clock is a parameter: the runtime passes its async runtime's, so that under a
/// deterministic simulation it is the simulation's.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_ms: u64,
    since: std::time::Instant,
    monotonic: fn() -> std::time::Instant,
}

impl Clock {
    /// Starts at `wall_ms` (ms since the epoch) now, advanced by `monotonic`.
    pub fn starting_at(wall_ms: u64, monotonic: fn() -> std::time::Instant) -> Clock {
        Clock {
            base_ms: wall_ms,
            since: monotonic(),
            monotonic,
        }
    }

    /// Starts at the system's wall clock, advanced by the operating system's monotonic clock.
    pub fn system() -> Clock {
        Clock::starting_at(wall_now().0, std::time::Instant::now)
    }

    /// Milliseconds since the epoch by this clock.
    pub fn now_ms(&self) -> u64 {
        self.base_ms + (self.monotonic)().saturating_duration_since(self.since).as_millis() as u64
    }
}

/// Milliseconds since the Unix epoch by the system's wall clock (names of backups, the clock's start).
pub fn wall_now() -> Time {
    Time(lattice_util::clock::epoch_ms())
}

/// The engine's event for an operator's node operation.
pub(crate) fn node_op_event(op: NodeOp) -> lattice_engine::NodeEvent {
    match op {
        NodeOp::Drain => lattice_engine::NodeEvent::Drain,
        NodeOp::Undrain => lattice_engine::NodeEvent::Undrain,
        NodeOp::Disable => lattice_engine::NodeEvent::HardwareFailure,
        NodeOp::Enable => lattice_engine::NodeEvent::Enable,
    }
}

/// What the API shows of an allocation (also the durable record of an ended one).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct AllocationView {
    pub id: String,
    pub tenant: String,
    pub vcluster: String,
    pub user: Option<String>,
    /// Its project within the tenant (as submitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub state: String,
    pub nodes: Vec<String>,
    pub requested_nodes: u32,
    pub walltime_s: Option<f64>,
    pub preemption_class: u8,
    pub submitted_ms: u64,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub end_reason: Option<String>,
    pub entrypoint: Option<String>,
    /// Its software environment, as submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentIn>,
    pub tags: BTreeMap<String, String>,
    /// Why it is still pending, when the quorum rejected its last proposal.
    pub last_rejection: Option<String>,
    /// f5: the fraction of its input data on the hot tier (absent when it declares no data).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_readiness: Option<f64>,
    /// Its network domain's VNI while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// Telemetry mode: prod | debug | audit.
    pub telemetry: String,
    /// Checkpoints requested through the API and taken by its agents.
    pub checkpoints: u32,
    pub last_checkpoint_ms: Option<u64>,
    /// How many times it was preempted, and why the last time ("priority for a-000009").
    #[serde(default)]
    pub preempted: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<String>,
    /// A task group element: its group's id and its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_group: Option<TaskGroupView>,
    /// While it waits: why, as the scheduler's last pass found (`reason`: dependencies, staging,
    /// group_limit, requeued, energy_window, budget, quota, topology, reserved (with `start`, ms),
    /// resources, behind_head (with `head`)), and a `summary` for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<serde_json::Value>,
    /// What it waits for: each dependency's allocation id and condition (success, failure, any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<DependsIn>,
    /// Its placement constraints, as asked (`None`: any node of its pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<ConstraintsIn>,
    /// What a lost run (or any failed one) does: `never`, `on_node_failure`, `always`; and how
    /// many times at most.
    #[serde(default)]
    pub requeue: String,
    #[serde(default)]
    pub max_requeues: u32,
    /// Allocations naming the same mutex never run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutex: Option<String>,
    /// Checkpoint-storage bandwidth it needs while it runs, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_gbps: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeView {
    pub name: String,
    pub state: String,
    pub owner: Option<String>,
    /// The vCluster and tenant of the allocation on it (the book's `lattice nodes` columns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vcluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub gpu_type: Option<String>,
    pub gpu_count: u32,
    /// Cores and memory (GB) it is scheduled with (0: not known).
    pub cpu_cores: u32,
    pub memory_gb: u32,
    pub group: u32,
    /// What its agent discovered where the inventory leaves GPUs, cores or memory unset, as the
    /// quorum recorded it (a node held when it was recorded takes it once free).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<std::collections::BTreeMap<String, serde_json::Value>>")]
    pub discovered: Option<lattice_engine::DiscoveredCapabilities>,
    /// What its agent reported at registration: the conformance fingerprint and capabilities.
    pub fingerprint: Option<String>,
    pub agent_capabilities: Option<serde_json::Value>,
    /// When the fingerprint was last reported (ms since the epoch).
    pub fingerprint_ms: Option<u64>,
    /// Its fingerprint is off its conformance baseline (it drains; OpenCHAMI is asked to remediate).
    pub drifted: bool,
    /// The last time its agent lost the control plane and replayed the heartbeats it buffered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_partition: Option<Partition>,
    /// Where what its agent discovered disagrees with the inventory (e.g. `gpu_count: inventory 0,
    /// agent 1`): it is scheduled as the inventory says until the inventory is corrected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capability_mismatch: Vec<String>,
}

/// A partition an agent lived through: from its first buffered heartbeat to its last (agent clock,
/// ms since the epoch), and how many it replayed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Partition {
    pub from_ms: u64,
    pub to_ms: u64,
    pub heartbeats: u64,
}

/// An allocation's state, end and whether it holds nodes ([`Control::brief`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Brief<'a> {
    pub state: &'a str,
    pub end_reason: Option<&'a str>,
    pub ended_ms: Option<u64>,
    pub holds_nodes: bool,
    /// When its current run started, and its network domain's VNI (a queued allocation's).
    pub run: Option<(u64, Option<u32>)>,
}

/// A node operation of `lattice node ...`/`lattice admin ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeOp {
    Drain,
    Undrain,
    /// Down at once: its allocation is requeued or failed (per its requeue policy).
    Disable,
    /// Down → Ready.
    Enable,
}

/// See [`Control::diagnostics_facts`].
#[derive(Clone, Debug)]
pub struct DiagnosticsFacts {
    /// (node, dragonfly group).
    pub nodes: Vec<(String, u32)>,
    pub network_domain: Option<String>,
    pub vni: Option<u32>,
    pub data: Option<DataIn>,
    pub storage_gbps: Option<f64>,
    pub data_readiness: Option<f64>,
}

/// One allocation's use of the machine inside a window (`GET /v1/accounting`): the book's usage
/// record (node-hours, GPU-hours, by tenant, project and user).
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct UsageRecord {
    pub id: String,
    pub tenant: String,
    pub project: String,
    pub user: Option<String>,
    pub vcluster: String,
    pub state: String,
    pub nodes: u32,
    pub gpus: u32,
    pub started_ms: u64,
    /// Absent while it runs.
    pub ended_ms: Option<u64>,
    /// Inside the window only.
    pub node_hours: f64,
    pub gpu_hours: f64,
}

/// One allocation as the accounting pipeline sees it ([`Control::accounting_rows`]).
#[derive(Clone, Debug)]
pub struct AccountingRow {
    pub view: AllocationView,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub sensitive: bool,
}

/// Node-hours and GPU-hours of finished and running allocations in a window (`usage` endpoints).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Usage {
    pub allocations: u64,
    pub node_hours: f64,
    pub gpu_hours: f64,
    pub since_ms: u64,
    pub until_ms: u64,
}

/// `a-000123` → 123; a task group element `a-000123[4]` → 123 (its group's number).
pub fn id_number(name: &str) -> Option<u64> {
    let base = name.split_once('[').map_or(name, |(b, _)| b);
    base.strip_prefix("a-")?.parse().ok()
}

/// `a-000123[4]` → (`a-000123`, 4); `None` for an allocation outside a task group.
pub fn group_element(name: &str) -> Option<(&str, u32)> {
    let (base, rest) = name.split_once('[')?;
    Some((base, rest.strip_suffix(']')?.parse().ok()?))
}

/// Live output of one allocation on one node (the newest [`LIVE_BYTES`] at most).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LiveOutput {
    /// Output offset of `data`'s first byte.
    pub offset: u64,
    pub data: String,
    /// Offset after `data`: pass it back as `after` for what follows.
    pub next: u64,
}

/// Live output kept per allocation and node.
pub const LIVE_BYTES: usize = 1 << 20;

/// How long a follow request keeps an allocation's output streaming from its agents (ms).
pub const FOLLOW_MS: u64 = 10_000;

/// How many allocations' output tails the control plane keeps (the full logs stay on the nodes).
pub const LOGS_KEPT: usize = 1000;

/// The most of one node's output an exit report carries.
pub const LOG_TAIL_BYTES: usize = 64 * 1024;
