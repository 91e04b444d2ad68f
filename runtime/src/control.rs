//! The control plane's local (eventually consistent) state: the very same `lattice-engine` the
//! simulator drives, fed from the API and the wall clock, plus the names and request details the API
//! shows. Node ownership itself is decided by the quorum; this side only proposes.

pub use crate::world::PendingProposal;
use crate::world::{Action, Outbox};
use lattice_adapters::logstore::Stream;
/// The agent wire types (declared once, with the agent: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{
    Buffered as BufferedBeat, ExitKind, Launch, Metric as MetricIn, Outcome, Output as OutputIn, PreemptWork,
    TaskGroup as TaskGroupView, Work,
};
use lattice_engine::PreemptHow;
use lattice_engine::{
    AllocId, AllocSpec, AllocState, Constraints, Controller, Decision, Duration, EndReason, Input, Lifecycle,
    NodeRange, Policy, PreemptionClass, TaskGroupRef, TenantId, Time, VClusterConfig, VClusterId,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;

/// The control plane's clock in production: the wall clock read once, when the member starts,
/// advanced by the monotonic clock from then on. A jump of the system clock afterwards moves
/// nothing — heartbeat timeouts, walltimes, preemption deadlines and rate-limit windows all read
/// this. (Under a deterministic simulation the monotonic clock is the simulation's.)
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_ms: u64,
    since: tokio::time::Instant,
}

impl Clock {
    /// Starts at `wall_ms` (ms since the epoch) now.
    pub fn starting_at(wall_ms: u64) -> Clock {
        Clock {
            base_ms: wall_ms,
            since: tokio::time::Instant::now(),
        }
    }

    /// Starts at the system's wall clock.
    pub fn system() -> Clock {
        Clock::starting_at(wall_now().0)
    }

    /// Milliseconds since the epoch by this clock.
    pub fn now_ms(&self) -> u64 {
        self.base_ms + self.since.elapsed().as_millis() as u64
    }
}

/// Milliseconds since the Unix epoch by the system's wall clock (names of backups, the clock's start).
pub fn wall_now() -> Time {
    Time(lattice_util::clock::epoch_ms())
}

/// `POST /v1/allocations`: the scheduling-relevant part of the Intent API request.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub tenant: String,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub vcluster: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Option<String>,
    pub resources: Resources,
    #[serde(default)]
    pub lifecycle: Option<LifecycleIn>,
    #[serde(default)]
    pub preemption_class: Option<i64>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Simulated agents only: how long the run takes (default: `sleep N` in the entrypoint, else 1 s).
    #[serde(default)]
    pub duration: Option<String>,
    /// DAG edges: `{"ref": ID, "condition": "success"}` (success/afterok, failure/afternotok,
    /// any/afterany); `ref` is an allocation id (or, inside a DAG, a member's name).
    #[serde(default)]
    pub depends_on: Vec<DependsIn>,
    /// A sensitive claim (ClaimingUser or SystemAdmin): class 10, first in the queue, its claim and
    /// release recorded in the quorum's hash-chained audit log.
    #[serde(default)]
    pub sensitive: bool,
    /// `{"strategy": "auto|manual|none", "estimated_minutes": M, "mechanism": "signal|shmem|grpc|dmtcp"}`:
    /// how the application checkpoints and takes hints.
    #[serde(default)]
    pub checkpoint: Option<CheckpointIn>,
    /// `{"network_domain": NAME, "expose": [{"name", "port", "protocol"}]}`: allocations of a tenant
    /// naming the same domain share a Slingshot VNI; exposed ports are registered services while it runs.
    #[serde(default)]
    pub connectivity: Option<ConnectivityIn>,
    /// A service's liveness probe (`{"probe_type": "tcp|http", "port", "path", "period_secs",
    /// "initial_delay_secs", "failure_threshold", "timeout_secs"}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<LivenessProbeIn>,
    /// `{"mounts": [{"source", "size_gb", "tier", "tier_hint"}]}`: input data. A mount hinted `hot`
    /// that is not there yet is pre-staged while the allocation waits (f5, data readiness). With a VAST
    /// service the control plane looks up each mount's tier and size (`tier`/`size_gb` may be left
    /// out); without one, data is taken to be where it is wanted.
    #[serde(default)]
    pub data: Option<DataIn>,
    /// `{"range": {"start": 0, "end": 99}, "concurrency": 20}`: a task group (job array) — one
    /// allocation per index, `ID[i]`, at most `concurrency` of them running at once; `${INDEX}` in
    /// the entrypoint becomes the element's index.
    #[serde(default)]
    pub task_group: Option<TaskGroupIn>,
    /// A client-chosen key (at most 128 characters): a submission repeated with the same tenant and
    /// key — a client's retry after a lost answer — gets the first one's id instead of a second
    /// allocation, also after a fail-over (the key is part of the durable record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// `{"uenv": "name/version:tag", "view": "default"}`: the software environment its processes run in
    /// (a SquashFS image mounted for them alone), or `{"image": "name:tag"}`: an OCI image from the
    /// nodes' image store, run by their OCI runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentIn>,
}

/// The `environment` block of a submission.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentIn {
    /// A uenv, `name/version:tag` (e.g. `prgenv-gnu/24.11:v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uenv: Option<String>,
    /// The uenv view to activate (its environment variables); default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
    /// An OCI image reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Longest uenv name.
pub const MAX_UENV_NAME: usize = 200;

/// `name/version:tag`: the agent's rule for a name it can map to the registry and the cache
/// ([`lattice_agent_protocol::uenv_layout`]), at most [`MAX_UENV_NAME`] bytes.
pub fn valid_uenv_name(s: &str) -> bool {
    s.len() <= MAX_UENV_NAME && lattice_agent_protocol::uenv_layout(s).is_ok()
}

/// Refuses an `environment` block this control plane cannot run, naming the field.
fn check_environment(e: &EnvironmentIn) -> Result<(), FieldError> {
    if let Some(image) = &e.image {
        if e.uenv.is_some() {
            return Err(bad("environment", "give either uenv or image, not both"));
        }
        if e.view.is_some() {
            return Err(bad("environment.view", "a view needs environment.uenv"));
        }
        return lattice_agent_protocol::parse_image_ref(image)
            .map(|_| ())
            .map_err(|err| bad("environment.image", err.to_string()));
    }
    match (&e.uenv, &e.view) {
        (Some(u), _) if !valid_uenv_name(u) => Err(bad(
            "environment.uenv",
            format!("{u:?}: expected name/version:tag (letters, digits, . _ + -)"),
        )),
        (None, Some(_)) => Err(bad("environment.view", "a view needs environment.uenv")),
        (_, Some(v))
            if v.is_empty()
                || v.len() > 64
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
        {
            Err(bad(
                "environment.view",
                format!("{v:?}: letters, digits, . _ - (at most 64)"),
            ))
        }
        _ => Ok(()),
    }
}

/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// A task group's indices and concurrency limit.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskGroupIn {
    pub range: IndexRange,
    #[serde(default)]
    pub concurrency: Option<u32>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IndexRange {
    pub start: u32,
    pub end: u32,
}

/// The most elements one task group may have.
pub const MAX_TASK_GROUP: u32 = 10_000;

/// The engine's event for an operator's node operation.
fn node_op_event(op: NodeOp) -> lattice_engine::NodeEvent {
    match op {
        NodeOp::Drain => lattice_engine::NodeEvent::Drain,
        NodeOp::Undrain => lattice_engine::NodeEvent::Undrain,
        NodeOp::Disable => lattice_engine::NodeEvent::HardwareFailure,
        NodeOp::Enable => lattice_engine::NodeEvent::Enable,
    }
}

/// An agent's heartbeat sequence that this control plane does not know (a node it took over holding
/// a re-attached allocation, before the agent registers with it).
const SEQ_UNKNOWN: u64 = u64::MAX;

#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataIn {
    #[serde(default)]
    pub mounts: Vec<MountIn>,
    /// Auto-mount home, create the output (and checkpoint) directory (book: "Sane Defaults"); on
    /// unless `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountIn {
    pub source: String,
    /// Where its processes see it (absent: staged for the scheduler only, not mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// read-only | read-write (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    #[serde(default)]
    pub size_gb: Option<f64>,
    /// Where the data is now: hot | warm | cold.
    #[serde(default)]
    pub tier: Option<String>,
    /// Where the job wants it (default hot).
    #[serde(default)]
    pub tier_hint: Option<String>,
}

fn tier(field: &str, s: &str) -> Result<lattice_engine::Tier, FieldError> {
    match s {
        "hot" => Ok(lattice_engine::Tier::Hot),
        "warm" => Ok(lattice_engine::Tier::Warm),
        "cold" => Ok(lattice_engine::Tier::Cold),
        o => Err(bad(field, format!("`{o}`: hot, warm or cold"))),
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectivityIn {
    #[serde(default)]
    pub network_domain: Option<String>,
    /// Named service ports (book: "Service Exposure"): while it runs, each is an endpoint of the
    /// service registry (`GET /api/v1/services/{name}`) on each of its nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose: Vec<ExposeIn>,
}

/// One exposed port.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeIn {
    /// The service's name (lowercase letters, digits and `-`, at most 63).
    pub name: String,
    pub port: u32,
    /// `tcp` (the default), `http`, `https` or `grpc`.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// The seed's `LivenessProbeSpec`: the agents probe the service and fail the allocation after
/// `failure_threshold` failures in a row (it is then requeued per its policy).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LivenessProbeIn {
    /// `tcp` or `http`.
    pub probe_type: String,
    pub port: u32,
    /// HTTP only (default `/`); a 2xx or 3xx answer is alive.
    #[serde(default)]
    pub path: Option<String>,
    /// Default 30.
    #[serde(default)]
    pub period_secs: Option<u32>,
    /// Default 10.
    #[serde(default)]
    pub initial_delay_secs: Option<u32>,
    /// Default 3.
    #[serde(default)]
    pub failure_threshold: Option<u32>,
    /// Default 5.
    #[serde(default)]
    pub timeout_secs: Option<u32>,
}

impl LivenessProbeIn {
    /// The agents' probe, with the seed's defaults; a bad field is named.
    pub fn spec(&self) -> Result<lattice_agent_protocol::ProbeSpec, FieldError> {
        let f = |x: &str| format!("liveness_probe.{x}");
        if self.probe_type != "tcp" && self.probe_type != "http" {
            return Err(bad(&f("probe_type"), format!("`{}`: tcp or http", self.probe_type)));
        }
        let port = u16::try_from(self.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad(&f("port"), format!("{}: 1-65535", self.port)))?;
        if let Some(p) = &self.path
            && (!p.starts_with('/') || p.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(bad(&f("path"), format!("`{p}`: an absolute path without spaces")));
        }
        let positive = |name: &str, v: Option<u32>, default: u32| match v.unwrap_or(default) {
            0 => Err(bad(&f(name), "must be at least 1")),
            x if x > 86_400 => Err(bad(&f(name), format!("{x}: at most 86400"))),
            x => Ok(x),
        };
        Ok(lattice_agent_protocol::ProbeSpec {
            probe_type: self.probe_type.clone(),
            port,
            path: self.path.clone(),
            period_secs: positive("period_secs", self.period_secs, 30)?,
            initial_delay_secs: self.initial_delay_secs.unwrap_or(10).min(86_400),
            failure_threshold: positive("failure_threshold", self.failure_threshold, 3)?,
            timeout_secs: positive("timeout_secs", self.timeout_secs, 5)?,
        })
    }
}

/// One endpoint of a registered service (`GET /api/v1/services/{name}`).
#[derive(Clone, Debug, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ServiceEndpoint {
    pub allocation: String,
    pub tenant: String,
    pub node: String,
    /// Where the node is reached: its agent's host, else the node's name.
    pub host: String,
    pub port: u16,
    pub protocol: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointIn {
    pub strategy: String,
    #[serde(default)]
    pub estimated_minutes: Option<f64>,
    #[serde(default)]
    pub mechanism: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DependsIn {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default = "success")]
    pub condition: String,
}

fn success() -> String {
    "success".into()
}

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub nodes: NodesIn,
    #[serde(default)]
    pub constraints: Option<ConstraintsIn>,
}

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NodesIn {
    Exact(i64),
    Range { min: i64, max: i64 },
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstraintsIn {
    pub gpu_type: Option<String>,
    pub gpu_count: Option<u32>,
    #[serde(default)]
    pub features: Vec<String>,
    #[serde(default)]
    pub topology: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LifecycleIn {
    #[serde(rename = "type", default = "bounded")]
    pub kind: String,
    pub walltime: Option<String>,
    /// Reactive: the node range (or `scale_policy.min`/`max`; default the requested nodes), the
    /// metric it scales on (`gpu_utilization`, `cpu_utilization`, or one its tasks report, e.g.
    /// `queue_depth`) and its target, and the policy's windows (`scale_policy: {evaluation_interval,
    /// scale_up_window, scale_down_window, cooldown, scale_down_threshold}`) — the trace format's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_policy: Option<serde_json::Value>,
}

fn bounded() -> String {
    "bounded".into()
}

impl Default for LifecycleIn {
    fn default() -> Self {
        LifecycleIn {
            kind: bounded(),
            walltime: None,
            min_nodes: None,
            max_nodes: None,
            metric: None,
            target: None,
            scale_policy: None,
        }
    }
}

/// A request the API refuses: the field and why (HTTP 400).
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
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
}

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct NodeView {
    pub name: String,
    pub state: String,
    pub owner: Option<String>,
    pub gpu_type: Option<String>,
    pub gpu_count: u32,
    pub group: u32,
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
}

/// A partition an agent lived through: from its first buffered heartbeat to its last (agent clock,
/// ms since the epoch), and how many it replayed.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, schemars::JsonSchema)]
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
}

/// What happened since the metrics last took it ([`Control::take_tally`]): the events behind the
/// seed's preemption, checkpoint and wipe metrics. Counts by label, durations (at most
/// [`TALLY_SAMPLES`] between two takes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// (victim's vCluster, reason) → preemptions ordered.
    pub preemptions: BTreeMap<(String, String), u64>,
    pub victim_requeues: u64,
    pub failed_checkpoints: u64,
    pub wipe_failures: u64,
    /// Drifted nodes taken Down for not being remediated in time.
    pub drift_timeouts: u64,
    /// Hardened boots of claimed nodes that failed or timed out (the node out, the claim failed).
    pub boot_failures: u64,
    pub checkpoints_ok: u64,
    pub checkpoints_failed: u64,
    /// Preemption checkpoints: hint to the last node's report, seconds.
    pub preemption_checkpoint_s: Vec<f64>,
    /// Checkpoint hints to their completion, seconds.
    pub checkpoint_s: Vec<f64>,
    /// Heartbeat round trips the agents measured, seconds.
    pub heartbeat_rtt_s: Vec<(String, f64)>,
    /// Runs killed at their walltime with a checkpoint in progress.
    pub walltime_conflicts: u64,
}

/// See [`Tally`].
pub const TALLY_SAMPLES: usize = 4096;

fn sample<T>(v: &mut Vec<T>, x: T) {
    if v.len() < TALLY_SAMPLES {
        v.push(x);
    }
}

/// Per-allocation details the engine does not keep.
#[derive(Clone, Debug)]
struct Meta {
    name: String,
    user: Option<String>,
    project: Option<String>,
    network_domain: Option<String>,
    entrypoint: Option<String>,
    tags: BTreeMap<String, String>,
    run: std::time::Duration,
    last_rejection: Option<String>,
    telemetry: String,
    checkpoints: u32,
    last_checkpoint_ms: Option<u64>,
    /// Why it was last preempted ("priority for a-000009").
    preempted_for: Option<String>,
    /// Reactive: the metric it scales on.
    metric: Option<String>,
    environment: Option<EnvironmentIn>,
    data: Option<DataIn>,
    /// Its exposed ports and its liveness probe.
    expose: Vec<ExposeIn>,
    liveness: Option<lattice_agent_protocol::ProbeSpec>,
}

impl Meta {
    fn new(name: String, run: std::time::Duration) -> Meta {
        Meta {
            name,
            user: None,
            project: None,
            network_domain: None,
            entrypoint: None,
            tags: BTreeMap::new(),
            run,
            last_rejection: None,
            telemetry: "prod".into(),
            checkpoints: 0,
            last_checkpoint_ms: None,
            preempted_for: None,
            metric: None,
            environment: None,
            data: None,
            expose: Vec::new(),
            liveness: None,
        }
    }
}

/// `PATCH /v1/allocations/{id}`: what may change after submission.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// A new walltime ("72h", "30m", "HH:MM:SS", seconds); not shorter than the time already run.
    #[serde(default)]
    pub walltime: Option<String>,
    /// Tags to set (an empty value removes the tag).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub telemetry: Option<TelemetryIn>,
}

#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryIn {
    /// prod | debug | audit (book: "Switching Telemetry Mode").
    pub mode: String,
    #[serde(default)]
    pub duration: Option<String>,
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

pub struct Control {
    /// The controller `rm-replay` runs, with the engine it owns.
    pub ctl: Controller,
    /// (tenant, idempotency key) → the id its first submission got.
    keys: BTreeMap<(String, String), String>,
    /// Submissions queued here not yet known to be on a majority's disks: id → whether a request
    /// is mirroring it right now.
    unacked: BTreeMap<String, bool>,
    /// The Raft term in which this control plane adopted the durable queue (`None`: it did not; a
    /// follower's, or a fresh one).
    pub adopted_term: Option<u64>,
    /// Unique per control plane in this process (its engine's ids mean nothing to another).
    pub incarnation: u64,
    /// The controller's decisions not yet turned into [`Action`]s.
    outbox: Outbox,
    /// Victims being preempted (until their agents report them stopped): how, from when, and the
    /// nodes whose (real) agent has not been told yet.
    preempting: BTreeMap<AllocId, Preempting>,
    /// Real agents: per allocation with a checkpoint hint out, what each node's agent reported.
    hint_reports: BTreeMap<AllocId, BTreeMap<u32, bool>>,
    /// Reactive allocations: each node's latest sample of the metric they scale on.
    metric_samples: BTreeMap<AllocId, BTreeMap<u32, f64>>,
    /// Real agents: per released sensitive claim, the nodes still to wipe (not yet told, told) and
    /// each node's outcome.
    wiping: BTreeMap<AllocId, Wiping>,
    /// Cancels that came while the allocation's start was at the quorum ([`Control::cancel`]).
    cancel_after_answer: std::collections::BTreeSet<AllocId>,
    /// OpenCHAMI wipes released claims' nodes (agents are not told to).
    pub wipe_by_openchami: bool,
    /// A wipe not confirmed within this is a failure (`sensitive.wipe_timeout`).
    pub wipe_timeout_ms: u64,
    /// Per (claim, node): when its wipe started and why it failed, for the audit entry.
    wipe_notes: BTreeMap<(AllocId, u32), String>,
    /// Per node: when its heartbeat grace runs out (ms), once it missed one.
    grace_until: BTreeMap<u32, u64>,
    /// When the engine asked to be woken next.
    /// Network domains and the VNI pool (book: "Network Domains").
    pub network: crate::network::NetworkDomains,
    /// The fabric manager is in use: a launch waits for its CXI service.
    pub fabric: bool,
    /// Staging allocations: whether their VAST prefetch is issued, and how many times it failed.
    prefetched: BTreeMap<AllocId, (bool, u32)>,
    /// CXI services created for running allocations: name → (service id, auth key).
    cxi: BTreeMap<String, (String, String)>,
    tenants: BTreeMap<String, TenantId>,
    /// (tenant, project) → the engine's project id (a project belongs to one tenant).
    projects: BTreeMap<(String, String), lattice_engine::ProjectId>,
    /// Project names by id (the inverse of `projects`).
    project_of_id: Vec<String>,
    vclusters: BTreeMap<String, VClusterId>,
    default_vcluster: String,
    /// A replay's virtual clock (`None`: [`Control::wall`]).
    clock: Option<Time>,
    /// The member's clock ([`Clock`]).
    pub wall: Clock,
    meta: Vec<Meta>,
    by_name: BTreeMap<String, AllocId>,
    node_names: Vec<String>,
    next: u64,
    capture: Option<std::fs::File>,
    /// DAG id → (member name, allocation id) in submission order.
    dags: BTreeMap<String, Vec<(String, String)>>,
    /// Per node: the agent's last heartbeat sequence number and when it arrived (ms), once registered
    /// ([`SEQ_UNKNOWN`] for a node taken over with a re-attached allocation, until its agent registers).
    agents: Vec<Option<(u64, u64)>>,
    /// Ends this control plane knows to be on a majority of the members' copies: a dependent starts
    /// only on such an end (one that a fail-over could lose would let it run beside its dependency
    /// run again).
    settled_ends: std::collections::BTreeSet<String>,
    /// Ends a dependent waits for: to be recorded on a majority by the scheduling loop.
    settle_wanted: std::collections::BTreeSet<String>,
    /// Operators' standing orders from the quorum, by node index: (drained, disabled). Every pass
    /// holds the engine to them first (a node a new leader's agents bring back Ready stays drained).
    admin: BTreeMap<u32, (bool, bool)>,
    /// Real agents: per running allocation, the nodes whose agent reported its exit (node → code).
    exits: BTreeMap<AllocId, BTreeMap<u32, i32>>,
    /// The output tails agents reported with exits: allocation → node → text (the newest
    /// [`LOGS_KEPT`] allocations).
    logs: BTreeMap<AllocId, BTreeMap<(String, Stream), String>>,
    /// Allocations that ended before this control plane took over: their final records (from the
    /// durable copy), by id.
    history: BTreeMap<String, AllocationView>,
    /// Re-attached allocations whose simulated agents must resume (drained by the loop).
    resumed: Vec<AllocId>,
    /// Real agents run the work: a node is Booting (not schedulable) until its agent registers.
    pub real_agents: bool,
    /// (node, allocation) of starts not yet launched on that node: a process of the allocation the
    /// node's agent still runs there is from an earlier start, stopped first ([`Control::work`]).
    fresh_starts: std::collections::BTreeSet<(u32, AllocId)>,
    /// Allocations that left nodes (ended, requeued, preempted) whose agents have not yet shown
    /// they stopped them there: a next start waits for these ([`Control::work`]).
    stopping_on: BTreeMap<AllocId, std::collections::BTreeSet<u32>>,
    /// Where agents last said (in their work polls) each allocation runs: node indexes.
    running_where: BTreeMap<String, std::collections::BTreeSet<u32>>,
    /// Each node's last running list.
    agent_running: BTreeMap<u32, Vec<String>>,
    /// Nodes whose agents have not polled this control plane since it took over, and when it did:
    /// they may still run anything (under a predecessor's lease) until that lease is surely over.
    unheard: std::collections::BTreeSet<u32>,
    took_over_ms: u64,
    /// Allocations taken over from the durable queue (a predecessor may have started them; ones
    /// submitted since cannot run anywhere yet).
    taken_over: std::collections::BTreeSet<AllocId>,
    /// `agents.heartbeat_timeout` in ms (part of the lease an agent is told, [`Control::lease_ms`]).
    pub heartbeat_timeout_ms: u64,
    /// Checkpoint hints not yet handed to the agents: allocation → nodes still to tell.
    checkpoint_hints: BTreeMap<AllocId, std::collections::BTreeSet<u32>>,
    /// Per node: the fingerprint and capabilities its agent reported.
    agent_info: BTreeMap<u32, (Option<String>, Option<serde_json::Value>)>,
    /// Per node: where its agent's own service listens (task launches' fences between agents).
    peer_addr: BTreeMap<u32, String>,
    /// Task launches within running allocations (`lattice launch`): leader state, not replicated.
    pub launches: crate::tasks::Launches,
    /// The secret each allocation's launch token is derived from (random per leader; zeros in tests).
    pub launch_secret: [u8; 32],
    /// The nodes' image caches: operators' warm/evict orders and what the agents report.
    pub caches: crate::cache::Caches,
    /// Per node: when its agent last reported the fingerprint (ms), and whether a fresh one is asked.
    fingerprint_ms: BTreeMap<u32, u64>,
    fingerprint_asked: std::collections::BTreeSet<u32>,
    /// Per node: the conformance baseline it must match (from the inventory: OpenCHAMI's groups).
    baselines: BTreeMap<u32, String>,
    /// Per node: the first fingerprint this control plane saw (the baseline when nothing else says).
    first_fingerprint: BTreeMap<u32, String>,
    /// Per drifted node: (expected, actual) fingerprints.
    drift_seen: BTreeMap<u32, (String, String)>,
    /// Allocations someone follows (until when, ms) and the live output their agents sent.
    followed: BTreeMap<AllocId, u64>,
    live: BTreeMap<AllocId, BTreeMap<(String, Stream), std::collections::VecDeque<OutputIn>>>,
    /// Events for the metrics since they last took them.
    tally: Tally,
    /// When each allocation's last checkpoint hint went out (its duration ends at the report).
    hinted_at: BTreeMap<AllocId, Time>,
    /// Per node: the last partition its agent replayed heartbeats for.
    partitions: BTreeMap<u32, Partition>,
    node_by_name: BTreeMap<String, u32>,
}

/// What a submission queued: its id (a task group's own id) and each allocation with the request
/// that recreates it.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub id: String,
    pub elements: Vec<(String, SubmitRequest)>,
}

impl Control {
    /// The site's engine (the same builder `rm-replay` uses: [`lattice_traces::site_engine`]) with the
    /// inventory's vClusters, then the profile's (or one EASY vCluster `default` when there are none).
    pub fn new(
        inventory: &lattice_traces::Inventory,
        vclusters: BTreeMap<String, VClusterConfig>,
        contracts: &lattice_traces::Contracts,
        capture: Option<&std::path::Path>,
    ) -> anyhow::Result<Control> {
        let node_names = inventory.nodes.iter().map(|n| n.name.clone()).collect();
        let mut engine = lattice_traces::site_engine(
            inventory,
            Policy::EASY,
            lattice_engine::FairShareConfig::default(),
            inventory.sensitive_pool_size,
            &[],
        )?;
        let mut vcs: BTreeMap<String, VClusterId> = inventory
            .vclusters
            .names()
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), VClusterId(i as u32)))
            .collect();
        let mut default_vcluster = inventory
            .vclusters
            .names()
            .first()
            .cloned()
            .unwrap_or_else(|| "default".to_string());
        for (i, (name, cfg)) in vclusters.into_iter().enumerate() {
            let id = match vcs.get(&name) {
                Some(&id) => id,
                None => engine.add_vcluster(&name),
            };
            engine.configure_vcluster(id, cfg)?;
            if i == 0 {
                default_vcluster = name.clone();
            }
            vcs.insert(name, id);
        }
        if vcs.is_empty() {
            vcs.insert("default".to_string(), engine.add_vcluster("default"));
        }
        let mut c = Control::with_controller(Controller::new(engine), node_names, vcs, default_vcluster)?;
        for (t, q) in &contracts.tenants {
            let id = c.tenant_id(t);
            c.ctl.engine.set_tenant_quota(id, *q);
        }
        for (t, p, q) in contracts.project_list() {
            let (tenant, project) = (c.tenant_id(t), c.project_id(t, p));
            c.ctl.engine.set_project_quota(project, tenant, *q);
        }
        if let Some(path) = capture {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            c.capture = Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?);
        }
        Ok(c)
    }

    /// A control plane around a controller already set up (a replay's, for the parity test): node
    /// `i` is `node_names[i]`; vClusters by name.
    pub fn with_controller(
        ctl: Controller,
        node_names: Vec<String>,
        vclusters: BTreeMap<String, VClusterId>,
        default_vcluster: String,
    ) -> anyhow::Result<Control> {
        let vcs = vclusters;
        let mut c = Control {
            clock: None,
            wall: Clock::system(),
            keys: BTreeMap::new(),
            unacked: BTreeMap::new(),
            adopted_term: None,
            incarnation: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            ctl,
            outbox: Outbox::default(),
            grace_until: BTreeMap::new(),
            preempting: BTreeMap::new(),
            hint_reports: BTreeMap::new(),
            metric_samples: BTreeMap::new(),
            wiping: BTreeMap::new(),
            cancel_after_answer: Default::default(),
            wipe_by_openchami: false,
            wipe_timeout_ms: 30 * 60_000,
            wipe_notes: BTreeMap::new(),
            network: crate::network::NetworkDomains::new(&Default::default(), 300_000)?,
            fabric: false,
            prefetched: BTreeMap::new(),
            cxi: BTreeMap::new(),
            tenants: BTreeMap::new(),
            projects: BTreeMap::new(),
            project_of_id: Vec::new(),
            vclusters: vcs,
            default_vcluster,
            meta: Vec::new(),
            by_name: BTreeMap::new(),
            node_names,
            next: 1,
            capture: None,
            dags: BTreeMap::new(),
            agents: Vec::new(),
            admin: BTreeMap::new(),
            settled_ends: Default::default(),
            settle_wanted: Default::default(),
            exits: BTreeMap::new(),
            agent_info: BTreeMap::new(),
            peer_addr: BTreeMap::new(),
            launches: Default::default(),
            launch_secret: [0; 32],
            caches: Default::default(),
            fingerprint_ms: BTreeMap::new(),
            fingerprint_asked: Default::default(),
            baselines: BTreeMap::new(),
            first_fingerprint: BTreeMap::new(),
            drift_seen: BTreeMap::new(),
            partitions: BTreeMap::new(),
            followed: BTreeMap::new(),
            live: BTreeMap::new(),
            tally: Tally::default(),
            hinted_at: BTreeMap::new(),
            checkpoint_hints: BTreeMap::new(),
            logs: BTreeMap::new(),
            history: BTreeMap::new(),
            resumed: Vec::new(),
            real_agents: false,
            heartbeat_timeout_ms: 30_000,
            fresh_starts: std::collections::BTreeSet::new(),
            stopping_on: BTreeMap::new(),
            running_where: BTreeMap::new(),
            agent_running: BTreeMap::new(),
            unheard: std::collections::BTreeSet::new(),
            took_over_ms: 0,
            taken_over: std::collections::BTreeSet::new(),
            node_by_name: BTreeMap::new(),
        };
        c.node_by_name = c
            .node_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        c.agents = vec![None; c.node_names.len()];
        Ok(c)
    }

    /// Tenants the engine already has (a replay registers the trace's up front).
    pub fn known_tenants(&mut self, tenants: &[(String, TenantId)]) {
        self.tenants.extend(tenants.iter().cloned());
    }

    /// Projects the engine already has: (tenant, project, id) (a replay's, up front).
    pub fn known_projects(&mut self, projects: &[(String, String, lattice_engine::ProjectId)]) {
        for (t, p, id) in projects {
            self.name_project(t, p, *id);
        }
    }

    fn name_project(&mut self, tenant: &str, project: &str, id: lattice_engine::ProjectId) {
        self.projects.insert((tenant.to_string(), project.to_string()), id);
        if self.project_of_id.len() <= id.index() {
            self.project_of_id.resize(id.index() + 1, String::new());
        }
        self.project_of_id[id.index()] = project.to_string();
    }

    /// The engine's id of `tenant`'s project `project`, registering it if new.
    fn project_id(&mut self, tenant: &str, project: &str) -> lattice_engine::ProjectId {
        let key = (tenant.to_string(), project.to_string());
        if let Some(id) = self.projects.get(&key) {
            return *id;
        }
        let id = lattice_engine::ProjectId(self.project_of_id.len() as u32);
        self.name_project(tenant, project, id);
        id
    }

    fn tenant_id(&mut self, name: &str) -> TenantId {
        if let Some(id) = self.tenants.get(name) {
            return *id;
        }
        let id = self.ctl.engine.add_tenant(name);
        self.tenants.insert(name.to_string(), id);
        id
    }

    /// A tenant's name (empty for an unknown id).
    fn tenant_name(&self, t: TenantId) -> String {
        self.ctl.engine.tenant(t).map(|t| t.name).unwrap_or_default()
    }

    /// The engine's clock never goes back ([`Clock`] is monotonic; and never before the engine's
    /// last input). A replay sets a virtual clock instead ([`Control::set_clock`]).
    pub fn now(&self) -> Time {
        match self.clock {
            Some(t) => t,
            None => Time(self.wall.now_ms()).max(self.ctl.engine.now()),
        }
    }

    /// Appends the trace capture to `path` from now on (a replay's, for the round trip).
    pub fn capture_to(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.capture = Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?);
        Ok(())
    }

    /// Runs on a virtual clock from now on: every input and pass happens at `t` until the next call.
    pub fn set_clock(&mut self, t: Time) {
        self.clock = Some(t);
    }

    /// Validates a request and queues it; returns the new allocation's id.
    pub fn submit(&mut self, req: SubmitRequest) -> Result<String, FieldError> {
        self.submit_named(req, None)
    }

    /// [`Control::submit`] under a given id (a mirrored submission adopted after a fail-over keeps
    /// the id its submitter was given); later ids continue above it.
    pub fn submit_named(&mut self, req: SubmitRequest, name: Option<&str>) -> Result<String, FieldError> {
        self.submit_all(req, name).map(|s| s.id)
    }

    /// Validates a request and queues it — a task group as one allocation per index, `ID[i]`, all
    /// or none. Returns the id and what was queued under which id (what the mirror keeps: one
    /// element's request names only its own index, so an adopted element is that element again).
    pub fn submit_all(&mut self, req: SubmitRequest, name: Option<&str>) -> Result<Submitted, FieldError> {
        if let Some(k) = &req.idempotency_key
            && (k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY)
        {
            return Err(bad(
                "idempotency_key",
                format!("{} characters; 1 to {MAX_IDEMPOTENCY_KEY}", k.len()),
            ));
        }
        let Some(tg) = req.task_group.clone() else {
            let id = self.submit_one(req.clone(), name, None)?;
            self.remember_key(&req, &id);
            return Ok(Submitted {
                id: id.clone(),
                elements: vec![(id, req)],
            });
        };
        let IndexRange { start, end } = tg.range;
        if end < start {
            return Err(bad("task_group.range", format!("end {end} < start {start}")));
        }
        if end - start >= MAX_TASK_GROUP {
            return Err(bad(
                "task_group.range",
                format!(
                    "{} elements; a task group has at most {MAX_TASK_GROUP}",
                    end - start + 1
                ),
            ));
        }
        if tg.concurrency == Some(0) {
            return Err(bad("task_group.concurrency", "must be at least 1"));
        }
        let base = match name {
            Some(n) => group_element(n).map_or(n, |(b, _)| b).to_string(),
            None => format!("a-{:06}", self.next),
        };
        let group = id_number(&base).ok_or_else(|| bad("id", format!("`{base}` is not an allocation id")))?;
        self.next = self.next.max(group + 1);
        let mut elements = Vec::new();
        for index in start..=end {
            let mut r = req.clone();
            r.task_group = Some(TaskGroupIn {
                range: IndexRange {
                    start: index,
                    end: index,
                },
                concurrency: tg.concurrency,
            });
            r.entrypoint = r.entrypoint.map(|e| e.replace("${INDEX}", &index.to_string()));
            let tref = TaskGroupRef {
                group,
                index,
                concurrency: tg.concurrency,
            };
            let id = self.submit_one(r.clone(), Some(&format!("{base}[{index}]")), Some(tref))?;
            elements.push((id, r));
        }
        if let Some((first, _)) = elements.first()
            && let Some(&id) = self.by_name.get(first)
        {
            self.capture_submit(id, &base, Some(&tg));
        }
        self.remember_key(&req, &base);
        Ok(Submitted { id: base, elements })
    }

    /// Remembers `req`'s idempotency key (if any) for `id` (a task group's base id), unless the key
    /// already names an allocation.
    pub fn remember_key(&mut self, req: &SubmitRequest, id: &str) {
        if let Some(k) = &req.idempotency_key {
            let base = group_element(id).map_or(id, |(b, _)| b);
            self.keys
                .entry((req.tenant.clone(), k.clone()))
                .or_insert_with(|| base.to_string());
        }
    }

    /// The key names `id` from now on (the one kept of duplicates).
    pub fn set_key(&mut self, tenant: &str, key: &str, id: &str) {
        self.keys.insert((tenant.to_string(), key.to_string()), id.to_string());
    }

    /// The id the first submission with this tenant and key got.
    pub fn by_key(&self, tenant: &str, key: &str) -> Option<&String> {
        self.keys.get(&(tenant.to_string(), key.to_string()))
    }

    /// `id` is queued but not known to be on a majority's disks; `in_flight`: a request is
    /// mirroring it now.
    pub fn unacked(&mut self, id: &str, in_flight: bool) {
        self.unacked.insert(id.to_string(), in_flight);
    }

    /// `id` is on a majority's disks (acknowledged).
    pub fn acked(&mut self, id: &str) {
        self.unacked.remove(id);
    }

    /// `None`: acknowledged (or unknown); `Some(in_flight)`: not yet.
    pub fn ack_state(&self, id: &str) -> Option<bool> {
        self.unacked.get(id).copied()
    }

    /// Whether the allocation `name` (or its task group) waits for its acknowledgement: it does not
    /// start before (a retry after a lost answer could otherwise make it run twice).
    pub fn waits_for_ack(&self, name: &str) -> bool {
        let base = group_element(name).map_or(name, |(b, _)| b);
        self.unacked.contains_key(base)
    }

    /// Up to `n` unacknowledged submissions no request is mirroring now.
    pub fn unacked_idle(&self, n: usize) -> Vec<String> {
        self.unacked
            .iter()
            .filter(|(_, in_flight)| !**in_flight)
            .map(|(id, _)| id.clone())
            .take(n)
            .collect()
    }

    /// The elements of task group `base` still known here, in index order.
    pub fn group_members(&self, base: &str) -> Vec<String> {
        let prefix = format!("{base}[");
        let mut out: Vec<(u32, String)> = self
            .by_name
            .range(prefix.clone()..)
            .take_while(|(n, _)| n.starts_with(&prefix))
            .filter_map(|(n, _)| Some((group_element(n)?.1, n.clone())))
            .collect();
        out.sort();
        out.into_iter().map(|(_, n)| n).collect()
    }

    fn group_view(&self, a: &lattice_engine::Allocation) -> Option<TaskGroupView> {
        a.spec.task_group.map(|g| TaskGroupView {
            group: format!("a-{:06}", g.group),
            index: g.index,
            concurrency: g.concurrency,
        })
    }

    fn submit_one(
        &mut self,
        req: SubmitRequest,
        name: Option<&str>,
        group: Option<TaskGroupRef>,
    ) -> Result<String, FieldError> {
        if req.tenant.trim().is_empty() {
            return Err(bad("tenant", "must not be empty"));
        }
        if let Some(e) = &req.environment {
            check_environment(e)?;
        }
        let nodes = match req.resources.nodes {
            NodesIn::Exact(n) if n >= 1 => NodeRange::exact(n as u32),
            NodesIn::Range { min, max } if min >= 1 && max >= min => NodeRange {
                min: min as u32,
                max: max as u32,
            },
            NodesIn::Exact(n) => return Err(bad("resources.nodes", format!("{n}: at least 1 node"))),
            NodesIn::Range { min, max } => {
                return Err(bad(
                    "resources.nodes",
                    format!("min {min} / max {max}: need 1 <= min <= max"),
                ));
            }
        };
        if nodes.max as usize > self.node_names.len() {
            return Err(bad(
                "resources.nodes",
                format!(
                    "{} nodes requested; the cluster has {}",
                    nodes.min,
                    self.node_names.len()
                ),
            ));
        }
        let class = match req.preemption_class {
            None => PreemptionClass::default(),
            Some(c) => u8::try_from(c)
                .ok()
                .and_then(PreemptionClass::new)
                .ok_or_else(|| bad("preemption_class", format!("{c}: must be 0-10")))?,
        };
        let lc = req.lifecycle.clone().unwrap_or_default();
        let mut nodes = nodes;
        let mut scale = None;
        let lifecycle = match lc.kind.as_str() {
            "bounded" => {
                let w = lc
                    .walltime
                    .as_deref()
                    .ok_or_else(|| bad("lifecycle.walltime", "a bounded allocation needs a walltime"))?;
                let walltime = lattice_traces::parse_walltime(w).map_err(|m| bad("lifecycle.walltime", m))?;
                Lifecycle::Bounded { walltime }
            }
            "unbounded" => Lifecycle::Unbounded,
            "reactive" => {
                if lc.metric.as_deref().is_none_or(|m| m.trim().is_empty()) {
                    return Err(bad(
                        "lifecycle.metric",
                        "a reactive allocation scales on a metric: gpu_utilization, cpu_utilization, or one its tasks report (e.g. queue_depth)",
                    ));
                }
                let v = serde_json::to_value(&lc).map_err(|e| bad("lifecycle", e.to_string()))?;
                let (l, policy, range) =
                    lattice_traces::reactive_lifecycle(v, nodes).map_err(|(field, m)| bad(&field, m))?;
                if range.max as usize > self.node_names.len() {
                    return Err(bad(
                        "lifecycle.max_nodes",
                        format!("{}: the cluster has {} nodes", range.max, self.node_names.len()),
                    ));
                }
                nodes = range;
                scale = Some(policy);
                l
            }
            other => {
                return Err(bad(
                    "lifecycle.type",
                    format!("`{other}`: bounded, unbounded or reactive"),
                ));
            }
        };
        let vc_name = req.vcluster.clone().unwrap_or_else(|| self.default_vcluster.clone());
        let Some(&vcluster) = self.vclusters.get(&vc_name) else {
            return Err(bad(
                "vcluster",
                format!(
                    "vCluster \"{vc_name}\" not found. Available: {}",
                    self.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        let run = match req.duration.as_deref() {
            Some(d) => {
                let d = lattice_traces::parse_duration(d).map_err(|m| bad("duration", m))?;
                std::time::Duration::from_millis(d.0)
            }
            None => sleep_seconds(req.entrypoint.as_deref()).unwrap_or(std::time::Duration::from_secs(1)),
        };
        let mut deps = Vec::new();
        for (i, d) in req.depends_on.iter().enumerate() {
            let field = format!("depends_on[{i}]");
            if !self.by_name.contains_key(&d.reference)
                && let Some(v) = self.history.get(&d.reference)
            {
                // It ended before this control plane took over: decided by its outcome now.
                let ok = v.end_reason.as_deref() == Some("success");
                let met = match d.condition.as_str() {
                    "success" | "afterok" => ok,
                    "failure" | "afternotok" => !ok,
                    _ => true,
                };
                if met {
                    continue;
                }
                return Err(bad(
                    &field,
                    format!(
                        "ref `{}` already ended ({}): condition `{}` can never be met",
                        d.reference, v.state, d.condition
                    ),
                ));
            }
            let on = *self
                .by_name
                .get(&d.reference)
                .ok_or_else(|| bad(&field, format!("ref `{}`: no such allocation", d.reference)))?;
            let condition = match d.condition.as_str() {
                "success" | "afterok" => lattice_engine::DependencyCondition::Success,
                "failure" | "afternotok" => lattice_engine::DependencyCondition::Failure,
                "any" | "afterany" => lattice_engine::DependencyCondition::Any,
                other => {
                    return Err(bad(
                        &field,
                        format!("condition `{other}`: success (afterok), failure (afternotok) or any (afterany)"),
                    ));
                }
            };
            deps.push(lattice_engine::Dependency { on, condition });
        }
        let tenant = self.tenant_id(&req.tenant);
        let mut spec = AllocSpec::simple(tenant, vcluster, nodes.min, Duration::from_secs(1));
        spec.project = self.project_id(&req.tenant, req.project.as_deref().unwrap_or("default"));
        spec.depends_on = deps;
        spec.nodes = nodes;
        spec.lifecycle = lifecycle;
        spec.scale = scale.map(Box::new);
        spec.preemption_class = class;
        spec.sensitive_claim = req.sensitive;
        spec.task_group = group;
        let expose = req.connectivity.as_ref().map(|c| c.expose.clone()).unwrap_or_default();
        for (i, e) in expose.iter().enumerate() {
            let f = |x: &str| format!("connectivity.expose[{i}].{x}");
            if e.name.is_empty()
                || e.name.len() > 63
                || !e
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                return Err(bad(
                    &f("name"),
                    format!("`{}`: lowercase letters, digits and -, at most 63", e.name),
                ));
            }
            if e.port == 0 || e.port > 65_535 {
                return Err(bad(&f("port"), format!("{}: 1-65535", e.port)));
            }
            if let Some(p) = &e.protocol
                && !["tcp", "http", "https", "grpc"].contains(&p.as_str())
            {
                return Err(bad(&f("protocol"), format!("`{p}`: tcp, http, https or grpc")));
            }
        }
        let liveness = req.liveness_probe.as_ref().map(LivenessProbeIn::spec).transpose()?;
        for (i, m) in req.data.iter().flat_map(|d| d.mounts.iter()).enumerate() {
            let f = |x: &str| format!("data.mounts[{i}].{x}");
            let hint = tier(&f("tier_hint"), m.tier_hint.as_deref().unwrap_or("hot"))?;
            let now_tier = match m.tier.as_deref() {
                Some(t) => tier(&f("tier"), t)?,
                None => hint,
            };
            if let Some(t) = &m.target {
                lattice_agent_protocol::valid_target(t).map_err(|e| bad(&f("target"), format!("`{t}`: {e}")))?;
                if !m.source.contains("://") {
                    return Err(bad(
                        &f("source"),
                        format!(
                            "`{}`: a mounted source is SCHEME://PATH (nfs://home/alice, s3://bucket/key)",
                            m.source
                        ),
                    ));
                }
            }
            match m.access.as_deref() {
                None | Some("read-only" | "read-write") => {}
                Some(a) => return Err(bad(&f("access"), format!("`{a}`: read-only or read-write"))),
            }
            let size_gb = m.size_gb.unwrap_or(0.0);
            if !(size_gb.is_finite() && size_gb >= 0.0) {
                return Err(bad(&f("size_gb"), format!("{size_gb}: a size in GB, 0 or more")));
            }
            spec.data.push(lattice_engine::DataMount {
                source: m.source.clone(),
                size_gb,
                tier: now_tier,
                tier_hint: hint,
            });
        }
        if let Some(c) = &req.checkpoint {
            spec.checkpoint = lattice_traces::checkpoint_spec(&c.strategy, c.estimated_minutes, c.mechanism.as_deref())
                .map_err(|(field, message)| bad(field, message))?;
        }
        if let Some(c) = &req.constraints_opt() {
            spec.constraints = Constraints {
                gpu_type: c.gpu_type.clone(),
                gpu_count: c.gpu_count,
                features: c.features.iter().cloned().collect(),
                ..Constraints::default()
            };
        }
        let now = self.now();
        let id = self
            .ctl
            .submit(now, spec)
            .map_err(|e| bad("resources", e.to_string()))?;
        let name = match name {
            Some(n) => {
                self.next = self.next.max(id_number(n).map_or(0, |k| k + 1));
                n.to_string()
            }
            None => {
                self.next += 1;
                format!("a-{:06}", self.next - 1)
            }
        };
        let meta = Meta {
            user: req.user.clone(),
            project: req.project.clone(),
            network_domain: req.connectivity.as_ref().and_then(|c| c.network_domain.clone()),
            entrypoint: req.entrypoint.clone(),
            tags: req.tags.clone(),
            environment: req.environment.clone(),
            data: req.data.clone(),
            expose,
            liveness,
            metric: (lifecycle.walltime().is_none() && scale.is_some())
                .then(|| lc.metric.clone())
                .flatten(),
            ..Meta::new(name.clone(), run)
        };
        self.enqueued(id, meta);
        if group.is_none() {
            self.capture_submit(id, &name, None);
        }
        Ok(name)
    }

    /// Queues an allocation whose spec is already built — a replayed trace job, on the replay's
    /// clock — under `name`, through the same bookkeeping as a request.
    pub fn submit_spec(
        &mut self,
        spec: AllocSpec,
        name: &str,
        user: Option<String>,
        run: std::time::Duration,
    ) -> Result<AllocId, lattice_engine::SubmitError> {
        let now = self.now();
        let project = self
            .project_of_id
            .get(spec.project.index())
            .filter(|p| !p.is_empty() && *p != "default")
            .cloned();
        let id = self.ctl.submit(now, spec)?;
        self.next = self.next.max(id_number(name).map_or(0, |k| k + 1));
        self.enqueued(
            id,
            Meta {
                user,
                project,
                ..Meta::new(name.to_string(), run)
            },
        );
        self.capture_submit(id, name, None);
        Ok(id)
    }

    fn enqueued(&mut self, id: AllocId, meta: Meta) {
        while self.meta.len() <= id.index() {
            self.meta.push(Meta::new(String::new(), meta.run));
        }
        self.by_name.insert(meta.name.clone(), id);
        self.meta[id.index()] = meta;
    }

    /// The capture's submit line (a task group once, under its id, with its range).
    fn capture_submit(&mut self, id: AllocId, name: &str, tg: Option<&TaskGroupIn>) {
        if self.capture.is_none() {
            return;
        }
        let Some(a) = self.ctl.engine.allocation(id) else {
            return;
        };
        let vcluster = self
            .ctl
            .engine
            .vcluster(a.spec.vcluster)
            .map(|v| v.name)
            .unwrap_or_default();
        let tenant = self.tenant_name(a.spec.tenant);
        let m = self.meta.get(id.index());
        let names = lattice_traces::SpecNames {
            tenant: &tenant,
            project: m.and_then(|m| m.project.as_deref()).unwrap_or("default"),
            vcluster: &vcluster,
            user: m.and_then(|m| m.user.as_deref()),
            deps: a
                .spec
                .depends_on
                .iter()
                .map(|d| (self.name_of(d.on), d.condition))
                .collect(),
        };
        let mut body = lattice_traces::alloc_json(name, &a.spec, &names);
        if let Some(tg) = tg {
            body.insert("task_group".into(), serde_json::json!(tg));
        }
        let ts = a.submitted.0 as f64 / 1000.0;
        // A sensitive claim is the trace format's `claim` event.
        let line = if a.spec.sensitive_claim {
            serde_json::json!({"ts": ts, "type": "claim", "claim": body})
        } else {
            serde_json::json!({"ts": ts, "type": "submit", "alloc": body})
        };
        self.capture_line(line);
    }

    fn capture_line(&mut self, mut v: serde_json::Value) {
        // Drop null fields: the JSONL reader takes absent, not null, optional fields.
        for key in ["alloc", "claim"] {
            if let Some(a) = v.get_mut(key).and_then(|a| a.as_object_mut()) {
                a.retain(|_, x| !x.is_null());
            }
        }
        if let Some(f) = self.capture.as_mut() {
            let _ = writeln!(f, "{v}");
            let _ = f.flush();
        }
    }

    /// Runs a scheduling pass at `now`; what it decided is in [`Control::take_actions`]. How long the
    /// pass took (the engine's CPU time, for `/metrics`).
    pub fn schedule(&mut self) -> (lattice_engine::PassStats, std::time::Duration) {
        self.enforce_admin();
        let now = self.now();
        let t0 = std::time::Instant::now();
        let stats = self.ctl.schedule(now);
        let took = t0.elapsed();
        let expired = self.ctl.stats.drift_timeouts;
        let boot_failures = self.ctl.stats.boot_failures;
        if let Err(e) = self.ctl.dispatch(now, &mut self.outbox) {
            tracing::error!("carrying out the pass's decisions: {e}");
        }
        let timed_out = self.ctl.stats.boot_failures - boot_failures;
        if timed_out > 0 {
            self.tally.boot_failures += timed_out;
            tracing::error!(
                "{timed_out} claimed node(s) not booted into the hardened image within sensitive.boot_timeout: \
                 out of service, their claims failed (an operator must investigate)"
            );
        }
        let expired = self.ctl.stats.drift_timeouts - expired;
        if expired > 0 {
            self.tally.drift_timeouts += expired;
            tracing::error!(
                "{expired} drifted node(s) not remediated within the drift remediation timeout: taken Down \
                 (an operator must investigate and bring them back)"
            );
        }
        (stats, took)
    }

    /// Applies what happened in the world (an agent's report, a quorum answer, a node change) at
    /// the current time; what it caused is in [`Control::take_actions`].
    pub fn input(&mut self, input: Input) -> Result<(), lattice_engine::ControlError> {
        let now = self.now();
        self.ctl.apply(now, input, &mut self.outbox)?;
        self.capture_input(now, input);
        Ok(())
    }

    /// The capture's line for an input that came from outside the world `rm-replay` models: an
    /// owner's cancel or walltime change, a node's failure, recovery, drain or undrain, a metric
    /// sample, checkpoint storage going down or up. (Commits, exits, checkpoints and wipes are the
    /// world's answers: a replay's fake world gives them again.)
    fn capture_input(&mut self, now: Time, input: Input) {
        use lattice_engine::NodeEvent as E;
        if self.capture.is_none() {
            return;
        }
        let ts = now.0 as f64 / 1000.0;
        let node = |n: lattice_engine::NodeId| self.node_names.get(n.index()).cloned().unwrap_or_default();
        let line = match input {
            Input::Cancel(id) => serde_json::json!({"ts": ts, "type": "cancel", "alloc_id": self.name_of(id)}),
            Input::Walltime(id, w) => serde_json::json!({
                "ts": ts, "type": "walltime", "alloc_id": self.name_of(id), "walltime": w.as_secs_f64()
            }),
            Input::Metric(id, value) => {
                let mut v =
                    serde_json::json!({"ts": ts, "type": "metric", "alloc_id": self.name_of(id), "value": value});
                if let Some(m) = self.meta.get(id.index()).and_then(|m| m.metric.clone()) {
                    v["metric"] = m.into();
                }
                v
            }
            Input::Storage(up) => serde_json::json!({
                "ts": ts, "type": if up { "storage_recover" } else { "storage_outage" }
            }),
            Input::Weights(vc, weights) => serde_json::json!({
                "ts": ts,
                "type": "weights",
                "vcluster": self.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default(),
                "weights": weights,
            }),
            Input::Node(n, ev) => {
                let (kind, mode) = match ev {
                    E::Drain => ("drain", None),
                    E::Undrain => ("undrain", None),
                    E::HardwareFailure => ("node_fail", Some("hardware")),
                    E::HeartbeatMiss => ("node_fail", Some("heartbeat")),
                    E::Enable | E::HeartbeatResume => ("node_recover", None),
                    // Registration, boot and health checks: a replay's nodes start ready; a grace
                    // that runs out follows from the heartbeat failure.
                    _ => return,
                };
                let mut v = serde_json::json!({"ts": ts, "type": kind, "node": node(n)});
                if let Some(m) = mode {
                    v["mode"] = m.into();
                }
                v
            }
            Input::Conformance(n, drifted) => serde_json::json!({
                "ts": ts, "type": if drifted { "drift" } else { "conform" }, "node": node(n)
            }),
            Input::RetryWipe(n) => serde_json::json!({"ts": ts, "type": "wipe_retry", "node": node(n)}),
            _ => return,
        };
        self.capture_line(line);
    }

    /// When the engine wants its next pass (a cycle tick, an energy window, a staging end).
    /// Asked of the engine as it is now, not as the pass left it: proposals the quorum committed
    /// since (their runs, their ends) move it.
    pub fn next_wakeup(&self) -> Option<Time> {
        let now = self.now();
        self.ctl.next_wakeup().filter(|t| *t > now)
    }

    /// The controller's decisions since the last call, as actions for the server (in order). Watches
    /// and wake-ups are kept here; a start that would need a VNI the pool cannot give stays pending.
    pub fn take_actions(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        // New network domains these proposals would create (each needs a VNI of its own).
        let mut new_domains: std::collections::BTreeSet<(String, String)> = Default::default();
        while !self.outbox.0.is_empty() {
            let decisions = std::mem::take(&mut self.outbox.0);
            for (t, d) in decisions {
                match d {
                    Decision::Propose(p) => {
                        let Some(a) = self.ctl.engine.allocation(p.alloc) else {
                            continue;
                        };
                        let tenant = self.tenant_name(a.spec.tenant);
                        let sensitive = a.spec.sensitive_claim;
                        if let Some(d) = self.domain_of(p.alloc, p.nodes.len() as u32) {
                            let key = (tenant.clone(), d.clone());
                            let (total, used) = self.network.pool();
                            let exists = self.network.exists(&tenant, &d);
                            if !exists && !new_domains.contains(&key) && used + new_domains.len() >= total {
                                // Stays Pending (retried next cycle, when a domain may have been released).
                                self.rejected(
                                    p.alloc,
                                    format!("vni_pool_exhausted: cannot create network domain {d} — VNI pool exhausted ({used}/{total} in use)"),
                                );
                                continue;
                            }
                            if !exists {
                                new_domains.insert(key);
                            }
                        }
                        let m = self.meta.get(p.alloc.index());
                        out.push(Action::Propose(PendingProposal {
                            incarnation: self.incarnation,
                            alloc: p.alloc,
                            name: m.map(|m| m.name.clone()).unwrap_or_default(),
                            tenant,
                            user: m.and_then(|m| m.user.clone()).unwrap_or_default(),
                            nodes: p.nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                            sensitive,
                            backfilled: p.backfilled,
                            project: m.and_then(|m| m.project.clone()),
                        }));
                    }
                    Decision::Release { alloc, nodes } => {
                        self.checkpoint_hints.remove(&alloc);
                        if self.real_agents {
                            // Until each of these nodes' agents shows it no longer runs the
                            // allocation (or the node is Down: its agent fenced it), a next start
                            // of it waits: never two runs at once.
                            self.stopping_on
                                .entry(alloc)
                                .or_default()
                                .extend(nodes.iter().map(|n| n.0));
                        }
                        out.push(Action::Release {
                            alloc,
                            name: self.name_of(alloc),
                            nodes: nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                        })
                    }
                    Decision::Scale { alloc, node, added } => out.push(Action::Scale {
                        alloc,
                        name: self.name_of(alloc),
                        node: self.node_names[node.index()].clone(),
                        added,
                    }),
                    Decision::Audit { alloc, event, nodes } => out.push(Action::Audit {
                        alloc,
                        user: self
                            .meta
                            .get(alloc.index())
                            .and_then(|m| m.user.clone())
                            .unwrap_or_default(),
                        name: self.name_of(alloc),
                        event,
                        note: nodes
                            .iter()
                            .filter_map(|n| self.wipe_notes.remove(&(alloc, n.0)))
                            .collect::<Vec<_>>()
                            .join("; "),
                        nodes: nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                    }),
                    Decision::Launch {
                        alloc,
                        nodes,
                        resume_from,
                        staging_remaining_s,
                    } => {
                        let name = self.name_of(alloc);
                        // A new start: exits reported in an earlier one (before a requeue) are not
                        // this one's.
                        self.exits.remove(&alloc);
                        // A new start: a process of this allocation still running on one of its
                        // nodes belongs to an earlier start (a requeue onto overlapping nodes).
                        if self.real_agents {
                            for n in &nodes {
                                self.fresh_starts.insert((n.0, alloc));
                            }
                        }
                        out.push(Action::Launch {
                            alloc,
                            vni: self.network.vni_of(&name),
                            name,
                            nodes: nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                            resume_from,
                            staging_remaining_s,
                        });
                    }
                    Decision::Stop { alloc, why } => {
                        tracing::info!("{} stops: {why:?}", self.name_of(alloc));
                        out.push(Action::Stop {
                            alloc,
                            name: self.name_of(alloc),
                            why,
                        });
                    }
                    Decision::Preempt(o) => {
                        tracing::info!(
                            "{} preempted for {} ({}): {:?}",
                            self.name_of(o.alloc),
                            self.name_of(o.for_alloc),
                            o.reason.as_str(),
                            o.how
                        );
                        let why = format!("{} for {}", o.reason.as_str(), self.name_of(o.for_alloc));
                        let vcluster = self
                            .ctl
                            .engine
                            .allocation(o.alloc)
                            .and_then(|a| self.ctl.engine.vcluster(a.spec.vcluster))
                            .map(|v| v.name)
                            .unwrap_or_default();
                        *self
                            .tally
                            .preemptions
                            .entry((vcluster, o.reason.as_str().to_string()))
                            .or_default() += 1;
                        if let Some(m) = self.meta.get_mut(o.alloc.index()) {
                            m.preempted_for = Some(why);
                        }
                        let to_tell = self
                            .ctl
                            .engine
                            .allocation(o.alloc)
                            .map(|a| a.nodes.iter().map(|n| n.0).collect())
                            .unwrap_or_default();
                        self.preempting.insert(
                            o.alloc,
                            Preempting {
                                how: o.how,
                                at: o.at,
                                to_tell,
                            },
                        );
                        out.push(Action::Preempt {
                            name: self.name_of(o.alloc),
                            order: o,
                        });
                    }
                    Decision::Checkpoint { alloc } => {
                        self.hinted_at.insert(alloc, self.now());
                        // Real agents deliver it at their next poll, by the allocation's mechanism.
                        if let Some(a) = self.ctl.engine.allocation(alloc) {
                            let nodes = a.nodes.iter().map(|n| n.0).collect();
                            self.checkpoint_hints.insert(alloc, nodes);
                            self.hint_reports.remove(&alloc);
                        }
                        out.push(Action::Checkpoint {
                            alloc,
                            name: self.name_of(alloc),
                        });
                    }
                    Decision::Wipe { alloc, nodes } => {
                        // Real agents run the site's wipe command at their next poll, unless
                        // OpenCHAMI wipes the nodes.
                        let to_tell = if self.wipe_by_openchami {
                            Default::default()
                        } else {
                            nodes.iter().map(|n| n.0).collect()
                        };
                        self.wiping.insert(
                            alloc,
                            Wiping {
                                to_tell,
                                waiting: nodes.iter().map(|n| n.0).collect(),
                                started_ms: t.0,
                            },
                        );
                        out.push(Action::Wipe {
                            alloc,
                            name: self.name_of(alloc),
                            nodes: nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                        })
                    }
                    Decision::Boot { alloc, nodes } => {
                        tracing::info!(
                            "{}: its nodes boot the hardened image before it starts",
                            self.name_of(alloc)
                        );
                        out.push(Action::Boot {
                            alloc,
                            name: self.name_of(alloc),
                            nodes: nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                        })
                    }
                    Decision::Watch { node, grace } => {
                        self.grace_until.insert(node.0, t.0 + grace.0);
                        out.push(Action::Watch { node, grace });
                    }
                    Decision::Drift {
                        node,
                        drifted,
                        sensitive,
                    } => {
                        let claim = self
                            .ctl
                            .engine
                            .node(node)
                            .and_then(|n| n.owner)
                            .filter(|o| self.ctl.engine.is_sensitive(o.alloc))
                            .map(|o| self.name_of(o.alloc));
                        out.push(Action::Drift {
                            node,
                            name: self.node_names[node.index()].clone(),
                            drifted,
                            sensitive,
                            message: self.drift_message(node.0),
                            claim,
                        })
                    }
                    // Asked again after every input ([`Control::next_wakeup`]): the quorum commits
                    // after the pass decided, and what it commits moves the engine's next wake-up.
                    Decision::WakeAt(_) => {}
                }
            }
        }
        out
    }

    /// The network domain an allocation placed on `nodes` nodes belongs to, if any.
    fn domain_of(&self, id: AllocId, nodes: u32) -> Option<String> {
        let a = self.ctl.engine.allocation(id)?;
        let m = self.meta.get(id.index())?;
        crate::network::domain_of(&m.name, m.network_domain.as_deref(), nodes, a.spec.sensitive_claim)
    }

    /// Joins the started allocation's network domain (if it has one): its VNI.
    fn join_network(&mut self, id: AllocId) -> Option<u32> {
        let a = self.ctl.engine.allocation(id)?;
        let d = self.domain_of(id, a.nodes.len() as u32)?;
        let tenant = self.tenant_name(a.spec.tenant);
        let name = self.name_of(id);
        match self.network.join(&tenant, &d, &name) {
            Ok((vni, _)) => Some(vni),
            Err(e) => {
                tracing::warn!("{name}: network domain {d}: {e}");
                None
            }
        }
    }

    /// The allocation no longer runs: it leaves its network domain (which drains when empty); the
    /// CXI service to revoke, if one was created.
    pub fn left_network(&mut self, name: &str) -> Option<String> {
        let now = self.now().0;
        self.network.leave(name, now);
        self.cxi.remove(name).map(|(service, _)| service)
    }

    /// Releases the domains whose grace period ran out: (tenant, domain, VNI).
    pub fn expire_network(&mut self) -> Vec<(String, String, u32)> {
        let now = self.now().0;
        self.network.expire(now)
    }

    /// Staging allocations whose prefetch is still to be asked of VAST: (name, sources to bring to the
    /// hot tier). Each is returned once (again after [`Control::prefetch_failed`]).
    pub fn to_prefetch(&mut self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        let staging: Vec<AllocId> = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.state == AllocState::Staging)
            .map(|a| a.id)
            .collect();
        self.prefetched.retain(|id, _| staging.contains(id));
        for id in staging {
            let entry = self.prefetched.entry(id).or_insert((false, 0));
            if entry.0 {
                continue;
            }
            entry.0 = true;
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            let sources: Vec<String> = a
                .spec
                .data
                .iter()
                .filter(|m| m.tier_hint == lattice_engine::Tier::Hot && m.tier != lattice_engine::Tier::Hot)
                .map(|m| m.source.clone())
                .collect();
            if !sources.is_empty() {
                out.push((self.name_of(id), sources));
            }
        }
        out
    }

    /// VAST refused or failed `name`'s prefetch: a staging failure (its progress restarts). It is
    /// asked again up to the engine's retry limit; returns whether it will be.
    pub fn prefetch_failed(&mut self, name: &str) -> bool {
        let Some(id) = self.id_of(name) else { return false };
        let _ = self.input(Input::StagingFailed(id));
        let e = self.prefetched.entry(id).or_insert((true, 0));
        e.1 += 1;
        // Asked again next cycle, unless the retries are spent (the engine raised its alert).
        e.0 = e.1 > lattice_engine::STAGING_RETRIES;
        !e.0
    }

    /// The fabric manager created `name`'s CXI service (its launch may go out now).
    pub fn cxi_ready(&mut self, name: &str, service: String, auth_key: String) {
        self.cxi.insert(name.to_string(), (service, auth_key));
    }

    /// The fabric manager could not set `name` up: a prologue failure (retried on other nodes first,
    /// up to the engine's limit); its release is in the actions.
    pub fn cxi_failed(&mut self, name: &str) {
        let Ok((id, a)) = self.allocation_named(name) else {
            return;
        };
        let Some(&node) = a.nodes.first() else { return };
        if let Err(e) = self.input(Input::PrologueFailed(id, node)) {
            tracing::warn!("{name}: prologue failure not applied: {e}");
        }
    }

    /// The quorum committed the proposal: the allocation runs (its launch is in the actions).
    pub fn committed(&mut self, id: AllocId) {
        if let Err(e) = self.input(Input::Committed(id)) {
            tracing::warn!("{}: commit not applied: {e}", self.name_of(id));
            return;
        }
        self.join_network(id);
        // A new run: earlier exit reports (of a requeued run) do not count.
        self.exits.remove(&id);
        self.preempting.remove(&id);
        if let Some(m) = self.meta.get_mut(id.index()) {
            m.last_rejection = None;
        }
        self.cancel_deferred(id);
    }

    /// How long a simulated agent runs the allocation from `resume_from` (its duration less the work a
    /// checkpoint kept).
    pub fn simulated_run(&self, id: AllocId, resume_from: Duration) -> std::time::Duration {
        let run = self.meta.get(id.index()).map_or(std::time::Duration::ZERO, |m| m.run);
        run.saturating_sub(std::time::Duration::from_millis(resume_from.0))
    }

    /// The quorum rejected it: back to the queue, retried next cycle.
    pub fn rejected(&mut self, id: AllocId, why: String) {
        let _ = self.input(Input::Rejected(id));
        if let Some(m) = self.meta.get_mut(id.index()) {
            m.last_rejection = Some(why);
        }
        self.cancel_deferred(id);
    }

    /// A cancel that came while the allocation's start was being proposed: carried out now that
    /// the quorum answered (a committed start is stopped and its nodes released).
    fn cancel_deferred(&mut self, id: AllocId) {
        if self.cancel_after_answer.remove(&id) {
            let name = self.name_of(id);
            if let Err(e) = self.input(Input::Cancel(id)) {
                tracing::warn!("{name}: deferred cancel not applied: {e}");
            }
        }
    }

    /// A run ended (success, failure, walltime, or killed while being preempted): returns whether the
    /// allocation was still running (its release and what follows are in the actions).
    pub fn completed(&mut self, id: AllocId, reason: EndReason) -> bool {
        let running = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| a.state == AllocState::Running);
        if !running {
            return false;
        }
        let now = self.now();
        // All the work it did, from the checkpoint its last run resumed from.
        let work = self.ctl.work_done(id, now);
        if let Err(e) = self.input(Input::Exited(id, reason)) {
            tracing::warn!("{}: end not applied: {e}", self.name_of(id));
            return false;
        }
        self.preempting.remove(&id);
        let name = self.meta.get(id.index()).map(|m| m.name.clone()).unwrap_or_default();
        // Killed for a preemption: the replay's world decides that again (its run's natural length is
        // unknown). Killed at the walltime: it wanted more than it got.
        if reason != EndReason::PreemptionKilled {
            let extra = if reason == EndReason::WalltimeExceeded {
                0.001
            } else {
                0.0
            };
            self.capture_line(serde_json::json!({
                "ts": now.0 as f64 / 1000.0,
                "type": "complete",
                "alloc_id": name,
                "duration": work.as_secs_f64() + extra,
                "exit": if reason == EndReason::Success { 0 } else { 1 },
            }));
        }
        true
    }

    /// A preempted allocation stopped on its nodes (`checkpointed`: its checkpoint was written): it
    /// waits again, and resumes from the checkpoint when it runs. Returns whether it was being
    /// preempted.
    pub fn suspended(&mut self, id: AllocId, checkpointed: bool) -> bool {
        let Some(p) = self.preempting.remove(&id) else {
            return false;
        };
        match self.input(Input::Suspended(id, checkpointed)) {
            Ok(()) => {
                // The victim is back in the queue; with its checkpoint, which took this long.
                self.tally.victim_requeues += 1;
                if checkpointed {
                    self.tally.checkpoints_ok += 1;
                    let s = self.now().0.saturating_sub(p.at.0) as f64 / 1000.0;
                    sample(&mut self.tally.preemption_checkpoint_s, s);
                }
                true
            }
            Err(e) => {
                tracing::warn!("{}: suspension not applied: {e}", self.name_of(id));
                false
            }
        }
    }

    /// A broker checkpoint was written (`ok`) or failed.
    pub fn checkpointed(&mut self, id: AllocId, ok: bool) {
        if ok {
            self.tally.checkpoints_ok += 1;
            if let Some(at) = self.hinted_at.remove(&id) {
                let s = self.now().0.saturating_sub(at.0) as f64 / 1000.0;
                sample(&mut self.tally.checkpoint_s, s);
            }
        } else {
            self.tally.checkpoints_failed += 1;
            self.hinted_at.remove(&id);
        }
        let _ = self.input(Input::Checkpointed(id, ok));
    }

    /// What happened since the last call (the metrics' events).
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// A heartbeat round trip an agent measured (seconds).
    pub fn heartbeat_rtt(&mut self, node: &str, secs: f64) {
        sample(&mut self.tally.heartbeat_rtt_s, (node.to_string(), secs));
    }

    /// The secure wipe of a released claim's nodes ended (`ok`: they return to the pool, else they
    /// are quarantined).
    pub fn wiped(&mut self, id: AllocId, ok: bool) {
        if !ok {
            self.tally.wipe_failures += 1;
        }
        if let Err(e) = self.input(Input::WipeDone(id, ok)) {
            tracing::warn!("{}: wipe result not applied: {e}", self.name_of(id));
        }
    }

    /// Cancels; returns whether it held nodes (their release is in the actions). `None` = no such
    /// allocation.
    pub fn cancel(&mut self, name: &str) -> Option<bool> {
        let Some(&id) = self.by_name.get(name) else {
            // Ended before this control plane took over: nothing to cancel.
            return self.history.contains_key(name).then_some(false);
        };
        let held = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| matches!(a.state, AllocState::Running | AllocState::Staging));
        let proposed = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| matches!(a.state, AllocState::Pending | AllocState::Staging) && !a.nodes.is_empty());
        if let Err(e) = self.input(Input::Cancel(id)) {
            if proposed {
                // Its start is at the quorum: cancelled once the quorum answers.
                self.cancel_after_answer.insert(id);
            } else {
                tracing::warn!("{name}: cancel not applied: {e}");
            }
        }
        self.preempting.remove(&id);
        Some(held)
    }

    /// An agent (re)registers its node: its heartbeat sequence restarts. Returns the node's state.
    pub fn register_agent(&mut self, node: &str) -> Result<String, FieldError> {
        self.register_agent_with(node, None, None)
    }

    /// [`Control::register_agent`] with what the agent reports about its node.
    pub fn register_agent_with(
        &mut self,
        node: &str,
        fingerprint: Option<String>,
        capabilities: Option<serde_json::Value>,
    ) -> Result<String, FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        if let Some(f) = &fingerprint
            && (f.len() != 64 || !f.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad("fingerprint", "a SHA-256 in hex (64 characters)"));
        }
        let now = self.now();
        self.agents[id.index()] = Some((0, now.0));
        if fingerprint.is_some() {
            self.fingerprint_ms.insert(id.0, now.0);
        }
        self.agent_info.insert(id.0, (fingerprint.clone(), capabilities));
        if self
            .ctl
            .engine
            .node(id)
            .is_some_and(|n| n.state == lattice_engine::NodeState::Booting)
        {
            let _ = self.input(Input::Node(id, lattice_engine::NodeEvent::HealthOk));
            // Up again, but an operator's drain still stands.
            self.enforce_admin();
        }
        if let Some(f) = fingerprint {
            self.first_fingerprint.entry(id.0).or_insert_with(|| f.clone());
            self.check_conformance(id, &f);
        }
        Ok(self.node_state(id))
    }

    /// Sets the conformance baselines (node name → SHA-256); a node without one is held to the
    /// majority of its node class's reported fingerprints, or else to its first.
    /// Nodes join the running site (book: "Bootstrap Sequence": nodes registered in SMD, which is
    /// read periodically): `entry` is an inventory node entry (one node by `name`, or `count` by
    /// `prefix`), `baseline` their conformance baseline. Each is scheduled from the next pass; with
    /// real agents it is `Booting` until its agent registers (book: a node "in inventory but has never
    /// reported" is not schedulable). With `capture`, each is written to the trace capture as
    /// `node_added`. Returns the names added; an entry that does not parse, names a node already
    /// here or a vCluster this site does not have adds nothing.
    pub fn add_nodes(
        &mut self,
        entry: &serde_json::Value,
        baseline: Option<&str>,
        capture: bool,
    ) -> Result<Vec<String>, String> {
        let mut nodes = lattice_traces::parse_node_entry(entry)?;
        for n in &mut nodes {
            if let Some(v) = &n.vcluster {
                n.spec.home_vcluster =
                    Some(*self.vclusters.get(v.as_str()).ok_or_else(|| {
                        format!("{}: vcluster `{v}` is not one of this site's vClusters", n.spec.name)
                    })?);
            }
        }
        if let Some(n) = nodes.iter().find(|n| self.node_by_name.contains_key(&n.spec.name)) {
            return Err(lattice_engine::EngineError::DuplicateNode(n.spec.name.clone()).to_string());
        }
        let now = self.now();
        let mut added = Vec::new();
        for lattice_traces::JoiningNode { mut spec, entry, .. } in nodes {
            let name = spec.name.clone();
            if self.real_agents && spec.state == lattice_engine::NodeState::Ready {
                spec.state = lattice_engine::NodeState::Booting;
            }
            let id = self.ctl.add_node(now, spec).map_err(|e| e.to_string())?;
            self.node_by_name.insert(name.clone(), id.0);
            self.node_names.push(name.clone());
            self.agents.push(None);
            if let Some(b) = baseline {
                self.baselines.insert(id.0, b.to_ascii_lowercase());
            }
            if capture {
                let ts = now.0 as f64 / 1000.0;
                self.capture_line(serde_json::json!({"ts": ts, "type": "node_added", "node": entry}));
            }
            added.push(name);
        }
        Ok(added)
    }

    pub fn set_baselines(&mut self, baselines: &BTreeMap<String, String>) {
        self.baselines = baselines
            .iter()
            .filter_map(|(n, f)| Some((self.node_index(n)?.0, f.to_ascii_lowercase())))
            .collect();
    }

    /// What `node`'s fingerprint should be (book: "Drift Response": changed, or diverged from the
    /// majority of its group): its configured baseline; else the fingerprint more than half of the
    /// other reporting nodes of its class share (at least two of them); else the first it reported.
    fn expected_fingerprint(&self, node: lattice_engine::NodeId) -> Option<String> {
        if let Some(b) = self.baselines.get(&node.0) {
            return Some(b.clone());
        }
        let class = self.ctl.engine.class_of(node);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        let mut reporting = 0;
        for (n, (f, _)) in &self.agent_info {
            if *n == node.0 || self.ctl.engine.class_of(lattice_engine::NodeId(*n)) != class {
                continue;
            }
            if let Some(f) = f {
                reporting += 1;
                *counts.entry(f.as_str()).or_default() += 1;
            }
        }
        let top = counts.iter().max_by_key(|(_, c)| **c);
        match top {
            Some((f, c)) if reporting >= 2 && 2 * c > reporting => Some(f.to_string()),
            _ => self.first_fingerprint.get(&node.0).cloned(),
        }
    }

    /// Compares a reported fingerprint with the node's expected one: a change of verdict is the
    /// controller's `Conformance` input (drain and remediation, or back to the pool).
    fn check_conformance(&mut self, node: lattice_engine::NodeId, actual: &str) {
        let Some(expected) = self.expected_fingerprint(node) else {
            return;
        };
        let drifted = expected != actual;
        if drifted {
            self.drift_seen.insert(node.0, (expected, actual.to_string()));
        }
        if drifted == self.ctl.is_drifted(node) {
            return;
        }
        let name = self.node_names[node.index()].clone();
        // (The trace capture writes it as a `drift` or `conform` event.)
        if let Err(e) = self.input(Input::Conformance(node, drifted)) {
            tracing::warn!("node {name}: conformance not applied: {e}");
        }
    }

    /// `expected=…, actual=…` for a node's last drift (empty if none).
    pub fn drift_message(&self, node: u32) -> String {
        self.drift_seen
            .get(&node)
            .map(|(e, a)| format!("conformance_drift: expected={e}, actual={a}"))
            .unwrap_or_default()
    }

    /// Is the node drifted from its conformance baseline?
    pub fn drifted(&self, node: &str) -> bool {
        self.node_index(node).is_some_and(|n| self.ctl.is_drifted(n))
    }

    /// Where `node`'s agent serves the agents' service (reported at registration).
    pub fn set_agent_service(&mut self, node: &str, addr: Option<String>) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        if let Some(a) = &addr
            && (a.is_empty() || a.len() > 255 || a.contains(['/', ' ', '\0']) || !a.contains(':'))
        {
            return Err(bad("peer", "host:port of the agent's service"));
        }
        match addr {
            Some(a) => self.peer_addr.insert(id.0, a),
            None => self.peer_addr.remove(&id.0),
        };
        Ok(())
    }

    /// A task launch within running allocation `name` (`lattice launch`): laid out over its nodes.
    pub fn launch_tasks(
        &mut self,
        name: &str,
        req: &crate::tasks::TaskRequest,
        token: String,
    ) -> Result<crate::tasks::LaunchView, FieldError> {
        let (_, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running {
            return Err(bad("id", format!("allocation {name} is not running")));
        }
        let nodes: Vec<(String, Option<String>)> = a
            .nodes
            .iter()
            .map(|n| (self.node_names[n.index()].clone(), self.peer_addr.get(&n.0).cloned()))
            .collect();
        let now_ms = self.now().0;
        self.launches
            .create(
                req,
                crate::tasks::NewLaunch {
                    alloc: name,
                    nodes,
                    token,
                    now_ms,
                },
            )
            .map_err(|(f, m)| bad(&f, m))
    }

    /// An agent's poll, for task launches: the parts of launches `node` should start (of allocations
    /// running on it), and which of the launches it runs (`running`) to stop — ended or unknown here.
    pub fn task_work(&mut self, node: &str, running: &[String]) -> (Vec<crate::tasks::TaskWork>, Vec<String>) {
        self.sweep_launches();
        let Some(nid) = self.node_index(node) else {
            return (Vec::new(), Vec::new());
        };
        let now = self.now().0;
        self.launches.reconcile(node, running, now);
        let engine = &self.ctl.engine;
        let by_name = &self.by_name;
        let here = |alloc: &str| {
            by_name
                .get(alloc)
                .and_then(|id| engine.allocation(*id))
                .is_some_and(|a| a.state == AllocState::Running && a.nodes.contains(&nid))
        };
        let start = self.launches.hand_out(node, here);
        let stop = running.iter().filter(|l| !self.launches.is_live(l)).cloned().collect();
        (start, stop)
    }

    /// Launches of allocations that no longer run are ended (failed) first.
    fn sweep_launches(&mut self) {
        let now = self.now().0;
        let mut launches = std::mem::take(&mut self.launches);
        launches.sweep(
            |alloc| {
                self.id_of(alloc)
                    .and_then(|id| self.ctl.engine.allocation(id))
                    .is_some_and(|a| a.state == AllocState::Running)
            },
            now,
        );
        self.launches = launches;
    }

    /// The task launches of allocation `name`.
    pub fn task_launches(&mut self, name: &str) -> Vec<crate::tasks::LaunchView> {
        self.sweep_launches();
        self.launches.list(name)
    }

    pub fn task_launch(&mut self, name: &str, launch: &str) -> Option<crate::tasks::LaunchView> {
        self.sweep_launches();
        self.launches.get(name, launch)
    }

    /// Where a terminal into running allocation `name` goes (`lattice attach`): the node (`node`, else
    /// the allocation's first), its agent's service address, the allocation's launch token, and
    /// whether it is a sensitive claim (attach is audited).
    pub fn attach_target(&self, name: &str, node: Option<&str>) -> Result<(String, String, String, bool), FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if self.preempting.contains_key(&id) {
            return Err(bad(
                "id",
                "allocation is being checkpointed — attach unavailable until rescheduled",
            ));
        }
        if a.state != AllocState::Running {
            return Err(bad("id", format!("allocation {name} is not running")));
        }
        let target = match node {
            None => *a
                .nodes
                .first()
                .ok_or_else(|| bad("id", "the allocation holds no nodes"))?,
            Some(n) => self
                .node_index(n)
                .filter(|nid| a.nodes.contains(nid))
                .ok_or_else(|| bad("node", format!("{n} is not a node of {name}")))?,
        };
        let node_name = self.node_names[target.index()].clone();
        // Its agent must have started it there (or seen its part end there).
        let started_there = self
            .agent_running
            .get(&target.0)
            .is_some_and(|r| r.iter().any(|x| x == name))
            || self.exits.get(&id).is_some_and(|e| e.contains_key(&target.0));
        if !started_there {
            return Err(bad(
                "node",
                format!("{name} has not started on {node_name} yet; retry in a moment"),
            ));
        }
        let addr = self.peer_addr.get(&target.0).cloned().ok_or_else(|| {
            bad(
                "node",
                format!("the agent of {node_name} serves no terminals (its --peer-listen)"),
            )
        })?;
        let token = self.launch_token(name, a.started.map_or(0, |t| t.0));
        Ok((node_name, addr, token, a.spec.sensitive_claim))
    }

    /// Orders `op` (`warm`, `evict`) of `req.image` for the chosen nodes (every node by default, or a
    /// dragonfly group's); the node names.
    pub fn cache_order(&mut self, op: &str, req: &crate::cache::CacheRequest) -> Result<Vec<String>, FieldError> {
        if !valid_uenv_name(&req.image) {
            return Err(bad("image", format!("{:?}: expected name/version:tag", req.image)));
        }
        let nodes: Vec<String> = if !req.nodes.is_empty() {
            for n in &req.nodes {
                if self.node_index(n).is_none() {
                    return Err(bad("nodes", format!("no node {n} in the inventory")));
                }
            }
            req.nodes.clone()
        } else {
            (0..self.node_names.len() as u32)
                .filter(|i| {
                    req.group.is_none_or(|g| {
                        self.ctl
                            .engine
                            .node(lattice_engine::NodeId(*i))
                            .is_some_and(|n| n.spec.group.0 == g)
                    })
                })
                .map(|i| self.node_names[i as usize].clone())
                .collect()
        };
        if nodes.is_empty() {
            return Err(bad("group", "no node in that group"));
        }
        let order = crate::cache::CacheOrder {
            op: op.to_string(),
            image: req.image.clone(),
            sticky: req.sticky && op == "warm",
        };
        self.caches.order(&nodes, order);
        Ok(nodes)
    }

    /// The token `lattice-mpi-launcher` presents to run processes in allocation `name`'s current run.
    fn launch_token(&self, name: &str, started_ms: u64) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.launch_secret);
        h.update(name.as_bytes());
        h.update(started_ms.to_le_bytes());
        h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// With real agents: idle nodes whose agent has not registered are Booting — nothing is placed on
    /// a node nobody would run it on; its agent's registration makes it Ready (the seed's node
    /// lifecycle: Booting → HealthOk → Ready). Nodes that hold a (re-attached) allocation keep it and
    /// time out as usual if their agent does not come back.
    pub fn await_agents(&mut self) {
        use lattice_engine::{NodeEvent, NodeState};
        if !self.real_agents {
            return;
        }
        // Until each agent polls (or its lease is surely over), it may run an earlier start.
        self.unheard = (0..self.node_names.len() as u32).collect();
        self.took_over_ms = self.now().0;
        self.taken_over = self.by_name.values().copied().collect();
        for i in 0..self.node_names.len() {
            let id = lattice_engine::NodeId(i as u32);
            let idle_ready = self
                .ctl
                .engine
                .node(id)
                .is_some_and(|n| n.owner.is_none() && n.state == NodeState::Ready);
            if self.agents[i].is_none() && idle_ready {
                let _ = self.input(Input::Node(id, NodeEvent::HardwareFailure));
                let _ = self.input(Input::Node(id, NodeEvent::Boot));
            }
        }
    }

    /// Asks `node`'s agent to recompute and report its conformance fingerprint (at its next poll).
    pub fn ask_fingerprint(&mut self, node: &str) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        self.fingerprint_asked.insert(id.0);
        Ok(())
    }

    /// A heartbeat with the agent's monotonic sequence number: a replayed or reordered one (not above
    /// the last) is refused; a heartbeat of a Degraded node brings it back (HeartbeatResume).
    pub fn heartbeat(&mut self, node: &str, seq: u64) -> Result<String, FieldError> {
        self.heartbeat_with(node, &[], seq)
    }

    /// [`Control::heartbeat`] after a partition: the agent replays the heartbeats it buffered, in
    /// strictly increasing order and below `seq` (else the batch is refused whole). Buffered ones at or
    /// below the last accepted sequence were delivered already (their answer was lost with the link)
    /// and are skipped; `seq` itself must be new, so a replayed request is still refused. The node's
    /// `last_partition` records the ones replayed.
    /// How long `node`'s agent may keep running its work without an accepted heartbeat (counted
    /// from when it sent the last one accepted): the heartbeat timeout plus the grace the
    /// controller would give the node now. After that the control plane may have requeued its
    /// allocation elsewhere, so the agent stops it first (fencing: never two runs at once).
    pub fn lease_ms(&self, node: &str) -> u64 {
        let grace = self
            .node_index(node)
            .map_or(self.ctl.grace.default, |n| self.ctl.node_grace(n));
        self.heartbeat_timeout_ms + grace.0
    }

    pub fn heartbeat_with(&mut self, node: &str, buffered: &[BufferedBeat], seq: u64) -> Result<String, FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let Some((last, _)) = self.agents[id.index()].filter(|(seq, _)| *seq != SEQ_UNKNOWN) else {
            return Err(bad("id", format!("node {node}: the agent has not registered")));
        };
        for (i, w) in buffered.windows(2).enumerate() {
            if w[1].seq <= w[0].seq {
                return Err(bad(
                    &format!("buffered[{}].seq", i + 1),
                    format!("out-of-order buffered heartbeat: seq {} after {}", w[1].seq, w[0].seq),
                ));
            }
        }
        let top = buffered.last().map_or(last, |b| b.seq.max(last));
        if seq <= top {
            return Err(bad(
                "seq",
                format!("replayed or out-of-order heartbeat: seq {seq}, last accepted {top}"),
            ));
        }
        let fresh: Vec<&BufferedBeat> = buffered.iter().filter(|b| b.seq > last).collect();
        if let (Some(first), Some(lastb)) = (fresh.first(), fresh.last()) {
            self.partitions.insert(
                id.0,
                Partition {
                    from_ms: first.at_ms,
                    to_ms: lastb.at_ms,
                    heartbeats: fresh.len() as u64,
                },
            );
        }
        let now = self.now();
        self.agents[id.index()] = Some((seq, now.0));
        if self
            .ctl
            .engine
            .node(id)
            .is_some_and(|n| n.state == lattice_engine::NodeState::Degraded)
        {
            let _ = self.input(Input::Node(id, lattice_engine::NodeEvent::HeartbeatResume));
            self.grace_until.remove(&id.0);
        }
        Ok(self.node_state(id))
    }

    /// Every node's name, in inventory order.
    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }

    /// A node's state by name (`ready`, `drained`, ...).
    pub fn node_state_of(&self, name: &str) -> Option<String> {
        self.node_index(name).map(|id| self.node_state(id))
    }

    fn node_state(&self, id: lattice_engine::NodeId) -> String {
        self.ctl
            .engine
            .node(id)
            .map(|n| format!("{:?}", n.state).to_lowercase())
            .unwrap_or_default()
    }

    pub fn next_dag_id(&self) -> String {
        format!("dag-{:04}", self.dags.len() + 1)
    }

    pub fn add_dag(&mut self, id: &str, members: Vec<(String, String)>) {
        self.dags.insert(id.to_string(), members);
    }

    /// New ids start above `n` (ids are never reused, across fail-overs too).
    pub fn ids_above(&mut self, n: u64) {
        self.next = self.next.max(n + 1);
    }

    /// The ids of `names` whose allocations have ended (or are unknown here).
    pub fn ended_among<'a>(&self, names: impl Iterator<Item = &'a String>) -> Vec<String> {
        names
            .filter(|n| {
                self.by_name
                    .get(*n)
                    .and_then(|i| self.ctl.engine.allocation(*i))
                    .is_none_or(|a| a.state.is_terminal())
            })
            .cloned()
            .collect()
    }

    /// Of `deps` (allocation ids), those that ended here but whose end is not known to be on a
    /// majority's copies; each is asked to be recorded there ([`Control::take_settle_wanted`]).
    pub fn unsettled_ends(&mut self, deps: &[String]) -> Vec<String> {
        let out: Vec<String> = deps
            .iter()
            .filter(|d| !self.settled_ends.contains(*d))
            .filter(|d| {
                self.view_named(d)
                    .is_some_and(|v| matches!(v.state.as_str(), "completed" | "failed" | "cancelled"))
            })
            .cloned()
            .collect();
        self.settle_wanted.extend(out.iter().cloned());
        out
    }

    /// These ends are on a majority's copies.
    pub fn ends_settled(&mut self, ids: &[String]) {
        for id in ids {
            self.settle_wanted.remove(id);
            self.settled_ends.insert(id.clone());
        }
    }

    /// The ends dependents wait for, to record on a majority.
    pub fn take_settle_wanted(&mut self) -> Vec<String> {
        self.settle_wanted.iter().cloned().collect()
    }

    /// Forgets a DAG's record (an unacknowledged attempt's, superseded by its retry).
    pub fn remove_dag(&mut self, id: &str) {
        self.dags.remove(id);
    }

    /// The DAGs any of `ids` belongs to, with their members.
    pub fn dags_of(&self, ids: &[String]) -> Vec<(String, Vec<(String, String)>)> {
        self.dags
            .iter()
            .filter(|(_, members)| members.iter().any(|(_, id)| ids.contains(id)))
            .map(|(d, members)| (d.clone(), members.clone()))
            .collect()
    }

    pub fn dag_ids(&self) -> Vec<String> {
        self.dags.keys().cloned().collect()
    }

    pub fn dag(&self, id: &str) -> Option<&Vec<(String, String)>> {
        self.dags.get(id)
    }

    pub fn id_of(&self, name: &str) -> Option<AllocId> {
        self.by_name.get(name).copied()
    }

    pub fn name_of(&self, id: AllocId) -> String {
        self.meta.get(id.index()).map(|m| m.name.clone()).unwrap_or_default()
    }

    /// What the API shows of `name`: a live allocation, or the final record of one that ended
    /// before this control plane took over.
    pub fn view_named(&self, name: &str) -> Option<AllocationView> {
        match self.by_name.get(name) {
            Some(&id) => self.view(id),
            None => self.history.get(name).cloned(),
        }
    }

    /// What the control plane knows for an allocation's diagnostics (`GET .../diagnostics`): its
    /// nodes with their dragonfly groups, network domain and VNI, its declared data, the storage
    /// bandwidth it asked for and its data readiness. `None` for an unknown or forgotten one.
    pub fn diagnostics_facts(&self, name: &str) -> Option<DiagnosticsFacts> {
        let id = *self.by_name.get(name)?;
        let a = self.ctl.engine.allocation(id)?;
        let m = self.meta.get(id.index())?;
        Some(DiagnosticsFacts {
            nodes: a
                .nodes
                .iter()
                .filter_map(|n| {
                    Some((
                        self.node_names[n.index()].clone(),
                        self.ctl.engine.node(*n)?.spec.group.0,
                    ))
                })
                .collect(),
            network_domain: m.network_domain.clone(),
            vni: self.network.vni_of(name),
            data: m.data.clone(),
            storage_gbps: a.spec.storage_gbps,
            data_readiness: self.ctl.engine.data_readiness(id),
        })
    }

    /// The service registry (book: "Service Discovery"): each exposed port of each running allocation
    /// (of `tenant`, when given) on each of its nodes, by service name. Derived from the allocations'
    /// specs and the nodes they hold, it has the same consistency as node ownership: an allocation that
    /// ends or is requeued leaves it at once.
    pub fn services(&self, tenant: Option<&str>) -> BTreeMap<String, Vec<ServiceEndpoint>> {
        let mut out: BTreeMap<String, Vec<ServiceEndpoint>> = BTreeMap::new();
        for a in self.ctl.engine.allocations() {
            let Some(m) = self.meta.get(a.id.index()) else { continue };
            if a.state != AllocState::Running || m.expose.is_empty() {
                continue;
            }
            let t = self.tenant_name(a.spec.tenant);
            if tenant.is_some_and(|w| w != t) {
                continue;
            }
            for n in &a.nodes {
                let node = self.node_names[n.index()].clone();
                let host = self
                    .peer_addr
                    .get(&n.0)
                    .and_then(|addr| addr.parse::<std::net::SocketAddr>().ok())
                    .map_or_else(|| node.clone(), |sa| sa.ip().to_string());
                for e in &m.expose {
                    out.entry(e.name.clone()).or_default().push(ServiceEndpoint {
                        allocation: m.name.clone(),
                        tenant: t.clone(),
                        node: node.clone(),
                        host: host.clone(),
                        port: e.port as u16,
                        protocol: e.protocol.clone().unwrap_or_else(|| "tcp".into()),
                    });
                }
            }
        }
        out
    }

    /// When `name` was submitted (ms since the epoch).
    pub fn submitted_ms(&self, name: &str) -> u64 {
        self.by_name
            .get(name)
            .and_then(|&id| self.ctl.engine.allocation(id))
            .map_or(0, |a| a.submitted.0)
    }

    /// Recovery: `view` ended before this control plane took over (served as is; its id is taken).
    pub fn add_ended(&mut self, view: AllocationView) {
        self.next = self.next.max(id_number(&view.id).map_or(0, |k| k + 1));
        self.history.insert(view.id.clone(), view);
    }

    /// Recovery: the queued `name` was first submitted at `submitted_ms`.
    pub fn resubmitted(&mut self, name: &str, submitted_ms: u64) {
        if let Some(&id) = self.by_name.get(name) {
            let now = self.now();
            let _ = self.ctl.resubmitted(now, id, Time(submitted_ms));
        }
    }

    /// Recovery: the queued `name` still holds `nodes` at the quorum since `since_ms` — its agents
    /// kept running it. It runs there again from that start (with the exits its agents already
    /// reported), its agents are expected to report in (else its nodes time out as usual), and a
    /// simulated agent resumes it.
    pub fn reattach(
        &mut self,
        name: &str,
        nodes: &[String],
        since_ms: u64,
        submitted_ms: u64,
        exits: &BTreeMap<String, i32>,
    ) -> Result<(), String> {
        let id = *self
            .by_name
            .get(name)
            .ok_or_else(|| format!("{name}: not queued here"))?;
        let ids: Vec<lattice_engine::NodeId> = nodes
            .iter()
            .map(|n| {
                self.node_index(n)
                    .ok_or_else(|| format!("{name}: node {n} is not in the inventory"))
            })
            .collect::<Result<_, _>>()?;
        let now = self.now();
        let started = if since_ms == 0 { now } else { Time(since_ms) };
        self.ctl
            .adopt(now, id, &ids, Time(submitted_ms.min(started.0)), started)
            .map_err(|e| format!("{name}: {e}"))?;
        self.join_network(id);
        let reported: BTreeMap<u32, i32> = exits
            .iter()
            .filter_map(|(n, c)| self.node_index(n).map(|i| (i.0, *c)))
            .collect();
        let all = !ids.is_empty() && ids.iter().all(|n| reported.contains_key(&n.0));
        let failed = reported.values().any(|c| *c != 0);
        if !reported.is_empty() {
            self.exits.insert(id, reported);
        }
        for n in &ids {
            // Its silence times out from now; its sequence is unknown here, so its next heartbeat is
            // answered "has not registered" and the agent registers (its sequence restarts with this
            // control plane: an earlier heartbeat delivered again is never taken).
            let slot = &mut self.agents[n.index()];
            if slot.is_none() {
                *slot = Some((SEQ_UNKNOWN, now.0));
            }
        }
        if all || failed {
            // Every node had exited (or one failed) before the end was recorded: it ends now
            // (nobody would run it or report it again).
            self.exits.remove(&id);
            self.completed(
                id,
                if failed {
                    EndReason::ExitFailure
                } else {
                    EndReason::Success
                },
            );
            return Ok(());
        }
        self.resumed.push(id);
        Ok(())
    }

    /// With real agents: `name` may still run on `nodes` (held for it by the quorum, freed at a
    /// take-over); a next start of it waits until their agents show it stopped ([`Control::work`]).
    pub fn stopping_on_nodes(&mut self, name: &str, nodes: &[String]) {
        if !self.real_agents {
            return;
        }
        let Some(&id) = self.by_name.get(name) else { return };
        let ids: Vec<u32> = nodes.iter().filter_map(|n| self.node_index(n)).map(|n| n.0).collect();
        self.stopping_on.entry(id).or_default().extend(ids);
    }

    /// Re-attached allocations whose simulated agents should resume them (once).
    pub fn take_resumed(&mut self) -> Vec<(AllocId, std::time::Duration)> {
        std::mem::take(&mut self.resumed)
            .into_iter()
            .filter_map(|id| self.meta.get(id.index()).map(|m| (id, m.run)))
            .collect()
    }

    /// The final records of allocations that ended before this control plane took over.
    pub fn history(&self) -> impl Iterator<Item = &AllocationView> + '_ {
        self.history.values()
    }

    /// The state the API names. A preempted allocation waits again: `suspended` when it resumes
    /// from its checkpoint, `preempted` when it restarts; `suspending` while its agents stop it.
    fn state_name(&self, id: AllocId, a: &lattice_engine::Allocation) -> &'static str {
        if self.preempting.contains_key(&id) {
            "suspending"
        } else if a.state == AllocState::Pending && a.preempted > 0 {
            if a.resume_from_checkpoint {
                "suspended"
            } else {
                "preempted"
            }
        } else {
            a.state.as_str()
        }
    }

    /// What [`Control::view_named`] says of `name`'s state, end and nodes, without building the
    /// whole view (the simulation's checker reads it for every allocation after every step).
    pub fn brief(&self, name: &str) -> Option<Brief<'_>> {
        match self.by_name.get(name) {
            Some(&id) => {
                let a = self.ctl.engine.allocation(id)?;
                self.meta.get(id.index())?;
                Some(Brief {
                    state: self.state_name(id, a),
                    end_reason: a.end_reason.map(|r| r.as_str()),
                    ended_ms: a.ended.map(|t| t.0),
                    holds_nodes: !a.nodes.is_empty(),
                })
            }
            None => self.history.get(name).map(|v| Brief {
                state: &v.state,
                end_reason: v.end_reason.as_deref(),
                ended_ms: v.ended_ms,
                holds_nodes: !v.nodes.is_empty(),
            }),
        }
    }

    pub fn view(&self, id: AllocId) -> Option<AllocationView> {
        let a = self.ctl.engine.allocation(id)?;
        let m = self.meta.get(id.index())?;
        Some(AllocationView {
            id: m.name.clone(),
            tenant: self.tenant_name(a.spec.tenant),
            vcluster: self
                .ctl
                .engine
                .vcluster(a.spec.vcluster)
                .map(|v| v.name)
                .unwrap_or_default(),
            user: m.user.clone(),
            project: m.project.clone(),
            state: self.state_name(id, a).to_string(),
            nodes: a.nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
            requested_nodes: a.spec.nodes.min,
            walltime_s: a.spec.lifecycle.walltime().map(|w| w.as_secs_f64()),
            preemption_class: a.spec.preemption_class.get(),
            submitted_ms: a.submitted.0,
            started_ms: a.started.map(|t| t.0),
            ended_ms: a.ended.map(|t| t.0),
            end_reason: a.end_reason.map(|r| r.as_str().to_string()),
            entrypoint: m.entrypoint.clone(),
            environment: m.environment.clone(),
            tags: m.tags.clone(),
            last_rejection: m.last_rejection.clone(),
            vni: self.network.vni_of(&m.name),
            data_readiness: self.ctl.engine.data_readiness(id),
            telemetry: m.telemetry.clone(),
            checkpoints: m.checkpoints,
            last_checkpoint_ms: m.last_checkpoint_ms,
            preempted: a.preempted,
            preemption: m.preempted_for.clone(),
            task_group: self.group_view(a),
            waiting: self.waiting_view(id),
            depends_on: a
                .spec
                .depends_on
                .iter()
                .map(|d| DependsIn {
                    reference: self.name_of(d.on),
                    condition: match d.condition {
                        lattice_engine::DependencyCondition::Success => "success",
                        lattice_engine::DependencyCondition::Failure => "failure",
                        lattice_engine::DependencyCondition::Any => "any",
                    }
                    .to_string(),
                })
                .collect(),
        })
    }

    /// Why `id` waits (see [`AllocationView::waiting`]).
    fn waiting_view(&self, id: AllocId) -> Option<serde_json::Value> {
        let w = self.ctl.engine.waiting(id)?;
        let mut v = serde_json::to_value(w).ok()?;
        if let lattice_engine::waiting::Waiting::BehindHead { head } = w {
            v["head"] = serde_json::json!(self.name_of(head));
        }
        v["summary"] = serde_json::json!(w.describe(|a| self.name_of(a), self.now()));
        Some(v)
    }

    /// Every allocation: those that ended before this control plane took over first, then the live
    /// ones in submission order.
    pub fn list(&self) -> Vec<AllocationView> {
        let mut out: Vec<AllocationView> = self.history.values().cloned().collect();
        out.sort_by_key(|v| id_number(&v.id));
        out.extend(self.ctl.engine.allocations().iter().filter_map(|a| self.view(a.id)));
        out
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        (0..self.node_names.len())
            .filter_map(|i| self.node_view(lattice_engine::NodeId(i as u32)))
            .collect()
    }

    pub fn node_view(&self, id: lattice_engine::NodeId) -> Option<NodeView> {
        let n = self.ctl.engine.node(id)?;
        Some(NodeView {
            name: self.node_names[id.index()].clone(),
            state: format!("{:?}", n.state).to_lowercase(),
            owner: n.owner.map(|o| self.name_of(o.alloc)),
            gpu_type: n.spec.capabilities.gpu_type.clone(),
            gpu_count: n.spec.capabilities.gpu_count,
            group: n.spec.group.0,
            fingerprint: self.agent_info.get(&id.0).and_then(|a| a.0.clone()),
            agent_capabilities: self.agent_info.get(&id.0).and_then(|a| a.1.clone()),
            fingerprint_ms: self.fingerprint_ms.get(&id.0).copied(),
            drifted: self.ctl.is_drifted(id),
            last_partition: self.partitions.get(&id.0).copied(),
        })
    }

    /// Registered agents that went quiet: Ready → Degraded after `timeout_ms` without a heartbeat,
    /// Degraded → Down after `grace_ms` more (its allocation requeued or failed by the engine). Returns
    /// the allocations that lost their nodes (to release at the quorum).
    /// Preemptions whose agents never reported how the victim stopped: past the order's own limit
    /// (the checkpoint deadline and the SIGTERM grace, or the grace of a stop or kill) plus
    /// `slack_ms`, every node that did not report is taken to have stopped it without a checkpoint —
    /// what its agent would have reported. A checkpoint order then fails the victim; a stop suspends
    /// it. Its nodes are released either way, so the preemptor does not wait forever.
    pub fn expire_preemptions(&mut self, slack_ms: u64) {
        let now = self.now();
        let overdue: Vec<AllocId> = self
            .preempting
            .iter()
            .filter(|(_, p)| {
                let limit = match p.how {
                    PreemptHow::CheckpointThenStop { deadline } => deadline.0 + lattice_engine::PREEMPT_GRACE.0,
                    PreemptHow::Stop { grace } | PreemptHow::Kill { grace } => grace.0,
                };
                now.0 >= p.at.0 + limit + slack_ms
            })
            .map(|(id, _)| *id)
            .collect();
        for id in overdue {
            let nodes: Vec<u32> = self
                .ctl
                .engine
                .allocation(id)
                .map(|a| a.nodes.iter().map(|n| n.0).collect())
                .unwrap_or_default();
            tracing::warn!(
                "{}: its agents did not report the preemption in time; taken as stopped without a checkpoint",
                self.name_of(id)
            );
            if nodes.is_empty() {
                self.preempting.remove(&id);
                continue;
            }
            let n = nodes.len();
            for node in nodes {
                let reported = self.exits.get(&id).is_some_and(|e| e.contains_key(&node));
                if !reported && (self.preempted_on(id, node, n, false) || !self.preempting.contains_key(&id)) {
                    break;
                }
            }
        }
    }

    pub fn check_agents(&mut self, timeout_ms: u64) {
        use lattice_engine::NodeState;
        let now = self.now();
        for i in 0..self.agents.len() {
            let Some((_, last)) = self.agents[i] else { continue };
            let id = lattice_engine::NodeId(i as u32);
            let Some(state) = self.ctl.engine.node(id).map(|n| n.state) else {
                continue;
            };
            let quiet = now.0.saturating_sub(last);
            let input = match state {
                NodeState::Ready if quiet >= timeout_ms => {
                    Some(Input::Node(id, lattice_engine::NodeEvent::HeartbeatMiss))
                }
                // The grace the controller gave it (by what it runs) is over.
                NodeState::Degraded if self.grace_until.get(&id.0).is_none_or(|&t| now.0 >= t) => {
                    Some(Input::GraceExpired(id))
                }
                _ => None,
            };
            if let Some(input) = input
                && let Err(e) = self.input(input)
            {
                tracing::warn!("node {}: {e}", self.node_names[i]);
            }
        }
    }

    /// An agent's poll: allocations running on `node` that its agent has neither started (`running`)
    /// nor reported, and ones it runs that no longer run there.
    pub fn work(&mut self, node: &str, running: &[String]) -> Result<Work, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let mut w = Work {
            refresh_fingerprint: self.fingerprint_asked.remove(&nid.0),
            ..Work::default()
        };
        // What this node's agent runs now (where each allocation runs, for the start gate below).
        self.unheard.remove(&nid.0);
        let before = self.agent_running.insert(nid.0, running.to_vec()).unwrap_or_default();
        for gone in before.iter().filter(|a| !running.contains(a)) {
            if let Some(on) = self.running_where.get_mut(gone) {
                on.remove(&nid.0);
                if on.is_empty() {
                    self.running_where.remove(gone);
                }
            }
        }
        for a in running {
            self.running_where.entry(a.clone()).or_default().insert(nid.0);
        }
        // This node's agent no longer runs these: their stop here is confirmed.
        let names = &self.meta;
        self.stopping_on.retain(|a, on| {
            let runs_here = names.get(a.index()).is_some_and(|m| running.contains(&m.name));
            if !runs_here {
                on.remove(&nid.0);
            }
            !on.is_empty()
        });
        w.cache = self.caches.take(node);
        let mine = self.ctl.engine.node(nid).and_then(|n| n.owner).map(|o| o.alloc);
        if let Some(id) = mine
            && let Some(a) = self.ctl.engine.allocation(id)
            && a.state == AllocState::Running
        {
            let name = self.name_of(id);
            let reported = self.exits.get(&id).is_some_and(|e| e.contains_key(&nid.0));
            let vni = self.network.vni_of(&name);
            // With a fabric manager, a job on a VNI starts once its CXI service exists.
            let fabric_ready = !self.fabric || vni.is_none() || self.cxi.contains_key(&name);
            let cxi_auth_key = self.cxi.get(&name).map(|c| c.1.clone());
            // A victim being preempted is not started where it does not run yet; a claim whose nodes
            // boot the hardened image starts once they all have.
            let stopping = self.preempting.contains_key(&id) || self.ctl.is_booting(id);
            if self.fresh_starts.contains(&(nid.0, id)) {
                if running.contains(&name) {
                    // An earlier start's process: stopped before this start runs here (else the
                    // node would run the old run as part of the new one, with the old nodes).
                    w.kill.push(name.clone());
                } else if !reported && fabric_ready && !stopping {
                    self.fresh_starts.remove(&(nid.0, id));
                }
            }
            // An earlier run still to be stopped elsewhere (its nodes' agents have not polled since):
            // this start waits for it.
            let down = |n: u32| {
                self.ctl
                    .engine
                    .node(lattice_engine::NodeId(n))
                    .is_some_and(|x| x.state == lattice_engine::NodeState::Down)
            };
            // (A Down node's agent stopped it by its lease.)
            let since = self.now().0.saturating_sub(self.took_over_ms);
            let within_lease =
                |n: u32| since < self.heartbeat_timeout_ms + self.ctl.node_grace(lattice_engine::NodeId(n)).0;
            let stale = self.fresh_starts.contains(&(nid.0, id))
                || self
                    .stopping_on
                    .get(&id)
                    .is_some_and(|on| on.iter().any(|n| *n != nid.0 && !down(*n)))
                // A node outside this start still runs it (an earlier start)...
                || self.running_where.get(&name).is_some_and(|on| {
                    on.iter()
                        .any(|n| !a.nodes.contains(&lattice_engine::NodeId(*n)) && !down(*n))
                })
                // ...or may, not having polled since the take-over, within a predecessor's lease.
                || (self.taken_over.contains(&id)
                    && self.unheard.iter().any(|n| *n != nid.0 && !down(*n) && within_lease(*n)));
            if !reported && !stale && !running.contains(&name) && fabric_ready && !stopping {
                let m = &self.meta[id.index()];
                w.launch.push(Launch {
                    id: name,
                    entrypoint: m.entrypoint.clone().unwrap_or_default(),
                    nodes: a.nodes.iter().map(|n| self.node_names[n.index()].clone()).collect(),
                    task_index: a.nodes.iter().position(|n| *n == nid).unwrap_or(0) as u32,
                    walltime_s: a.spec.lifecycle.walltime().map(|d| d.as_secs_f64()),
                    tenant: self.tenant_name(a.spec.tenant),
                    user: m.user.clone(),
                    project: m.project.clone(),
                    checkpoint: a.spec.checkpoint.mechanism.as_str().into(),
                    vni,
                    cxi_auth_key,
                    restart_from_s: Some(self.ctl.resume_point(id).as_secs_f64()).filter(|s| *s > 0.0),
                    task_group: self.group_view(a),
                    uenv: m.environment.as_ref().and_then(|e| e.uenv.clone()),
                    uenv_view: m.environment.as_ref().and_then(|e| e.view.clone()),
                    image: m.environment.as_ref().and_then(|e| e.image.clone()),
                    launch_token: Some(self.launch_token(&self.name_of(id), a.started.map_or(0, |t| t.0))),
                    agents: a
                        .nodes
                        .iter()
                        .filter_map(|n| Some((self.node_names[n.index()].clone(), self.peer_addr.get(&n.0)?.clone())))
                        .collect(),
                    mounts: m
                        .data
                        .iter()
                        .flat_map(|d| d.mounts.iter())
                        .filter_map(|x| {
                            Some(lattice_agent_protocol::DataMount {
                                source: x.source.clone(),
                                target: x.target.clone()?,
                                read_only: x.access.as_deref() == Some("read-only"),
                            })
                        })
                        .collect(),
                    data_defaults: m.data.as_ref().and_then(|d| d.defaults).unwrap_or(true),
                    checkpoints: a.spec.checkpoint.kind != lattice_engine::CheckpointKind::None,
                    liveness_probe: m.liveness.clone(),
                });
            }
            // Someone follows its output: the agent sends what is new with its next polls.
            let name = self.name_of(id);
            if running.contains(&name) && self.followed.get(&id).is_some_and(|until| *until > self.now().0) {
                w.tail.push(name);
            }
        }
        let mine_name = mine.map(|m| self.name_of(m));
        // A checkpoint hint is handed out once per node (a hint, not a guarantee: the application
        // decides whether and when to checkpoint).
        if let Some(id) = mine
            && let Some(nodes) = self.checkpoint_hints.get_mut(&id)
            && nodes.remove(&nid.0)
        {
            if nodes.is_empty() {
                self.checkpoint_hints.remove(&id);
            }
            if let Some(n) = &mine_name
                && running.contains(n)
            {
                w.checkpoint.push(n.clone());
            }
        }
        // A preemption is handed out once per node, from its start (a reclaim leaves the borrower its
        // grace period first).
        let now = self.now();
        if let Some(id) = mine
            && let Some(name) = mine_name.clone()
            && let Some(how) = self
                .preempting
                .get(&id)
                .filter(|p| p.at <= now && p.to_tell.contains(&nid.0))
                .map(|p| p.how)
        {
            if let Some(p) = self.preempting.get_mut(&id) {
                p.to_tell.remove(&nid.0);
            }
            let wants_checkpoint = matches!(how, PreemptHow::CheckpointThenStop { .. });
            if running.contains(&name) {
                let (how, deadline_s, grace_s) = match how {
                    PreemptHow::CheckpointThenStop { deadline } => ("checkpoint", deadline.as_secs_f64(), 0.0),
                    PreemptHow::Stop { grace } => ("stop", 0.0, grace.as_secs_f64()),
                    PreemptHow::Kill { grace } => ("kill", 0.0, grace.as_secs_f64()),
                };
                w.preempt.push(PreemptWork {
                    id: name,
                    how: how.to_string(),
                    deadline_s,
                    grace_s,
                });
            } else if !self.exits.get(&id).is_some_and(|e| e.contains_key(&nid.0)) {
                // It does not run here (never started): nothing to stop on this node.
                let n = self.ctl.engine.allocation(id).map_or(0, |a| a.nodes.len());
                self.preempted_on(id, nid.0, n, wants_checkpoint);
            }
        }
        // A released claim's node: the agent wipes it with the site's command.
        for (id, wipe) in self.wiping.iter_mut() {
            if wipe.to_tell.remove(&nid.0) {
                w.wipe
                    .push(self.meta.get(id.index()).map(|m| m.name.clone()).unwrap_or_default());
            }
        }
        w.kill
            .extend(running.iter().filter(|r| Some(*r) != mine_name.as_ref()).cloned());
        Ok(w)
    }

    /// What an agent reports with its poll: the outcome of checkpoint hints (broker or operator) on
    /// its node, and of wipes it ran. A hint's outcome reaches the controller once every node of the
    /// allocation reported (or one failed); a wipe's once every wiped node did (any failure
    /// quarantines the claim's nodes).
    pub fn agent_reports(&mut self, node: &str, reports: &AgentReports) -> Result<(), FieldError> {
        let AgentReports {
            checkpointed,
            wiped,
            metrics,
            task_ends,
            tasks_running: _,
            cache_done,
            cache,
        } = reports;
        self.caches.reported(node, cache_done, cache.as_deref());
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let now = self.now().0;
        for e in task_ends {
            self.launches.ended(node, e.clone(), now);
        }
        // A reactive allocation's metric: the mean of its nodes' latest samples goes to the
        // autoscaler (which keeps the evaluation windows).
        for m in metrics {
            let Some(id) = self.id_of(&m.id) else { continue };
            if !m.value.is_finite()
                || self.meta.get(id.index()).and_then(|x| x.metric.as_deref()) != Some(m.name.as_str())
            {
                continue;
            }
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            if a.state != AllocState::Running || !a.nodes.contains(&nid) {
                continue;
            }
            let held: Vec<u32> = a.nodes.iter().map(|n| n.0).collect();
            let samples = self.metric_samples.entry(id).or_default();
            samples.insert(nid.0, m.value);
            samples.retain(|n, _| held.contains(n));
            let mean = samples.values().sum::<f64>() / samples.len() as f64;
            if let Err(e) = self.input(Input::Metric(id, mean)) {
                tracing::warn!("{}: metric not applied: {e}", m.id);
            }
        }
        for o in checkpointed {
            let Some(id) = self.id_of(&o.id) else { continue };
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            if a.state != AllocState::Running || !a.nodes.contains(&nid) {
                continue; // a late report of a run that ended
            }
            let n = a.nodes.len();
            let r = self.hint_reports.entry(id).or_default();
            r.insert(nid.0, o.ok);
            if !o.ok || r.len() == n {
                let ok = r.values().all(|v| *v);
                self.hint_reports.remove(&id);
                self.checkpointed(id, ok);
            }
        }
        // Each node's own outcome: a wiped node returns to the pool, a failed one is quarantined.
        for o in wiped {
            let Some(id) = self.id_of(&o.id) else { continue };
            let reason = (!o.ok).then(|| "the site's wipe command failed".to_string());
            self.wipe_outcome(id, nid, o.ok, reason);
        }
        Ok(())
    }

    /// OpenCHAMI's wipe of `node` for the released claim `name` ended (`reason`: why it failed).
    /// Returns whether that outcome was still awaited.
    pub fn node_wiped(&mut self, name: &str, node: &str, ok: bool, reason: Option<String>) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.wipe_outcome(id, nid, ok, reason)
    }

    /// One node of claim `name` booted the hardened image (`ok`) or failed to: the controller
    /// launches the claim once every node booted, or fails it (the node Down). Whether it was
    /// awaited.
    pub fn node_booted(&mut self, name: &str, node: &str, ok: bool) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.booted(id, nid, ok)
    }

    /// [`Control::node_booted`] by ids (a replay's fake world reports so).
    pub fn booted(&mut self, id: AllocId, node: lattice_engine::NodeId, ok: bool) -> bool {
        if !self.boot_awaited_id(id, node) {
            return false;
        }
        if !ok {
            tracing::warn!(
                "{}: {} failed to boot the hardened image; the node is out (Failed) and the claim fails",
                self.name_of(id),
                self.node_names[node.index()]
            );
        }
        if let Err(e) = self.input(Input::Booted(id, node, ok)) {
            tracing::warn!("{}: boot result not applied: {e}", self.name_of(id));
        }
        if !ok {
            self.tally.boot_failures += 1;
        }
        true
    }

    /// Is `node`'s hardened boot for claim `name` still awaited (not reported, not timed out, the
    /// claim not ended)?
    pub fn boot_awaited(&self, name: &str, node: &str) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.boot_awaited_id(id, nid)
    }

    fn boot_awaited_id(&self, id: AllocId, node: lattice_engine::NodeId) -> bool {
        self.ctl.is_booting(id)
            && self
                .ctl
                .engine
                .allocation(id)
                .is_some_and(|a| a.nodes.contains(&node) && !self.ctl.is_hardened(node))
    }

    /// Is `node`'s wipe for claim `name` still awaited?
    pub fn wipe_awaited(&self, name: &str, node: &str) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.wiping.get(&id).is_some_and(|w| w.waiting.contains(&nid.0))
    }

    /// One node's wipe outcome: the controller returns it to the pool or quarantines it (audited,
    /// with when the wipe started and why it failed).
    fn wipe_outcome(&mut self, id: AllocId, nid: lattice_engine::NodeId, ok: bool, reason: Option<String>) -> bool {
        let Some(w) = self.wiping.get_mut(&id) else {
            return false;
        };
        if !w.waiting.remove(&nid.0) {
            return false; // not this node's wipe, or already reported
        }
        let started_ms = w.started_ms;
        if w.waiting.is_empty() && w.to_tell.is_empty() {
            self.wiping.remove(&id);
        }
        if !ok {
            self.tally.wipe_failures += 1;
        }
        let mut note = format!("{} started_ms={started_ms}", self.node_names[nid.index()]);
        if let Some(r) = &reason {
            note.push_str(&format!(" reason={r}"));
        }
        self.wipe_notes.insert((id, nid.0), note);
        if let Err(e) = self.input(Input::NodeWiped(id, nid, ok)) {
            tracing::warn!(
                "{}: wipe result of {} not applied: {e}",
                self.name_of(id),
                self.node_names[nid.index()]
            );
        }
        true
    }

    /// An operator retries a quarantined node's wipe (book: "Wipe Failure Handling": `lattice admin
    /// node wipe NODE --force`), audited with who asked; the claim whose wipe failed, or why not.
    pub fn retry_wipe(&mut self, node: &str, by: &str) -> Result<String, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let quarantined = self.ctl.quarantined().contains(&nid);
        if !quarantined {
            let state = self.node_state_of(node).unwrap_or_default();
            return Err(bad(
                "id",
                format!("node {node} is not quarantined after a failed wipe (it is {state}): nothing to retry"),
            ));
        }
        self.wipe_notes
            .insert((self.quarantine_claim(nid), nid.0), format!("{node} retried by {by}"));
        self.input(Input::RetryWipe(nid))
            .map_err(|e| bad("id", format!("node {node}: {e}")))?;
        Ok(self.name_of(self.quarantine_claim(nid)))
    }

    /// The claim whose wipe of `node` failed (the last audit of it names it).
    fn quarantine_claim(&self, node: lattice_engine::NodeId) -> AllocId {
        self.ctl.quarantined_by(node).unwrap_or(AllocId(u64::MAX))
    }

    /// A simulated agent's wipe of `nodes` of claim `id` succeeded: the whole claim's at once, or
    /// node by node (an operator's retry of one).
    pub fn simulated_wiped(&mut self, id: AllocId, nodes: &[String]) {
        let whole = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| a.nodes.len() == nodes.len());
        if whole {
            self.wiped(id, true);
        } else {
            let name = self.name_of(id);
            for n in nodes {
                self.node_wiped(&name, n, true, None);
            }
        }
    }

    /// Wipes without an outcome after `timeout_ms` (book: "Wipe Failure Handling", default 30 min):
    /// their nodes are quarantined.
    pub fn expire_wipes(&mut self) {
        let timeout_ms = self.wipe_timeout_ms;
        let now = self.now().0;
        let late: Vec<(AllocId, Vec<u32>)> = self
            .wiping
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.started_ms) >= timeout_ms)
            .map(|(id, w)| (*id, w.waiting.iter().copied().collect()))
            .collect();
        for (id, nodes) in late {
            for n in nodes {
                let why = format!("no wipe confirmation within {} s", timeout_ms / 1000);
                self.wipe_outcome(id, lattice_engine::NodeId(n), false, Some(why));
            }
            if let Some(w) = self.wiping.get_mut(&id) {
                w.to_tell.clear();
            }
            self.wiping.remove(&id);
        }
    }

    /// An agent reports the end of an allocation's process on its node. The allocation ends when one
    /// node fails or is killed at walltime, or when every node exited 0; returns whether it ended now
    /// (so its nodes are released at the quorum).
    /// Keeps the output tail (one stream) an agent reported for `name` on `node`.
    pub fn add_log(&mut self, name: &str, node: &str, stream: Stream, tail: &str) {
        let Some(&id) = self.by_name.get(name) else { return };
        let start = tail.len().saturating_sub(LOG_TAIL_BYTES);
        let start = (start..=tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        self.logs
            .entry(id)
            .or_default()
            .insert((node.to_string(), stream), tail[start..].to_string());
        while self.logs.len() > LOGS_KEPT {
            self.logs.pop_first();
        }
    }

    /// Someone follows `name`'s output: for the next [`FOLLOW_MS`] its agents stream it. Returns the
    /// live output of `stream` after `after` (node → offset; from the oldest kept when a node is
    /// absent).
    pub fn follow(
        &mut self,
        name: &str,
        stream: Stream,
        after: &BTreeMap<String, u64>,
    ) -> Option<BTreeMap<String, LiveOutput>> {
        let id = *self.by_name.get(name)?;
        let until = self.now().0 + FOLLOW_MS;
        self.followed.insert(id, until);
        let mut out = BTreeMap::new();
        let of_stream = self
            .live
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|((_, s), _)| *s == stream);
        for ((node, _), segs) in of_stream {
            let from = after.get(node).copied().unwrap_or(0);
            let mut o = LiveOutput {
                offset: u64::MAX,
                data: String::new(),
                next: from,
            };
            for s in segs.iter().filter(|s| s.next > from) {
                o.offset = o.offset.min(s.offset.max(from));
                // A segment that straddles `from` contributes its part after it (offsets are bytes).
                let skip = from.saturating_sub(s.offset) as usize;
                let start = (skip.min(s.data.len())..=s.data.len())
                    .find(|i| s.data.is_char_boundary(*i))
                    .unwrap_or(s.data.len());
                o.data.push_str(&s.data[start..]);
                o.next = s.next;
            }
            if o.offset == u64::MAX {
                o.offset = from;
            }
            out.insert(node.clone(), o);
        }
        Some(out)
    }

    /// New output from `node`'s agent (kept while followed, the newest [`LIVE_BYTES`] per node).
    pub fn add_output(&mut self, node: &str, output: Vec<OutputIn>) {
        for o in output {
            let Some(&id) = self.by_name.get(&o.id) else { continue };
            let segs = self
                .live
                .entry(id)
                .or_default()
                .entry((node.to_string(), o.stream))
                .or_default();
            if segs.back().is_some_and(|last| o.offset < last.next) {
                continue; // already have it (a resend)
            }
            segs.push_back(o);
            let mut kept: usize = segs.iter().map(|s| s.data.len()).sum();
            while kept > LIVE_BYTES && segs.len() > 1 {
                kept -= segs.pop_front().map_or(0, |s| s.data.len());
            }
        }
        while self.live.len() > LOGS_KEPT {
            self.live.pop_first();
        }
    }

    /// Where the allocation's stored logs are: (tenant, project).
    pub fn log_owner(&self, name: &str) -> Option<(String, Option<String>)> {
        let (id, a) = self.allocation_named(name).ok()?;
        let tenant = self.tenant_name(a.spec.tenant);
        Some((tenant, self.meta[id.index()].project.clone()))
    }

    /// The output tails (of `stream`) reported for `name`, by node.
    pub fn logs(&self, name: &str, stream: Stream) -> Option<BTreeMap<String, String>> {
        let id = self.by_name.get(name)?;
        Some(
            self.logs
                .get(id)
                .into_iter()
                .flatten()
                .filter(|((_, s), _)| *s == stream)
                .map(|((n, _), t)| (n.clone(), t.clone()))
                .collect(),
        )
    }

    pub fn agent_exit(&mut self, name: &str, node: &str, kind: ExitKind, code: i32) -> Result<bool, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("node", format!("no node {node} in the inventory")))?;
        let (id, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running || !a.nodes.contains(&nid) {
            // A late report of a run that already ended or moved: nothing to do.
            return Ok(false);
        }
        let n = a.nodes.len();
        let nodes: Vec<u32> = a.nodes.iter().map(|x| x.0).collect();
        if matches!(kind, ExitKind::Checkpointed | ExitKind::Preempted) {
            return Ok(self.preempted_on(id, nid.0, n, kind == ExitKind::Checkpointed));
        }
        if kind == ExitKind::Prologue {
            // The run ends on every node (the others are told to stop theirs); the engine requeues it
            // away from this node, or fails it once its retries are spent.
            self.exits.remove(&id);
            if let Err(e) = self.input(Input::PrologueFailed(id, nid)) {
                tracing::warn!("{name}: prologue failure not applied: {e}");
                return Ok(false);
            }
            return Ok(true);
        }
        let e = self.exits.entry(id).or_default();
        e.insert(nid.0, code);
        let reason = match kind {
            ExitKind::Fenced => Some(EndReason::NodeFailure),
            // The service stopped answering: an application failure (requeued per its policy).
            ExitKind::Liveness => Some(EndReason::ExitFailure),
            ExitKind::Walltime => Some(EndReason::WalltimeExceeded),
            ExitKind::WalltimeCheckpoint => {
                self.tally.walltime_conflicts += 1;
                Some(EndReason::WalltimeExceeded)
            }
            ExitKind::Exited if code != 0 => Some(EndReason::ExitFailure),
            // Every node of this run exited (exits of other nodes are an earlier run's).
            ExitKind::Exited if nodes.iter().all(|x| e.contains_key(x)) => Some(EndReason::Success),
            ExitKind::Exited | ExitKind::Checkpointed | ExitKind::Preempted | ExitKind::Prologue => None,
        };
        let Some(reason) = reason else { return Ok(false) };
        self.exits.remove(&id);
        Ok(self.completed(id, reason))
    }

    /// A victim's agent stopped it on one node of `n` (`checkpointed`: after its checkpoint was
    /// written). A checkpoint that did not complete fails the victim at once (book: an unresponsive
    /// application is killed and marked failed, not suspended; requeued if its policy allows), as does
    /// a kill; otherwise it is suspended once every node stopped — resuming from the checkpoint when
    /// every node wrote it. Returns whether the allocation ended its run now.
    fn preempted_on(&mut self, id: AllocId, node: u32, n: usize, checkpointed: bool) -> bool {
        let Some(p) = self.preempting.get(&id) else {
            return false; // not being preempted: a late or stray report
        };
        let wants_checkpoint = matches!(p.how, PreemptHow::CheckpointThenStop { .. });
        if matches!(p.how, PreemptHow::Kill { .. }) || (wants_checkpoint && !checkpointed) {
            if wants_checkpoint {
                self.tally.failed_checkpoints += 1;
                self.tally.checkpoints_failed += 1;
            }
            self.exits.remove(&id);
            return self.completed(id, EndReason::PreemptionKilled);
        }
        let e = self.exits.entry(id).or_default();
        e.insert(node, if checkpointed { 0 } else { 1 });
        if e.len() < n {
            return false;
        }
        self.exits.remove(&id);
        self.suspended(id, wants_checkpoint)
    }

    /// A node by name (O(log n): heartbeats of thousands of agents look nodes up constantly).
    pub fn node_index(&self, name: &str) -> Option<lattice_engine::NodeId> {
        self.node_by_name.get(name).map(|&i| lattice_engine::NodeId(i))
    }

    /// Drain (`true`) or undrain a node; the node's state afterwards.
    pub fn drain(&mut self, node: &str, drain: bool) -> Result<String, FieldError> {
        let op = if drain { NodeOp::Drain } else { NodeOp::Undrain };
        self.node_op(node, op).map(|(state, _)| state)
    }

    /// Whether `op` may be applied to `node` now (the node exists and its state allows it): checked
    /// before the order is recorded at the quorum, so a refused operation changes nothing.
    pub fn check_node_op(&self, node: &str, op: NodeOp) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let ev = node_op_event(op);
        let n = self
            .ctl
            .engine
            .node(id)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        if lattice_engine::node::next_node_state(n.state, ev, n.owner.is_some()).is_none() {
            return Err(bad(
                "id",
                format!(
                    "node {node}: event {ev:?} is not allowed in state {}",
                    self.node_state(id)
                ),
            ));
        }
        Ok(())
    }

    /// The quorum's standing order for `node` (drained, disabled), as recorded there.
    pub fn set_admin(&mut self, node: &str, drained: bool, disabled: bool) {
        if let Some(id) = self.node_index(node) {
            if drained || disabled {
                self.admin.insert(id.0, (drained, disabled));
            } else {
                self.admin.remove(&id.0);
            }
        }
    }

    /// Holds the engine to the standing orders: a disabled node is down, a drained node that is up
    /// drains (its agent's registration, an `enable` or a new leader may have brought it back Ready).
    pub fn enforce_admin(&mut self) {
        use lattice_engine::{NodeEvent, NodeState};
        let orders: Vec<(u32, (bool, bool))> = self.admin.iter().map(|(n, o)| (*n, *o)).collect();
        for (n, (drained, disabled)) in orders {
            let id = lattice_engine::NodeId(n);
            let Some(state) = self.ctl.engine.node(id).map(|x| x.state) else {
                continue;
            };
            let ev = if disabled && !matches!(state, NodeState::Down | NodeState::Failed) {
                NodeEvent::HardwareFailure
            } else if drained && matches!(state, NodeState::Ready | NodeState::Degraded) {
                NodeEvent::Drain
            } else {
                continue;
            };
            if let Err(e) = self.input(Input::Node(id, ev)) {
                tracing::warn!("node {}: standing order not applied: {e}", self.node_names[n as usize]);
            }
        }
    }

    /// A node operation; the node's state afterwards and the allocations that lost their nodes
    /// (requeued or failed by a disable: their nodes must be released at the quorum).
    pub fn node_op(&mut self, node: &str, op: NodeOp) -> Result<(String, Vec<String>), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let ev = node_op_event(op);
        let owner = self.ctl.engine.node(id).and_then(|n| n.owner).map(|o| o.alloc);
        self.input(Input::Node(id, ev)).map_err(|e| bad("id", e.to_string()))?;
        // An `enable` of a node an operator drained brings it up drained.
        self.enforce_admin();
        let lost = owner
            .filter(|a| self.ctl.engine.allocation(*a).is_none_or(|a| !a.nodes.contains(&id)))
            .map(|a| self.name_of(a))
            .into_iter()
            .collect();
        Ok((self.node_state(id), lost))
    }

    /// An allocation by its id (`a-000123`), or the "no allocation" error naming the `id` field.
    fn allocation_named(&self, name: &str) -> Result<(AllocId, &lattice_engine::Allocation), FieldError> {
        let id = self.id_of(name);
        id.and_then(|i| self.ctl.engine.allocation(i).map(|a| (i, a)))
            .ok_or_else(|| bad("id", format!("no allocation {name}")))
    }

    /// Applies a `PATCH`: walltime (through the engine, so reservations follow), tags, telemetry mode.
    /// Everything is validated before anything changes.
    pub fn update(&mut self, name: &str, req: &UpdateRequest) -> Result<(), FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if a.state.is_terminal() {
            return Err(bad("state", format!("{name} has ended ({})", a.state.as_str())));
        }
        let now = self.now();
        let walltime = match &req.walltime {
            None => None,
            Some(w) => {
                let d = lattice_traces::parse_walltime(w).map_err(|m| bad("walltime", m))?;
                if a.spec.lifecycle.walltime().is_none() {
                    return Err(bad("walltime", "only a bounded allocation has a walltime"));
                }
                if let Some(t) = a.started
                    && a.state == AllocState::Running
                    && now.since(t) > d
                {
                    return Err(bad(
                        "walltime",
                        format!(
                            "`{w}` is shorter than the {:.0} s already run",
                            now.since(t).as_secs_f64()
                        ),
                    ));
                }
                Some(d)
            }
        };
        if let Some(t) = &req.telemetry
            && !matches!(t.mode.as_str(), "prod" | "debug" | "audit")
        {
            return Err(bad(
                "telemetry.mode",
                format!("`{}`: expected prod, debug or audit", t.mode),
            ));
        }
        if let Some(d) = walltime {
            self.input(Input::Walltime(id, d))
                .map_err(|e| bad("walltime", e.to_string()))?;
        }
        let m = &mut self.meta[id.index()];
        for (k, v) in &req.tags {
            if v.is_empty() {
                m.tags.remove(k);
            } else {
                m.tags.insert(k.clone(), v.clone());
            }
        }
        if let Some(t) = &req.telemetry {
            m.telemetry = t.mode.clone();
        }
        Ok(())
    }

    /// `POST .../checkpoint`: a running allocation's agents are asked to checkpoint (simulated agents
    /// take it at once). Returns the number of checkpoints taken so far.
    pub fn checkpoint(&mut self, name: &str) -> Result<u32, FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running {
            return Err(bad(
                "state",
                format!(
                    "{name} is {}: only a running allocation can checkpoint",
                    a.state.as_str()
                ),
            ));
        }
        let now = self.now();
        // Real agents deliver the hint (SIGUSR1 to the task's process group) at their next poll.
        let nodes: std::collections::BTreeSet<u32> = a.nodes.iter().map(|n| n.0).collect();
        self.checkpoint_hints.insert(id, nodes);
        let m = &mut self.meta[id.index()];
        m.checkpoints += 1;
        m.last_checkpoint_ms = Some(now.0);
        Ok(m.checkpoints)
    }

    /// Node-hours and GPU-hours held in `[since, until)` by allocations matching the filters.
    pub fn usage(&self, tenant: Option<&str>, user: Option<&str>, since: Time, until: Time) -> Usage {
        let mut u = Usage {
            since_ms: since.0,
            until_ms: until.0,
            ..Usage::default()
        };
        for r in self.usage_records(tenant, user, since, until) {
            u.allocations += 1;
            u.node_hours += r.node_hours;
            u.gpu_hours += r.gpu_hours;
        }
        u
    }

    /// Each allocation matching the filters that held nodes in `[since, until)`, in submission order,
    /// with what it used inside the window.
    pub fn usage_records(
        &self,
        tenant: Option<&str>,
        user: Option<&str>,
        since: Time,
        until: Time,
    ) -> Vec<UsageRecord> {
        let mut out = Vec::new();
        for a in self.ctl.engine.allocations() {
            let Some(started) = a.started else { continue };
            let end = a.ended.unwrap_or(until).min(until);
            let start = started.max(since);
            if end <= start {
                continue;
            }
            let t = self.tenant_name(a.spec.tenant);
            let m = &self.meta[a.id.index()];
            if tenant.is_some_and(|w| w != t) || user.is_some_and(|w| Some(w) != m.user.as_deref()) {
                continue;
            }
            let hours = end.since(start).as_secs_f64() / 3600.0;
            let gpus: u32 = a
                .nodes
                .iter()
                .filter_map(|n| self.ctl.engine.node(*n))
                .map(|n| n.spec.capabilities.gpu_count)
                .sum();
            out.push(UsageRecord {
                id: m.name.clone(),
                tenant: t,
                project: m.project.clone().unwrap_or_else(|| "default".into()),
                user: m.user.clone(),
                vcluster: self
                    .ctl
                    .engine
                    .vcluster(a.spec.vcluster)
                    .map(|v| v.name)
                    .unwrap_or_default(),
                state: self.state_name(a.id, a).to_string(),
                nodes: a.nodes.len() as u32,
                gpus,
                started_ms: started.0,
                ended_ms: a.ended.map(|t| t.0),
                node_hours: hours * a.nodes.len() as f64,
                gpu_hours: hours * gpus as f64,
            });
        }
        out
    }

    /// What the accounting pipeline reports ([`crate::accounting`]): every allocation that ran and has
    /// something at or after `since_ms` (its start, end or last checkpoint, or it still runs), with
    /// its GPUs and their type.
    pub fn accounting_rows(&self, since_ms: u64) -> Vec<AccountingRow> {
        let live = self.ctl.engine.allocations().iter().filter(|a| {
            a.started.is_some() && a.ended.is_none_or(|e| e.0 >= since_ms)
                || self.meta[a.id.index()]
                    .last_checkpoint_ms
                    .is_some_and(|c| c >= since_ms)
        });
        let live = live.filter_map(|a| self.view(a.id).map(|v| (v, a.spec.sensitive_claim)));
        let ended = self
            .history
            .values()
            .filter(|v| v.started_ms.is_some() && v.ended_ms.is_none_or(|e| e >= since_ms))
            .map(|v| (v.clone(), false));
        ended
            .chain(live)
            .map(|(view, sensitive)| {
                let nodes = view.nodes.iter().filter_map(|n| self.node_index(n));
                let specs: Vec<_> = nodes.filter_map(|n| self.ctl.engine.node(n)).collect();
                AccountingRow {
                    gpus: specs.iter().map(|n| n.spec.capabilities.gpu_count).sum(),
                    gpu_type: specs.iter().find_map(|n| n.spec.capabilities.gpu_type.clone()),
                    sensitive,
                    view,
                }
            })
            .collect()
    }

    /// Hot-reloads a vCluster's weights: they take effect at its next pass.
    pub fn set_weights(&mut self, vcluster: &str, weights: lattice_engine::CostWeights) -> Result<(), FieldError> {
        let id = *self
            .vclusters
            .get(vcluster)
            .ok_or_else(|| bad("vcluster", format!("vCluster \"{vcluster}\" not found")))?;
        self.input(Input::Weights(id, weights))
            .map_err(|e| bad("weights", e.to_string()))
    }

    pub fn vcluster_names(&self) -> Vec<String> {
        self.vclusters.keys().cloned().collect()
    }

    pub fn tenant_names(&self) -> Vec<String> {
        self.tenants.keys().cloned().collect()
    }

    /// A tenant's contract as the quorum committed it: the engine scores and admits with it from its
    /// next pass (a new tenant is known from now on).
    pub fn set_tenant(&mut self, name: &str, quota: lattice_engine::TenantQuota) {
        let id = self.tenant_id(name);
        if let Err(e) = self.input(Input::TenantQuota(id, quota)) {
            tracing::warn!("tenant {name}: quota not applied: {e}");
        }
    }

    /// A deleted tenant: its quotas are gone and it is no longer listed (its past allocations keep
    /// their tenant's name; a tenant created again under the name starts afresh).
    pub fn remove_tenant(&mut self, name: &str) {
        let Some(&id) = self.tenants.get(name) else { return };
        for p in self.project_names(name) {
            self.remove_project(name, &p);
        }
        if let Err(e) = self.input(Input::TenantQuota(id, lattice_engine::TenantQuota::default())) {
            tracing::warn!("tenant {name}: quota not cleared: {e}");
        }
        self.tenants.remove(name);
    }

    /// A project's contract as the quorum committed it (as a tenant's: from the next pass).
    pub fn set_project(&mut self, tenant: &str, project: &str, quota: lattice_engine::ProjectQuota) {
        let (t, p) = (self.tenant_id(tenant), self.project_id(tenant, project));
        if let Err(e) = self.input(Input::ProjectQuota(p, t, quota)) {
            tracing::warn!("project {tenant}/{project}: quota not applied: {e}");
        }
    }

    /// A deleted project: its quotas are gone (its allocations keep their project's name).
    pub fn remove_project(&mut self, tenant: &str, project: &str) {
        let key = (tenant.to_string(), project.to_string());
        let (Some(&t), Some(&p)) = (self.tenants.get(tenant), self.projects.get(&key)) else {
            return;
        };
        if let Err(e) = self.input(Input::ProjectQuota(p, t, lattice_engine::ProjectQuota::default())) {
            tracing::warn!("project {tenant}/{project}: quota not cleared: {e}");
        }
    }

    /// Allocations of `tenant`'s project still queued or running.
    pub fn project_live_allocations(&self, tenant: &str, project: &str) -> usize {
        let Some(&id) = self.projects.get(&(tenant.to_string(), project.to_string())) else {
            return 0;
        };
        self.ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.project == id && !a.state.is_terminal())
            .count()
    }

    /// One project of a tenant: its contract, what its hard quotas count now, how many of its
    /// allocations wait. `None` when the tenant has never used it and it has no contract.
    pub fn project_view(&self, tenant: &str, project: &str) -> Option<serde_json::Value> {
        let id = *self.projects.get(&(tenant.to_string(), project.to_string()))?;
        let (nodes, running) = self.ctl.engine.project_committed(id);
        let pending = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.project == id && a.state == AllocState::Pending)
            .count();
        Some(serde_json::json!({
            "tenant": tenant,
            "name": project,
            "quota": self.ctl.engine.project_quota(id).copied().unwrap_or_default(),
            "nodes_held": nodes,
            "running": running,
            "pending": pending,
        }))
    }

    /// The projects a tenant has used or given a contract, by name.
    pub fn project_names(&self, tenant: &str) -> Vec<String> {
        self.projects
            .keys()
            .filter(|(t, _)| t == tenant)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Allocations of `name` still queued or running (a tenant is deleted only when there are none).
    pub fn tenant_live_allocations(&self, name: &str) -> usize {
        let Some(&id) = self.tenants.get(name) else { return 0 };
        self.ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.tenant == id && !a.state.is_terminal())
            .count()
    }

    /// One tenant (`GET /v1/tenants/{id}`): its contract (hard and soft quotas), what the hard quotas
    /// count now (nodes held, running allocations), how many wait, and its usage over the last 90 days
    /// (the budget period).
    pub fn tenant_view(&self, name: &str) -> Option<serde_json::Value> {
        let id = *self.tenants.get(name)?;
        let (nodes, running) = self.ctl.engine.tenant_committed(id);
        let pending = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.tenant == id && a.state == AllocState::Pending)
            .count();
        let until = self.now();
        let since = Time(until.0.saturating_sub(90 * 86_400_000));
        Some(serde_json::json!({
            "name": name,
            "quota": self.ctl.engine.tenant_quota(id).copied().unwrap_or_default(),
            "nodes_held": nodes,
            "running": running,
            "pending": pending,
            "usage_90d": self.usage(Some(name), None, since, until),
            "projects": self
                .project_names(name)
                .iter()
                .filter_map(|p| self.project_view(name, p))
                .collect::<Vec<_>>(),
        }))
    }

    /// Hard node quotas, by tenant name (tenants that have one).
    pub fn node_quotas(&self) -> Vec<(String, u32)> {
        self.tenants
            .iter()
            .filter_map(|(name, id)| Some((name.clone(), self.ctl.engine.tenant_quota(*id)?.max_nodes?)))
            .collect()
    }

    /// When each registered node's agent was last heard from (ms since the epoch), by node name.
    pub fn last_heard(&self) -> Vec<(String, u64)> {
        self.agents
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((self.node_names.get(i)?.clone(), a.as_ref()?.1)))
            .collect()
    }

    /// Whether checkpoint storage is up (as last reported).
    /// The electricity price now, from the profile's price series (f7); `None` without one.
    pub fn energy_price_now(&self) -> Option<f64> {
        let now = self.now();
        self.ctl
            .engine
            .config()
            .energy_prices
            .iter()
            .take_while(|(from, _)| *from <= now)
            .last()
            .or(self.ctl.engine.config().energy_prices.first())
            .map(|(_, p)| *p)
    }

    pub fn checkpoint_storage_available(&self) -> bool {
        self.ctl.engine.storage_available()
    }
}

impl SubmitRequest {
    fn constraints_opt(&self) -> Option<ConstraintsIn> {
        self.resources.constraints.clone()
    }
}

/// `sleep 30` → 30 s (simulated agents "run" sleep entrypoints for their duration).
/// How long `sleep N` runs, for simulated agents: N seconds when it is a number from 0 to a year
/// (anything else — negative, NaN, absurdly long — is not a duration to simulate; the default applies).
/// The fuzz test found `sleep -1e308` panicking the control plane here.
fn sleep_seconds(entrypoint: Option<&str>) -> Option<std::time::Duration> {
    let words: Vec<&str> = entrypoint?.split_whitespace().collect();
    match words[..] {
        ["sleep", n] => n
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.0..=366.0 * 86_400.0).contains(s))
            .map(std::time::Duration::from_secs_f64),
        _ => None,
    }
}

#[cfg(test)]
mod sleep_tests {
    use super::sleep_seconds;

    #[test]
    fn only_sensible_sleeps_are_simulated() {
        assert_eq!(
            sleep_seconds(Some("sleep 0.3")),
            Some(std::time::Duration::from_millis(300))
        );
        for odd in [
            "sleep -1",
            "sleep -1e308",
            "sleep NaN",
            "sleep inf",
            "sleep 1e308",
            "sleep x",
        ] {
            assert_eq!(sleep_seconds(Some(odd)), None, "{odd}");
        }
    }
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

/// A victim's preemption in progress.
#[derive(Clone, Debug)]
struct Preempting {
    how: PreemptHow,
    /// When the sequence starts (a reclaim's grace period later).
    at: Time,
    /// Nodes whose agent has not been told yet.
    to_tell: std::collections::BTreeSet<u32>,
}

/// A released claim's wipe on real agents.
#[derive(Clone, Debug)]
struct Wiping {
    to_tell: std::collections::BTreeSet<u32>,
    /// Nodes whose outcome has not been reported yet.
    waiting: std::collections::BTreeSet<u32>,
    /// When the wipe started (ms since the epoch).
    started_ms: u64,
}

/// What an agent reports with a poll besides what it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentReports {
    /// Outcomes of checkpoint hints on its node.
    pub checkpointed: Vec<Outcome>,
    /// Outcomes of wipes it ran.
    pub wiped: Vec<Outcome>,
    /// Scaling-metric samples of allocations on its node.
    pub metrics: Vec<MetricIn>,
    /// Task launches that ended on its node.
    pub task_ends: Vec<crate::tasks::TaskEndIn>,
    /// Task launches that run on its node now.
    pub tasks_running: Vec<String>,
    /// Outcomes of image cache orders, and the cache's contents when they changed.
    pub cache_done: Vec<crate::cache::CacheOutcome>,
    pub cache: Option<Vec<crate::cache::CachedImage>>,
}

/// How many allocations' output tails the control plane keeps (the full logs stay on the nodes).
pub const LOGS_KEPT: usize = 1000;
/// The most of one node's output an exit report carries.
pub const LOG_TAIL_BYTES: usize = 64 * 1024;

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
