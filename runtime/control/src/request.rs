//! What a submission, an update or a telemetry report may say, and the rules each field is checked
//! against.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// never | on_node_failure (the default) | always: whether it is queued again when its run is
    /// lost (a node failed under it) or whenever it ends without success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<String>,
    /// At most this many requeues (default 3, at most 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requeues: Option<i64>,
    /// Allocations naming the same mutex never run at once (also `depends_on: [{"ref": NAME,
    /// "condition": "mutex"}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutex: Option<String>,
    /// Storage bandwidth it needs while it runs, GB/s (the scheduler keeps the sum within the
    /// storage system's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_gbps: Option<f64>,
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
    /// A second uenv with the user's tools (profilers such as nsight or darshan), `name/version:tag`,
    /// mounted read-only at `/user-tools` beside the application's, without touching its
    /// environment (book: "Application Profiling Integration").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_uenv: Option<String>,
    /// An OCI image reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The uenvs are mounted only when their images' signatures verify with the site's uenv
    /// signing key (book: "Software Delivery", `sign_required: true`); an unsigned or wrongly
    /// signed image is a prologue failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sign_required: bool,
}

/// Longest uenv name.
pub const MAX_UENV_NAME: usize = 200;

/// `name/version:tag`: the agent's rule for a name it can map to the registry and the cache
/// ([`lattice_agent_protocol::uenv_layout`]), at most [`MAX_UENV_NAME`] bytes.
pub fn valid_uenv_name(s: &str) -> bool {
    s.len() <= MAX_UENV_NAME && lattice_agent_protocol::uenv_layout(s).is_ok()
}

/// Refuses an `environment` block this control plane cannot run, naming the field.
pub(crate) fn check_environment(e: &EnvironmentIn) -> Result<(), FieldError> {
    if e.sign_required && e.uenv.is_none() && e.tools_uenv.is_none() {
        return Err(bad(
            "environment.sign_required",
            "signatures are checked on uenv images: name one (environment.uenv)",
        ));
    }
    if let Some(t) = &e.tools_uenv
        && !valid_uenv_name(t)
    {
        return Err(bad(
            "environment.tools_uenv",
            format!("{t:?}: expected name/version:tag (letters, digits, . _ + -)"),
        ));
    }
    if let Some(image) = &e.image {
        if e.tools_uenv.is_some() {
            return Err(bad(
                "environment.tools_uenv",
                "tools mount beside a uenv; a container image brings its own",
            ));
        }
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

/// An agent's heartbeat sequence that this control plane does not know (a node it took over holding
/// a re-attached allocation, before the agent registers with it).
pub(crate) const SEQ_UNKNOWN: u64 = u64::MAX;

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
    /// Where the job wants it (default: where it is; `hot` asks for pre-staging).
    #[serde(default)]
    pub tier_hint: Option<String>,
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
    /// `grpc` only: the loopback port the application serves its checkpoint callback on
    /// (`lattice submit --checkpoint=grpc --checkpoint-port=9999`); the agent calls
    /// `127.0.0.1:PORT` unless the application writes another endpoint to its endpoint file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DependsIn {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default = "success")]
    pub condition: String,
}

pub(crate) fn success() -> String {
    "success".into()
}

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub nodes: NodesIn,
    #[serde(default)]
    pub constraints: Option<ConstraintsIn>,
}

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NodesIn {
    Exact(i64),
    Range { min: i64, max: i64 },
}

/// `nodes` is a whole number or `{"min", "max"}`; anything else is refused saying so (serde's own
/// untagged refusal names no rule).
impl<'de> Deserialize<'de> for NodesIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodesIn, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        let whole = |x: &serde_json::Value| x.as_i64();
        let range = v.as_object().filter(|o| o.len() == 2).and_then(|o| {
            Some(NodesIn::Range {
                min: whole(o.get("min")?)?,
                max: whole(o.get("max")?)?,
            })
        });
        match (whole(&v), range) {
            (Some(n), _) => Ok(NodesIn::Exact(n)),
            (None, Some(r)) => Ok(r),
            _ => Err(D::Error::custom(format!(
                "field `resources.nodes`: a whole number of nodes, or {{\"min\": N, \"max\": M}} with whole numbers; got {v}"
            ))),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstraintsIn {
    pub gpu_type: Option<String>,
    pub gpu_count: Option<u32>,
    #[serde(default)]
    pub features: Vec<String>,
    /// The topology hint: `tight` (pack into the fewest dragonfly groups; with a topology weight
    /// the job may wait for a better placement) or `any` (never waits for topology).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// At least this many CPU cores per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<u32>,
    /// At least this much memory per node, GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<u32>,
    /// Nodes with unified CPU-GPU memory only (GH200, MI300A).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_unified_memory: bool,
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

pub(crate) fn bounded() -> String {
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

pub(crate) fn bad(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
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

impl SubmitRequest {
    /// The request in the one request model ([`lattice_traces::request`]), which checks it.
    pub(crate) fn request(&self) -> Result<lattice_traces::request::Request, FieldError> {
        use lattice_traces::request::{CheckpointAsked, ConstraintsAsked, MountAsked, NodesAsked, Request};
        let lifecycle = self
            .lifecycle
            .as_ref()
            .map(|l| {
                serde_json::to_value(l)
                    .and_then(serde_json::from_value::<lattice_traces::request::LifecycleIn>)
                    .map_err(|e| bad("lifecycle", e.to_string()))
            })
            .transpose()?;
        let c = self.resources.constraints.clone().unwrap_or_default();
        Ok(Request {
            tenant: Some(self.tenant.clone()),
            project: self.project.clone(),
            vcluster: self.vcluster.clone(),
            nodes: match self.resources.nodes {
                NodesIn::Exact(n) => NodesAsked::Exact(n),
                NodesIn::Range { min, max } => NodesAsked::Range { min, max },
            },
            constraints: ConstraintsAsked {
                gpu_type: c.gpu_type,
                gpu_count: c.gpu_count,
                cpu_cores: c.cpu_cores,
                memory_gb: c.memory_gb,
                features: c.features,
                require_unified_memory: c.require_unified_memory,
                topology: c.topology,
            },
            walltime: None,
            lifecycle,
            preemption_class: self.preemption_class,
            checkpoint: self.checkpoint.as_ref().map(|c| CheckpointAsked {
                strategy: c.strategy.clone(),
                estimated_minutes: c.estimated_minutes,
                mechanism: c.mechanism.clone(),
            }),
            depends_on: self
                .depends_on
                .iter()
                .map(|d| (d.reference.clone(), d.condition.clone()))
                .collect(),
            mutex: self.mutex.clone(),
            storage_gbps: self.storage_gbps,
            requeue: self.requeue.clone(),
            max_requeues: self.max_requeues,
            mounts: self
                .data
                .iter()
                .flat_map(|d| d.mounts.iter())
                .map(|m| MountAsked {
                    source: m.source.clone(),
                    size_gb: m.size_gb,
                    tier: m.tier.clone(),
                    tier_hint: m.tier_hint.clone(),
                })
                .collect(),
            network_domain: self.connectivity.as_ref().and_then(|c| c.network_domain.clone()),
            sensitive: self.sensitive,
        })
    }
}

/// A refusal of the one request model, named as the API's body names the field (node counts and
/// constraints sit under `resources`; the walltime in `lifecycle`).
pub(crate) fn api_field(e: lattice_traces::request::RequestError) -> FieldError {
    let field = if e.field == "nodes" || e.field.starts_with("constraints.") {
        format!("resources.{}", e.field)
    } else if e.field == "walltime" {
        "lifecycle.walltime".to_string()
    } else {
        e.field
    };
    FieldError {
        field,
        message: e.message,
    }
}

/// `sleep 30` → 30 s (simulated agents "run" sleep entrypoints for their duration).
/// How long `sleep N` runs, for simulated agents: N seconds when it is a number from 0 to a year
/// (anything else — negative, NaN, absurdly long — is not a duration to simulate; the default applies).
/// The fuzz test found `sleep -1e308` panicking the control plane here.
pub(crate) fn sleep_seconds(entrypoint: Option<&str>) -> Option<std::time::Duration> {
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
