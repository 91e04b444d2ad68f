//! The JSONL event log (book: "Using RM-Replay", step 1), one event per line:
//!
//! ```text
//! {"ts": "2026-03-01T00:00:01Z", "type": "submit", "alloc": {"id": "abc-123", "nodes": 64, "gpu_type": "GH200", "walltime": "72h", "tenant": "physics", "priority": 4}}
//! {"ts": "2026-03-01T00:00:05Z", "type": "complete", "alloc_id": "abc-123", "duration": "68h", "exit": 0}
//! ```
//!
//! `ts` is RFC 3339 or a number of seconds; virtual time 0 is the earliest `ts` of the file. The `submit`
//! payload takes the scheduling-relevant fields of the Intent API request; unknown fields and unknown
//! event types are errors naming the line. Bad lines are skipped and counted, never fatal.

pub(crate) use crate::request::{DurationValue, LifecycleIn, duration_value, walltime_value};
use crate::workload::{TraceEventKind, TraceJob, Workload};
use lattice_engine::{DependencyCondition, Duration, TenantId, Time, VClusterId};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Event types this version reads.
pub const EVENT_TYPES: &[&str] = &[
    "submit",
    "dag",
    "complete",
    "claim",
    "release",
    "node_fail",
    "node_recover",
    "drain",
    "undrain",
    "drift",
    "conform",
    "energy_price",
    "storage_outage",
    "storage_recover",
    "metric",
    "load_curve",
    "prologue_fail",
    "cancel",
    "walltime",
    "weights",
    "vcluster",
    "wipe_retry",
    "node_added",
    "node_capabilities",
    "checkpoint_bandwidth",
    "gpu_memory",
    "settings",
];

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Ts {
    Secs(f64),
    Text(String),
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum Nodes {
    Exact(u32),
    Range { min: u32, max: u32 },
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConstraintsIn {
    gpu_type: Option<String>,
    gpu_count: Option<u32>,
    cpu_cores: Option<u32>,
    memory_gb: Option<u32>,
    #[serde(default)]
    features: Vec<String>,
    /// The topology hint: `tight` or `any`.
    topology: Option<String>,
    #[serde(default)]
    require_unified_memory: bool,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointIn {
    strategy: String,
    estimated_minutes: Option<f64>,
    /// signal | shmem | grpc | dmtcp
    mechanism: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct DependsIn {
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    #[serde(default = "default_condition")]
    pub(crate) condition: String,
}

fn default_condition() -> String {
    "success".into()
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitIn {
    pub(crate) id: Option<String>,
    pub(crate) tenant: Option<String>,
    pub(crate) project: Option<String>,
    pub(crate) vcluster: Option<String>,
    pub(crate) nodes: Nodes,
    pub(crate) gpu_type: Option<String>,
    pub(crate) constraints: Option<ConstraintsIn>,
    pub(crate) walltime: Option<DurationValue>,
    pub(crate) lifecycle: Option<LifecycleIn>,
    /// Priority class 0-10 (the seed's example calls it `priority`).
    #[serde(alias = "priority")]
    pub(crate) preemption_class: Option<u8>,
    pub(crate) checkpoint: Option<CheckpointIn>,
    #[serde(default)]
    pub(crate) depends_on: Vec<DependsIn>,
    /// Actual run time, when the trace carries it on the submit instead of a `complete` event.
    pub(crate) duration: Option<DurationValue>,
    /// Storage bandwidth needed while running, GB/s.
    pub(crate) storage_gbps: Option<f64>,
    /// The user identity (required for sensitive claims).
    pub(crate) user: Option<String>,
    /// never | on_node_failure | always
    pub(crate) requeue: Option<String>,
    pub(crate) max_requeues: Option<u32>,
    /// A task group (job array): `range` of indices and a `concurrency` limit.
    pub(crate) task_group: Option<TaskGroupIn>,
    /// Data mounts (the request's `data` block).
    pub(crate) data: Option<DataIn>,
    /// Singleton: allocations with the same mutex never run at once.
    pub(crate) mutex: Option<String>,
    /// The request's `connectivity` block: the network domain it joins.
    pub(crate) connectivity: Option<ConnectivityIn>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectivityIn {
    pub(crate) network_domain: Option<String>,
    /// Services the allocation exposes: not modelled by a replay (accepted, ignored).
    #[allow(dead_code)]
    #[serde(default)]
    pub(crate) expose: Vec<serde_json::Value>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct DataIn {
    #[serde(default)]
    mounts: Vec<MountIn>,
    #[allow(dead_code)]
    defaults: Option<bool>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct MountIn {
    source: String,
    #[allow(dead_code)]
    target: Option<String>,
    #[allow(dead_code)]
    access: Option<String>,
    tier_hint: Option<String>,
    /// Dataset size, GB (needed to simulate staging).
    size_gb: Option<f64>,
    /// Where the dataset is now: hot, warm (default) or cold.
    tier: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskGroupIn {
    pub(crate) range: RangeIn,
    pub(crate) concurrency: Option<u32>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(crate) struct RangeIn {
    pub(crate) start: u32,
    pub(crate) end: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DagEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) dag: DagIn,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DagIn {
    pub(crate) id: String,
    pub(crate) allocations: Vec<SubmitIn>,
}

#[derive(Deserialize)]
pub(crate) struct EventHead {
    pub(crate) ts: Ts,
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc: SubmitIn,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) node: String,
    /// For node_fail: `hardware` (default) or `heartbeat`.
    pub(crate) mode: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeAddedIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// An inventory node entry.
    pub(crate) node: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PriceEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) price: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc_id: String,
    #[allow(dead_code)]
    pub(crate) metric: Option<String>,
    pub(crate) value: f64,
}

/// A synthetic load for a reactive allocation: demand (in nodes) `base + amplitude·sin(2π·t/period)`
/// plus seeded uniform noise of ±`noise`, sampled every `interval` for `duration`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadCurveEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc_id: String,
    pub(crate) base: f64,
    #[serde(default)]
    pub(crate) amplitude: f64,
    pub(crate) period: Option<DurationValue>,
    pub(crate) interval: Option<DurationValue>,
    pub(crate) duration: DurationValue,
    #[serde(default)]
    pub(crate) noise: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BareEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) claim: SubmitIn,
}

/// `weights`: a vCluster's new cost weights (all nine, each >= 0).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WeightsEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) vcluster: String,
    pub(crate) weights: lattice_engine::CostWeights,
}

/// `checkpoint_bandwidth` (`gbps`): the checkpoint store's measured write bandwidth; `gpu_memory`
/// (`node`, `gb`): the memory of each of the node's GPUs as its agent reported it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BrokerEventIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) gbps: Option<f64>,
    pub(crate) node: Option<String>,
    pub(crate) gb: Option<f64>,
}

/// `node_capabilities`: what a node's agent discovered where the inventory leaves its GPUs, cores
/// or memory unset (as the quorum recorded it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeCapabilitiesIn {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) node: String,
    pub(crate) capabilities: lattice_engine::DiscoveredCapabilities,
}

/// `vcluster`: a vCluster's scheduler configuration (its keys; those given change).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VClusterEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) vcluster: String,
    pub(crate) config: serde_json::Map<String, serde_json::Value>,
}

/// `settings`: the site settings in force from this time on (seconds by key).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) settings: serde_json::Map<String, serde_json::Value>,
}

/// `cancel` (`alloc_id`) or `walltime` (`alloc_id`, `walltime`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc_id: String,
    pub(crate) walltime: Option<DurationValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteEvent {
    #[allow(dead_code)]
    pub(crate) ts: Ts,
    #[allow(dead_code)]
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) alloc_id: String,
    pub(crate) duration: DurationValue,
    #[serde(default)]
    pub(crate) exit: i64,
}

/// DAG validation at submission: size limit, duplicate ids, references inside the DAG, no cycles.
/// Returns the allocations in a topological order (ties by position).
pub(crate) fn validate_dag(dag: &DagIn, max_size: usize) -> Result<Vec<usize>, String> {
    let n = dag.allocations.len();
    if n > max_size {
        return Err(format!("DAG exceeds maximum size ({n} allocations, limit: {max_size})"));
    }
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, a) in dag.allocations.iter().enumerate() {
        let Some(id) = a.id.as_deref() else {
            return Err(format!("DAG {}: allocation {i} has no id", dag.id));
        };
        if ids.insert(id, i).is_some() {
            return Err(format!("DAG {}: duplicate allocation id `{id}`", dag.id));
        }
    }
    let mut indegree = vec![0usize; n];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, a) in dag.allocations.iter().enumerate() {
        for d in &a.depends_on {
            if d.condition == "mutex" {
                continue;
            }
            let Some(&j) = ids.get(d.reference.as_str()) else {
                return Err(format!(
                    "DAG {}: `{}` depends on `{}`, which is not an allocation of the DAG",
                    dag.id,
                    a.id.as_deref().unwrap_or(""),
                    d.reference
                ));
            };
            indegree[i] += 1;
            out[j].push(i);
        }
    }
    // Kahn's algorithm, smallest index first (deterministic).
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &k in &out[i] {
            indegree[k] -= 1;
            if indegree[k] == 0 {
                ready.insert(k);
            }
        }
    }
    if order.len() < n {
        let stuck: Vec<&str> = (0..n)
            .filter(|&i| indegree[i] > 0)
            .filter_map(|i| dag.allocations[i].id.as_deref())
            .collect();
        return Err(format!("DAG {}: dependency cycle among {}", dag.id, stuck.join(", ")));
    }
    Ok(order)
}

/// A dependency as written: the referenced id (a job, or a task group by its name) and the condition;
/// `None` is `corresponding` (element-wise between task groups).
pub(crate) type Deps = Vec<(String, Option<DependencyCondition>)>;

/// The book's limit on one DAG, for every way a DAG arrives (a trace, the API).
pub const MAX_DAG_SIZE: usize = 1000;

pub(crate) fn submit_job(
    w: &mut Workload,
    a: SubmitIn,
    line: u64,
    claim: bool,
) -> Result<(TraceJob, Deps), (String, String)> {
    let f = |name: &str, m: String| (format!("alloc.{name}"), m);
    let runtime = a
        .duration
        .as_ref()
        .map(duration_value)
        .transpose()
        .map_err(|m| f("duration", m))?;
    let id = a.id.clone();
    let user = a.user.clone();
    let req = a.request(claim);
    let mut names = TraceNames { w, deps: Vec::new() };
    let spec = crate::request::alloc_spec(&req, crate::request::Origin::History, &mut names)
        .map_err(|e| f(&e.field, e.message))?;
    Ok((
        TraceJob {
            id: id.unwrap_or_else(|| format!("line-{line}")),
            submit: Time::ZERO,
            runtime,
            exit_ok: true,
            spec: spec.into(),
            deps: Vec::new(),
            line,
            names: user.map(|user| {
                Box::new(crate::workload::JobNames {
                    user: Some(user),
                    ..Default::default()
                })
            }),
        },
        names.deps,
    ))
}

impl SubmitIn {
    /// The request this submission makes (a `claim` event's is a sensitive claim).
    pub(crate) fn request(self, claim: bool) -> crate::request::Request {
        use crate::request::{CheckpointAsked, ConstraintsAsked, MountAsked, NodesAsked, Request};
        let c = self.constraints.unwrap_or_default();
        Request {
            tenant: self.tenant,
            project: self.project,
            vcluster: self.vcluster,
            nodes: match self.nodes {
                Nodes::Exact(n) => NodesAsked::Exact(n.into()),
                Nodes::Range { min, max } => NodesAsked::Range {
                    min: min.into(),
                    max: max.into(),
                },
            },
            constraints: ConstraintsAsked {
                gpu_type: self.gpu_type.or(c.gpu_type),
                gpu_count: c.gpu_count,
                cpu_cores: c.cpu_cores,
                memory_gb: c.memory_gb,
                features: c.features,
                require_unified_memory: c.require_unified_memory,
                topology: c.topology,
            },
            walltime: self.walltime,
            lifecycle: self.lifecycle,
            preemption_class: self.preemption_class.map(i64::from),
            checkpoint: self.checkpoint.map(|c| CheckpointAsked {
                strategy: c.strategy,
                estimated_minutes: c.estimated_minutes,
                mechanism: c.mechanism,
            }),
            depends_on: self
                .depends_on
                .into_iter()
                .map(|d| (d.reference, d.condition))
                .collect(),
            mutex: self.mutex,
            storage_gbps: self.storage_gbps,
            requeue: self.requeue,
            max_requeues: self.max_requeues.map(i64::from),
            mounts: self
                .data
                .map(|d| d.mounts)
                .unwrap_or_default()
                .into_iter()
                .map(|m| MountAsked {
                    source: m.source,
                    size_gb: m.size_gb,
                    tier: m.tier,
                    tier_hint: m.tier_hint,
                })
                .collect(),
            network_domain: self.connectivity.and_then(|c| c.network_domain),
            sensitive: claim,
        }
    }
}

/// A trace's names: interned as they come; dependencies resolved once the trace is read whole; a
/// mount whose tier the trace does not give is on the warm tier.
struct TraceNames<'a> {
    w: &'a mut Workload,
    deps: Deps,
}

impl crate::request::Names for TraceNames<'_> {
    fn tenant(&mut self, name: &str) -> TenantId {
        TenantId(self.w.tenants.intern(name))
    }
    fn project(&mut self, tenant: &str, name: &str) -> lattice_engine::ProjectId {
        self.w.intern_project(tenant, name)
    }
    fn vcluster(&mut self, name: Option<&str>) -> Result<VClusterId, String> {
        Ok(VClusterId(self.w.vclusters.intern(name.unwrap_or("default"))))
    }
    fn cluster_nodes(&self) -> Option<u32> {
        None
    }
    fn dependency(
        &mut self,
        reference: &str,
        condition: crate::request::Condition,
    ) -> Result<Option<lattice_engine::Dependency>, String> {
        self.deps.push((reference.to_string(), condition.engine()));
        Ok(None)
    }
    fn located(&mut self, _source: &str, _hint: Option<lattice_engine::Tier>) -> lattice_engine::Tier {
        lattice_engine::Tier::Warm
    }
}

pub(crate) fn ts_millis(ts: &Ts) -> Result<i64, String> {
    match ts {
        Ts::Secs(s) if s.is_finite() && *s >= 0.0 && *s <= crate::duration::MAX_TIMESTAMP_S => {
            Ok((s * 1000.0).round() as i64)
        }
        Ts::Secs(s) if s.is_finite() && *s > crate::duration::MAX_TIMESTAMP_S => {
            Err(format!("timestamp {s} is after the year 9999"))
        }
        Ts::Secs(s) => Err(format!("timestamp {s} must be a non-negative number of seconds")),
        Ts::Text(t) => {
            let st = humantime::parse_rfc3339_weak(t).map_err(|e| format!("`{t}` is not an RFC 3339 time: {e}"))?;
            let d = st
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| format!("`{t}` is before 1970"))?;
            i64::try_from(d.as_millis()).map_err(|_| format!("`{t}` is out of range"))
        }
    }
}

/// Checks a `load_curve` event's numbers (errors name the field).
pub(crate) fn load_curve(e: LoadCurveEventIn) -> Result<TraceEventKind, (String, String)> {
    let bad = |f: &str, m: String| (f.to_string(), m);
    for (f, v) in [("base", e.base), ("amplitude", e.amplitude), ("noise", e.noise)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(bad(f, format!("must be a non-negative number, got {v}")));
        }
    }
    let dur = |v: &Option<DurationValue>, f: &str, default: Duration| -> Result<Duration, (String, String)> {
        v.as_ref()
            .map_or(Ok(default), |d| duration_value(d).map_err(|m| bad(f, m)))
    };
    let period = dur(&e.period, "period", Duration::from_hours(24))?;
    let interval = dur(&e.interval, "interval", Duration::from_secs(30))?;
    let duration = duration_value(&e.duration).map_err(|m| bad("duration", m))?;
    if period == Duration::ZERO {
        return Err(bad("period", "must be positive".into()));
    }
    if interval < Duration::from_secs(1) {
        return Err(bad("interval", "must be at least 1s".into()));
    }
    if duration.0 / interval.0 > 1_000_000 {
        return Err(bad(
            "duration",
            format!(
                "{} samples (duration / interval) exceed the limit of 1000000",
                duration.0 / interval.0
            ),
        ));
    }
    Ok(TraceEventKind::LoadCurve {
        alloc: e.alloc_id,
        base: e.base,
        amplitude: e.amplitude,
        period,
        interval,
        duration,
        noise: e.noise,
    })
}

/// The field serde complained about, when its message names one.
pub(crate) fn field_of(e: &serde_json::Error) -> Option<String> {
    let m = e.to_string();
    let start = m.find('`')? + 1;
    let end = start + m[start..].find('`')?;
    Some(m[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonl_parse::parse_jsonl;
    use lattice_engine::NodeRange;

    #[test]
    fn weight_changes_are_events() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": "1h"}}
{"ts": 60, "type": "weights", "vcluster": "hpc", "weights": {"priority": 0.5, "wait_time": 0.5, "fair_share": 0, "topology": 0, "data_readiness": 0, "backlog": 0, "energy": 0, "checkpoint": 0, "conformance": 0}}
{"ts": 61, "type": "weights", "vcluster": "hpc", "weights": {"priority": -1, "wait_time": 0.5, "fair_share": 0, "topology": 0, "data_readiness": 0, "backlog": 0, "energy": 0, "checkpoint": 0, "conformance": 0}}
{"ts": 62, "type": "weights", "vcluster": "hpc", "weights": {"priority": 1}}"#;
        let w = parse_jsonl("t.jsonl", text);
        let TraceEventKind::Weights { vcluster, weights } = &w.events[0].kind else {
            panic!("{:?}", w.events)
        };
        assert_eq!(
            (vcluster.as_str(), weights.priority, weights.wait_time),
            ("hpc", 0.5, 0.5)
        );
        assert_eq!(w.events.len(), 1);
        let fields: Vec<(u64, Option<&str>)> = w.problems.iter().map(|p| (p.line, p.field.as_deref())).collect();
        assert_eq!(fields[0], (3, Some("weights.priority")));
        assert_eq!(fields[1].0, 4);
    }

    #[test]
    fn cancels_and_walltime_changes_are_events() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": "1h"}}
{"ts": 60, "type": "walltime", "alloc_id": "a", "walltime": "2h"}
{"ts": 90, "type": "cancel", "alloc_id": "a"}
{"ts": 95, "type": "walltime", "alloc_id": "a", "walltime": "never"}
{"ts": 96, "type": "walltime", "alloc_id": "a"}
{"ts": 97, "type": "cancel", "alloc_id": "a", "why": "x"}"#;
        let w = parse_jsonl("t.jsonl", text);
        let kinds: Vec<(u64, TraceEventKind)> = w.events.iter().map(|e| (e.time.0, e.kind.clone())).collect();
        assert_eq!(
            kinds,
            [
                (
                    60_000,
                    TraceEventKind::Walltime {
                        alloc: "a".into(),
                        walltime: Duration::from_hours(2)
                    }
                ),
                (90_000, TraceEventKind::Cancel { alloc: "a".into() }),
            ]
        );
        let fields: Vec<(u64, Option<&str>)> = w.problems.iter().map(|p| (p.line, p.field.as_deref())).collect();
        assert_eq!(fields, [(4, Some("walltime")), (5, Some("walltime")), (6, Some("why"))]);
    }
    #[test]
    fn seed_example_parses() {
        let text = r#"{"ts": "2026-03-01T00:00:01Z", "type": "submit", "alloc": {"id": "abc-123", "nodes": 64, "gpu_type": "GH200", "walltime": "72h", "tenant": "physics", "priority": 4}}
{"ts": "2026-03-01T00:00:05Z", "type": "complete", "alloc_id": "abc-123", "duration": "68h", "exit": 0}
{"ts": "2026-03-01T00:01:01Z", "type": "submit", "alloc": {"id": "b", "nodes": {"min": 2, "max": 4}, "walltime": "01:00:00", "depends_on": [{"ref": "abc-123", "condition": "any"}]}}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert!(w.problems.is_empty(), "{:?}", w.problems);
        assert_eq!(w.jobs.len(), 2);
        let a = &w.jobs[0];
        assert_eq!(a.submit, Time::ZERO);
        assert_eq!(a.runtime, Some(Duration::from_hours(68)));
        assert_eq!(a.spec.constraints.gpu_type.as_deref(), Some("GH200"));
        assert_eq!(a.spec.preemption_class.get(), 4);
        assert_eq!(w.tenants.get(a.spec.tenant.0), Some("physics"));
        let b = &w.jobs[1];
        assert_eq!(b.submit, Time::from_secs(60));
        assert_eq!(b.spec.nodes, NodeRange { min: 2, max: 4 });
        assert_eq!(b.deps, vec![(0, DependencyCondition::Any)]);
        assert_eq!(b.runtime, None);
    }

    #[test]
    fn bad_lines_are_skipped_with_line_and_field() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"nodes": 1, "walltime": "1h", "colour": "red"}}
{"ts": 1, "type": "node_explode", "node": 3}
not json
{"ts": 2, "type": "submit", "alloc": {"nodes": 1, "walltime": "1x"}}
{"ts": 3, "type": "submit", "alloc": {"nodes": 1, "walltime": "1h", "preemption_class": 11}}
{"ts": 4, "type": "complete", "alloc_id": "nope", "duration": 5}
{"ts": 5, "type": "submit", "alloc": {"id": "ok", "nodes": 1, "walltime": 60}}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.jobs.len(), 1);
        assert_eq!(w.jobs[0].submit, Time::ZERO, "time 0 is the first valid submit");
        assert_eq!(w.skipped.get("invalid_field"), Some(&3));
        assert_eq!(w.skipped.get("unknown_event_type"), Some(&1));
        assert_eq!(w.skipped.get("invalid_json"), Some(&1));
        assert_eq!(w.skipped.get("unknown_alloc"), Some(&1));
        let p = |line: u64| w.problems.iter().find(|p| p.line == line).unwrap();
        assert_eq!(p(1).field.as_deref(), Some("colour"));
        assert!(
            p(2).to_string().contains("unknown event type `node_explode`"),
            "{}",
            p(2)
        );
        assert_eq!(p(4).field.as_deref(), Some("alloc.walltime"));
        assert_eq!(p(5).field.as_deref(), Some("alloc.preemption_class"));
    }

    #[test]
    fn absurd_times_and_durations_are_refused_naming_the_field() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": "99999999999999d"}}
{"ts": 1, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": 1e300}}
{"ts": 2, "type": "submit", "alloc": {"id": "c", "nodes": 1, "walltime": "400d"}}
{"ts": 1e300, "type": "submit", "alloc": {"id": "d", "nodes": 1, "walltime": "1h"}}
{"ts": 3, "type": "submit", "alloc": {"id": "e", "nodes": 1, "lifecycle": {"type": "bounded", "walltime": "99999999999999d"}}}
{"ts": 4, "type": "submit", "alloc": {"id": "ok", "nodes": 1, "walltime": "366d"}}
{"ts": 5, "type": "complete", "alloc_id": "ok", "duration": 1e300}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.jobs.len(), 1, "{:?}", w.problems);
        assert_eq!(w.jobs[0].id, "ok");
        let p = |line: u64| w.problems.iter().find(|p| p.line == line).unwrap().to_string();
        assert!(
            p(1).contains("alloc.walltime") && p(1).contains("100 years"),
            "{}",
            p(1)
        );
        assert!(
            p(2).contains("alloc.walltime") && p(2).contains("100 years"),
            "{}",
            p(2)
        );
        assert!(
            p(3).contains("alloc.walltime") && p(3).contains("at most 366 days"),
            "{}",
            p(3)
        );
        assert!(p(4).contains("ts") && p(4).contains("year 9999"), "{}", p(4));
        assert!(
            p(5).contains("lifecycle.walltime") && p(5).contains("100 years"),
            "{}",
            p(5)
        );
        assert!(p(7).contains("duration") && p(7).contains("100 years"), "{}", p(7));
    }

    #[test]
    fn dependency_on_unknown_or_later_job_is_reported() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": 60, "depends_on": [{"ref": "b"}]}}
{"ts": 1, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": 60}}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.jobs.len(), 1);
        assert_eq!(w.skipped.get("unknown_dependency"), Some(&1));
    }
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use crate::jsonl_parse::parse_jsonl;

    #[test]
    fn claim_and_release_events() {
        let text = r#"{"ts": 0, "type": "claim", "claim": {"id": "c1", "nodes": 2, "tenant": "hospital", "user": "dr-x"}}
{"ts": 3600, "type": "release", "alloc_id": "c1"}
{"ts": 5, "type": "claim", "claim": {"id": "c2", "nodes": 1}}
{"ts": 6, "type": "release", "alloc_id": "nope"}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.jobs.len(), 1);
        let c = &w.jobs[0];
        assert!(c.spec.sensitive_claim);
        assert_eq!(c.user(), Some("dr-x"));
        assert_eq!(c.runtime, Some(Duration::from_hours(1)));
        assert_eq!(c.spec.lifecycle, lattice_engine::Lifecycle::Unbounded);
        let p = |line: u64| w.problems.iter().find(|p| p.line == line).unwrap();
        assert_eq!(p(3).field.as_deref(), Some("claim.user"));
        assert_eq!(p(4).reason, "unknown_claim");
    }
}

#[cfg(test)]
mod event_tests {
    use super::*;
    use crate::jsonl_parse::parse_jsonl;

    #[test]
    fn drift_and_conform_events() {
        let text = r#"{"ts": 5, "type": "drift", "node": "gh0002"}
{"ts": 9, "type": "conform", "node": "gh0002"}
{"ts": 10, "type": "drift"}
"#;
        let w = parse_jsonl("t.jsonl", text);
        let kinds: Vec<_> = w.events.iter().map(|e| e.kind.clone()).collect();
        let node = || "gh0002".to_string();
        assert_eq!(
            kinds,
            [
                TraceEventKind::Drift {
                    node: node(),
                    drifted: true
                },
                TraceEventKind::Drift {
                    node: node(),
                    drifted: false
                }
            ]
        );
        assert_eq!(w.skipped_total(), 1, "a drift without its node is reported");
    }

    #[test]
    fn cluster_events_and_requeue_fields() {
        let text = r#"{"ts": 10, "type": "node_fail", "node": "gh0001", "mode": "heartbeat"}
{"ts": 20, "type": "node_recover", "node": "gh0001"}
{"ts": 5, "type": "drain", "node": "gh0002"}
{"ts": 0, "type": "energy_price", "price": 0.12}
{"ts": 30, "type": "storage_outage"}
{"ts": 40, "type": "storage_recover"}
{"ts": 1, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": 60, "requeue": "always", "max_requeues": 5}}
{"ts": 2, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": 60, "max_requeues": 101}}
{"ts": 3, "type": "node_fail", "node": "x", "mode": "meteor"}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.events.len(), 6);
        assert_eq!(w.events[0].kind, TraceEventKind::EnergyPrice { price: 0.12 });
        assert_eq!(w.events[0].time, Time::ZERO);
        assert!(matches!(
            &w.events[2].kind,
            TraceEventKind::NodeFail { heartbeat: true, .. }
        ));
        assert_eq!(w.jobs.len(), 1);
        assert_eq!(w.jobs[0].spec.requeue, lattice_engine::RequeuePolicy::Always);
        assert_eq!(w.jobs[0].spec.max_requeues, 5);
        let p = |line: u64| w.problems.iter().find(|p| p.line == line).unwrap();
        assert_eq!(p(8).field.as_deref(), Some("alloc.max_requeues"));
        assert_eq!(p(9).field.as_deref(), Some("mode"));
    }

    /// A `settings` event: the settings in force from its time (seconds or durations, in ms); an
    /// unknown key, a bad value or a null skips the line naming the key.
    #[test]
    fn settings_events_are_read_and_bad_ones_named() {
        let text = r#"{"ts": 5, "type": "settings", "settings": {"agents.grace": 90, "agents.boot_timeout_by_kind.H200": "20m"}}
{"ts": 6, "type": "settings", "settings": {"agents.nope": 1}}
{"ts": 7, "type": "settings", "settings": {"agents.grace": "soon"}}
{"ts": 8, "type": "settings", "settings": {"agents.boot_timeout_by_kind.H200": null}}
"#;
        let w = parse_jsonl("t.jsonl", text);
        assert_eq!(w.events.len(), 1);
        let want = lattice_engine::controller::settings::Settings::from([
            ("agents.grace".to_string(), 90_000),
            ("agents.boot_timeout_by_kind.H200".to_string(), 1_200_000),
        ]);
        assert_eq!(w.events[0].kind, TraceEventKind::Settings { settings: want });
        let p = |line: u64| w.problems.iter().find(|p| p.line == line).unwrap().field.clone();
        assert_eq!(p(2).as_deref(), Some("settings.agents.nope"));
        assert_eq!(p(3).as_deref(), Some("settings.agents.grace"));
        assert_eq!(p(4).as_deref(), Some("settings.agents.boot_timeout_by_kind.H200"));
    }

    /// The documented schema names exactly the event types the parser reads.
    #[test]
    fn schema_documents_every_event_type() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("jsonl-schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut documented: Vec<String> = schema["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        documented.sort();
        let mut known: Vec<String> = EVENT_TYPES.iter().map(|s| s.to_string()).collect();
        known.sort();
        assert_eq!(documented, known);
    }
}
