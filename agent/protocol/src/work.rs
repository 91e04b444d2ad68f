//! The answer to an agent's poll: what to start and what to stop on its node.

use crate::spec::{DataMount, ProbeSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An agent's poll answered: what to start and what to stop.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Work {
    pub launch: Vec<Launch>,
    /// Allocations it runs that no longer run here (cancelled, preempted, requeued): stop them.
    pub kill: Vec<String>,
    /// Allocations it runs whose checkpoint was requested: hint them by their declared mechanism.
    #[serde(default)]
    pub checkpoint: Vec<String>,
    /// Allocations it runs that are preempted: how to stop them.
    #[serde(default)]
    pub preempt: Vec<PreemptWork>,
    /// Released sensitive claims whose node it must wipe (the site's wipe command), reporting the
    /// outcome with a later poll.
    #[serde(default)]
    pub wipe: Vec<String>,
    /// Allocations whose output someone follows: send what is new with the next polls.
    #[serde(default)]
    pub tail: Vec<String>,
    /// An operator asked for a fresh conformance fingerprint (the agent registers again with it).
    #[serde(default)]
    pub refresh_fingerprint: bool,
    /// Task launches with ranks on this node (`lattice launch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskLaunch>,
    /// Task launches it runs that ended (or that the leader does not know): stop their ranks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_tasks: Vec<String>,
    /// Image cache orders (`lattice cache warm|evict`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache: Vec<CacheOrder>,
}

/// What an agent starts for one allocation on its node (book: MPI process management environment).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Launch {
    pub id: String,
    pub entrypoint: String,
    /// Every node of the allocation, in order; this node is `nodes[task_index]`.
    pub nodes: Vec<String>,
    pub task_index: u32,
    pub walltime_s: Option<f64>,
    pub tenant: String,
    pub user: Option<String>,
    #[serde(default)]
    pub project: Option<String>,
    /// How the application takes checkpoint hints: `signal` (the default), `shmem`, `grpc`, `dmtcp`.
    /// A name, not an enum: an agent takes a mechanism it does not know as `signal` rather than
    /// refusing the whole poll.
    #[serde(default = "signal")]
    pub checkpoint: String,
    /// `grpc`: the loopback port the application declared for its checkpoint callback (the agent
    /// calls `127.0.0.1:PORT` unless the application writes another endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_port: Option<u16>,
    /// Its network domain's Slingshot VNI, and the CXI service's auth key (`FI_CXI_AUTH_KEY`).
    #[serde(default)]
    pub vni: Option<u32>,
    #[serde(default)]
    pub cxi_auth_key: Option<String>,
    /// Seconds of work its last completed checkpoint kept (`LATTICE_RESTART_FROM`): it resumes
    /// from that checkpoint. Absent on a first run or a restart from zero.
    #[serde(default)]
    pub restart_from_s: Option<f64>,
    /// A task group element: `LATTICE_TASK_GROUP_ID` and `LATTICE_TASK_INDEX`.
    #[serde(default)]
    pub task_group: Option<TaskGroup>,
    /// The uenv its processes run in (mounted at the agent's uenv mount point), and the view to activate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uenv: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uenv_view: Option<String>,
    /// A second uenv with the user's tools (profilers, debuggers), mounted at the agent's tools
    /// mount point (`/user-tools`) beside the application's (book: `environment.tools_uenv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_uenv: Option<String>,
    /// `environment.sign_required`: the uenvs are mounted only when their signatures verify with
    /// the site's uenv signing key; an unsigned or wrongly signed image is a prologue failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uenv_sign_required: bool,
    /// A sensitive allocation: audit mode — the agent records the files its processes open under
    /// its data mounts (eBPF, where the kernel allows) and reports them for the audit log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sensitive: bool,
    /// The OCI image its processes run in (a container of the agent's OCI runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The allocation's launch token (`LATTICE_LAUNCH_TOKEN`): the agents run `lattice-mpi-launcher`'s
    /// processes in it for whoever presents it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_token: Option<String>,
    /// The allocation's nodes' agent service addresses (`LATTICE_AGENTS`, for `lattice-mpi-launcher`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, String>,
    /// Its data mounts with a target (the agent binds them from the site's storage roots).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<DataMount>,
    /// Whether it gets the default mounts (home, output directory).
    #[serde(default = "yes")]
    pub data_defaults: bool,
    /// It has a checkpoint strategy: its checkpoint directory is made.
    #[serde(default)]
    pub checkpoints: bool,
    /// Its service's liveness probe, run by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,
}

fn yes() -> bool {
    true
}

fn signal() -> String {
    "signal".into()
}

/// What a task group element's view and launch carry: its group's id and its index.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "TaskGroupView"))]
pub struct TaskGroup {
    pub group: String,
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// A preemption for one node's agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PreemptWork {
    pub id: String,
    /// `checkpoint`: hint by the allocation's mechanism, wait up to `deadline_s` for the checkpoint,
    /// then stop it (SIGTERM, grace, SIGKILL) and report `checkpointed` — or `preempted` when the
    /// checkpoint did not complete in time; `stop`: stop it (after `grace_s`) and report `preempted`;
    /// `kill`: the same when no checkpoint can be written (storage down).
    pub how: String,
    #[serde(default)]
    pub deadline_s: f64,
    #[serde(default)]
    pub grace_s: f64,
}

/// One task launch's part on one node: ranks `first_rank..first_rank + num_ranks` of `world_size`,
/// run as `/bin/sh -c ENTRYPOINT` with a PMI server; the launch's nodes are `peers` (this one is
/// `peers[node_index]`, the head agent — rank 0's — is `peers[0]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskLaunch {
    pub launch_id: String,
    pub alloc: String,
    pub entrypoint: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    pub world_size: u32,
    pub node_index: u32,
    pub peers: Vec<TaskPeer>,
    /// The launch's secret: agents accept fences and aborts of this launch only with it.
    pub token: String,
    /// How long a fence may take before the launch is aborted ("PMI fence timeout").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_timeout_s: Option<f64>,
}

/// One node of a task launch and its ranks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskPeer {
    pub node: String,
    /// Its agent's service address (`host:port`).
    #[serde(default)]
    pub address: Option<String>,
    pub first_rank: u32,
    pub num_ranks: u32,
}

/// An operator's order for a node's image cache.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheOrder {
    /// `warm` (pull it; `sticky`: never evict it) or `evict`.
    pub op: String,
    /// A uenv, `name/version:tag`.
    pub image: String,
    #[serde(default)]
    pub sticky: bool,
}
