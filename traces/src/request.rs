//! One request model. Every way a submission arrives — a JSONL `submit` or `claim` event, a REST
//! body, a gRPC message, the `lattice` CLI's flags (sent as a REST body) — converts its own wire
//! shape into a [`Request`], and [`alloc_spec`] turns that into the engine's [`AllocSpec`] with one
//! set of limits and defaults. What depends on where the request is read (names, dependencies,
//! where data sits now) comes from the caller's [`Names`].
//!
//! Errors name the field relative to the request (`nodes`, `lifecycle.walltime`,
//! `depends_on[1].condition`, `data.mounts[0].tier`); each caller prefixes them with where its wire
//! shape puts the request (`alloc.` in a trace, `resources.` for the API's node counts).
//!
//! Defaults: tenant, project and vCluster `default` (the API's vCluster is the control plane's
//! default); a bounded lifecycle; a sensitive claim with neither lifecycle nor walltime holds its
//! nodes until released; a data mount's `tier` is where the caller locates it, and its `tier_hint`
//! is that tier (nothing to stage) unless the request asks for one; requeue on node failure, at most
//! 3 times.

use crate::duration::parse_duration;
use lattice_engine::{
    AllocSpec, Constraints, Dependency, DependencyCondition, Lifecycle, NodeRange, PreemptionClass, ProjectId,
    TenantId, Tier, VClusterId,
};
use lattice_engine::{CheckpointKind, CheckpointMechanism, CheckpointSpec, Duration};
use serde::Deserialize;

/// The most elements one task group may have (every way a task group arrives).
pub const MAX_TASK_GROUP: u32 = 10_000;

/// How many nodes were asked for, as written (wide: a count past `u32` is refused, not truncated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodesAsked {
    Exact(i64),
    Range { min: i64, max: i64 },
}

impl Default for NodesAsked {
    fn default() -> Self {
        NodesAsked::Exact(1)
    }
}

/// Placement constraints as asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConstraintsAsked {
    pub gpu_type: Option<String>,
    pub gpu_count: Option<u32>,
    pub cpu_cores: Option<u32>,
    pub memory_gb: Option<u32>,
    pub features: Vec<String>,
    pub require_unified_memory: bool,
    /// `tight` or `any`.
    pub topology: Option<String>,
}

/// A checkpoint block as asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointAsked {
    pub strategy: String,
    pub estimated_minutes: Option<f64>,
    pub mechanism: Option<String>,
}

/// A data mount as asked (where its processes see it is the control plane's concern).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MountAsked {
    pub source: String,
    pub size_gb: Option<f64>,
    /// Where the data is now.
    pub tier: Option<String>,
    /// Where the job wants it.
    pub tier_hint: Option<String>,
}

/// A submission, whatever shape it came in.
#[derive(Clone, Default)]
pub struct Request {
    pub tenant: Option<String>,
    pub project: Option<String>,
    pub vcluster: Option<String>,
    pub nodes: NodesAsked,
    pub constraints: ConstraintsAsked,
    /// A walltime beside the lifecycle (the trace format's top-level `walltime`).
    pub walltime: Option<DurationValue>,
    pub lifecycle: Option<LifecycleIn>,
    pub preemption_class: Option<i64>,
    pub checkpoint: Option<CheckpointAsked>,
    /// `(ref, condition)` as written.
    pub depends_on: Vec<(String, String)>,
    /// Allocations with the same mutex never run at once.
    pub mutex: Option<String>,
    /// Storage bandwidth needed while it runs, GB/s.
    pub storage_gbps: Option<f64>,
    /// never | on_node_failure | always
    pub requeue: Option<String>,
    pub max_requeues: Option<i64>,
    pub mounts: Vec<MountAsked>,
    pub network_domain: Option<String>,
    /// A sensitive claim.
    pub sensitive: bool,
}

/// A dependency's condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    Success,
    Failure,
    Any,
    /// Element-wise between two task groups of the same size.
    Corresponding,
}

impl Condition {
    /// The engine's condition (`None`: `corresponding`, resolved element by element).
    pub fn engine(self) -> Option<DependencyCondition> {
        match self {
            Condition::Success => Some(DependencyCondition::Success),
            Condition::Failure => Some(DependencyCondition::Failure),
            Condition::Any => Some(DependencyCondition::Any),
            Condition::Corresponding => None,
        }
    }
}

/// Where a request is read: what only the reader knows.
pub trait Names {
    fn tenant(&mut self, name: &str) -> TenantId;
    fn project(&mut self, tenant: &str, name: &str) -> ProjectId;
    /// The vCluster by name (`None`: the default one), or why there is none.
    fn vcluster(&mut self, name: Option<&str>) -> Result<VClusterId, String>;
    /// How many nodes the site has, when the reader knows (a request for more is refused).
    fn cluster_nodes(&self) -> Option<u32>;
    /// The engine's dependency on `reference`: `Ok(None)` when there is none to hold here (a trace
    /// resolves its references once it is read whole; the control plane drops one that already
    /// ended with its condition met), or why the reference is refused.
    fn dependency(&mut self, reference: &str, condition: Condition) -> Result<Option<Dependency>, String>;
    /// Where a mount's data is now, when the request does not say (`hint`: where it is wanted).
    fn located(&mut self, source: &str, hint: Option<Tier>) -> Tier;
}

/// Where the request comes from: a trace is history, a request is a wish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A user's request (API, CLI): a walltime must be above zero.
    Request,
    /// A trace records what happened: a zero walltime is kept (an SWF job that ran 0 s with no
    /// requested time; DESIGN.md holds its nodes for 1 ms).
    History,
}

/// What is wrong with a request: the field (relative to the request) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> RequestError {
    RequestError {
        field: field.into(),
        message: message.into(),
    }
}

/// Checks the request and turns it into the engine's spec (without its task group: the caller
/// expands a group into its elements).
pub fn alloc_spec(req: &Request, origin: Origin, names: &mut dyn Names) -> Result<AllocSpec, RequestError> {
    if req.tenant.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(bad("tenant", "must not be empty"));
    }
    let nodes = node_range(req.nodes)?;
    if let Some(total) = names.cluster_nodes()
        && nodes.max > total
    {
        return Err(bad(
            "nodes",
            format!("{} nodes requested; the cluster has {total}", nodes.max),
        ));
    }
    let preemption_class = match req.preemption_class {
        None => PreemptionClass::default(),
        Some(c) => u8::try_from(c)
            .ok()
            .and_then(PreemptionClass::new)
            .ok_or_else(|| bad("preemption_class", format!("{c}: must be 0-10")))?,
    };
    let (lifecycle, scale, nodes) = lifecycle(req, origin, nodes)?;
    if let Some(total) = names.cluster_nodes()
        && nodes.max > total
    {
        return Err(bad(
            "lifecycle.max_nodes",
            format!("{}: the cluster has {total} nodes", nodes.max),
        ));
    }
    let vcluster = names
        .vcluster(req.vcluster.as_deref())
        .map_err(|m| bad("vcluster", m))?;
    let mut mutex = req.mutex.clone();
    let mut depends_on = Vec::new();
    for (i, (reference, condition)) in req.depends_on.iter().enumerate() {
        let c = match condition.as_str() {
            "success" | "afterok" => Condition::Success,
            "failure" | "afternotok" => Condition::Failure,
            "any" | "afterany" => Condition::Any,
            "corresponding" => Condition::Corresponding,
            // Singleton: `ref` names the mutex.
            "mutex" => {
                mutex = Some(reference.clone());
                continue;
            }
            o => {
                return Err(bad(
                    format!("depends_on[{i}].condition"),
                    format!(
                        "`{o}` is not one of success (afterok), failure (afternotok), any (afterany), corresponding, mutex"
                    ),
                ));
            }
        };
        if let Some(d) = names
            .dependency(reference, c)
            .map_err(|m| bad(format!("depends_on[{i}]"), m))?
        {
            depends_on.push(d);
        }
    }
    let data = mounts(&req.mounts, names)?;
    let checkpoint = match &req.checkpoint {
        None => Default::default(),
        Some(c) => {
            if let Some(m) = c.estimated_minutes
                && !(m.is_finite() && m >= 0.0)
            {
                return Err(bad("checkpoint.estimated_minutes", format!("{m}: minutes, 0 or more")));
            }
            checkpoint_spec(&c.strategy, c.estimated_minutes, c.mechanism.as_deref()).map_err(|(f, m)| bad(f, m))?
        }
    };
    if let Some(g) = req.storage_gbps
        && !(g.is_finite() && g >= 0.0)
    {
        return Err(bad("storage_gbps", format!("{g}: GB/s, 0 or more")));
    }
    let c = &req.constraints;
    let topology = c
        .topology
        .as_deref()
        .map(|t| {
            lattice_engine::TopologyHint::parse(t)
                .ok_or_else(|| bad("constraints.topology", format!("`{t}`: `tight` or `any`")))
        })
        .transpose()?;
    let tenant_name = req.tenant.as_deref().unwrap_or("default");
    Ok(AllocSpec {
        tenant: names.tenant(tenant_name),
        project: names.project(tenant_name, req.project.as_deref().unwrap_or("default")),
        vcluster,
        nodes,
        constraints: Constraints {
            gpu_type: c.gpu_type.clone(),
            gpu_count: c.gpu_count,
            cpu_cores: c.cpu_cores,
            memory_gb: c.memory_gb,
            features: c.features.iter().cloned().collect(),
            require_unified_memory: c.require_unified_memory,
            topology,
        },
        lifecycle,
        preemption_class,
        checkpoint,
        depends_on,
        task_group: None,
        storage_gbps: req.storage_gbps,
        sensitive_claim: req.sensitive,
        mutex,
        scale: scale.map(Box::new),
        data,
        network_domain: req.network_domain.clone(),
        requeue: match req.requeue.as_deref() {
            None | Some("on_node_failure") => lattice_engine::RequeuePolicy::OnNodeFailure,
            Some("never") => lattice_engine::RequeuePolicy::Never,
            Some("always") => lattice_engine::RequeuePolicy::Always,
            Some(o) => {
                return Err(bad(
                    "requeue",
                    format!("`{o}` is not one of never, on_node_failure, always"),
                ));
            }
        },
        max_requeues: match req.max_requeues {
            None => lattice_engine::alloc::DEFAULT_MAX_REQUEUES,
            Some(m) if (0..=i64::from(lattice_engine::alloc::MAX_REQUEUES_LIMIT)).contains(&m) => m as u32,
            Some(m) => {
                return Err(bad(
                    "max_requeues",
                    format!("{m}: 0 to {}", lattice_engine::alloc::MAX_REQUEUES_LIMIT),
                ));
            }
        },
    })
}

/// The node range asked for: `1 <= min <= max`, each within `u32`.
fn node_range(n: NodesAsked) -> Result<NodeRange, RequestError> {
    let (min, max) = match n {
        NodesAsked::Exact(n) if n < 1 => return Err(bad("nodes", format!("{n}: at least 1 node"))),
        NodesAsked::Exact(n) => (n, n),
        NodesAsked::Range { min, max } if min < 1 || max < min => {
            return Err(bad("nodes", format!("min {min} / max {max}: need 1 <= min <= max")));
        }
        NodesAsked::Range { min, max } => (min, max),
    };
    let narrow = |x: i64| u32::try_from(x).map_err(|_| bad("nodes", format!("{x}: at most {} nodes", u32::MAX)));
    Ok(NodeRange {
        min: narrow(min)?,
        max: narrow(max)?,
    })
}

/// The lifecycle (and, for a reactive one, its scaling policy and node range).
fn lifecycle(
    req: &Request,
    origin: Origin,
    nodes: NodeRange,
) -> Result<(Lifecycle, Option<lattice_engine::ScalePolicy>, NodeRange), RequestError> {
    let walltime = |v: &DurationValue, field: &str| -> Result<lattice_engine::Duration, RequestError> {
        let w = walltime_value(v).map_err(|m| bad(field, m))?;
        if origin == Origin::Request && w == lattice_engine::Duration::ZERO {
            return Err(bad(field, "a walltime must be positive"));
        }
        Ok(w)
    };
    let top = req.walltime.as_ref().map(|w| walltime(w, "walltime")).transpose()?;
    let Some(l) = &req.lifecycle else {
        return match top {
            Some(w) => Ok((Lifecycle::Bounded { walltime: w }, None, nodes)),
            // A claim holds its nodes until it is released.
            None if req.sensitive => Ok((Lifecycle::Unbounded, None, nodes)),
            None => Err(bad("walltime", "a bounded allocation needs a walltime")),
        };
    };
    match l.kind() {
        "bounded" => {
            let own = l.walltime().map(|w| walltime(w, "lifecycle.walltime")).transpose()?;
            match own.or(top) {
                Some(w) => Ok((Lifecycle::Bounded { walltime: w }, None, nodes)),
                None => Err(bad("lifecycle.walltime", "a bounded allocation needs a walltime")),
            }
        }
        "unbounded" => Ok((Lifecycle::Unbounded, None, nodes)),
        "reactive" => {
            let (lc, policy, range) = reactive(l, nodes).map_err(|(f, m)| bad(f, m))?;
            Ok((lc, Some(policy), range))
        }
        other => Err(bad(
            "lifecycle.type",
            format!("`{other}` is not one of bounded, unbounded, reactive"),
        )),
    }
}

/// Data mounts: each with its size, where its data is now and where the job wants it.
fn mounts(asked: &[MountAsked], names: &mut dyn Names) -> Result<Vec<lattice_engine::DataMount>, RequestError> {
    let mut out = Vec::new();
    for (i, m) in asked.iter().enumerate() {
        let f = |x: &str| format!("data.mounts[{i}].{x}");
        let size_gb = m.size_gb.unwrap_or(0.0);
        if !(size_gb.is_finite() && size_gb >= 0.0) {
            return Err(bad(f("size_gb"), format!("{size_gb}: a size in GB, 0 or more")));
        }
        let tier = |v: &Option<String>, field: &str| {
            v.as_deref()
                .map(|t| parse_tier(t).map_err(|m| bad(f(field), m)))
                .transpose()
        };
        let hint = tier(&m.tier_hint, "tier_hint")?;
        let now = match tier(&m.tier, "tier")? {
            Some(t) => t,
            None => names.located(&m.source, hint),
        };
        out.push(lattice_engine::DataMount {
            source: m.source.clone(),
            size_gb,
            tier: now,
            tier_hint: hint.unwrap_or(now),
        });
    }
    Ok(out)
}

// The pieces of a request every wire shape shares: durations, the lifecycle block, checkpoints, tiers.

/// A duration as requests write it: seconds, or text (`72h`, `HH:MM:SS`).
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum DurationValue {
    Secs(f64),
    Text(String),
}

/// A request's `lifecycle` block (`type` bounded — the default —, unbounded or reactive).
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct LifecycleIn {
    #[serde(rename = "type", default = "bounded")]
    kind: String,
    walltime: Option<DurationValue>,
    min_nodes: Option<u32>,
    max_nodes: Option<u32>,
    /// Reactive: the metric name (recorded; `metric` events carry the samples) and its target (a number,
    /// or a duration such as "100ms", in seconds).
    #[allow(dead_code)]
    metric: Option<String>,
    target: Option<DurationValue>,
    scale_policy: Option<ScalePolicyIn>,
}

fn bounded() -> String {
    "bounded".into()
}

impl LifecycleIn {
    pub fn kind(&self) -> &str {
        &self.kind
    }

    pub fn walltime(&self) -> Option<&DurationValue> {
        self.walltime.as_ref()
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScalePolicyIn {
    min: Option<u32>,
    max: Option<u32>,
    #[allow(dead_code)]
    metric: Option<String>,
    target: Option<DurationValue>,
    evaluation_interval: Option<DurationValue>,
    scale_up_window: Option<DurationValue>,
    scale_down_window: Option<DurationValue>,
    scale_down_threshold: Option<f64>,
    cooldown: Option<DurationValue>,
}

/// A reactive lifecycle (`{"type": "reactive", "target": T, "scale_policy": {"min", "max", "target",
/// "evaluation_interval", "scale_up_window", "scale_down_window", "cooldown",
/// "scale_down_threshold"}}`, or `min_nodes`/`max_nodes`/`target` at the top): its node range and
/// scaling policy. Errors name the field (`lifecycle.target`, …).
pub(crate) fn reactive(
    l: &LifecycleIn,
    nodes: NodeRange,
) -> Result<(Lifecycle, lattice_engine::ScalePolicy, NodeRange), (String, String)> {
    let f = |field: &str, m: String| (field.to_string(), m);
    let sp = l.scale_policy.clone();
    let min_nodes = sp.as_ref().and_then(|p| p.min).or(l.min_nodes).unwrap_or(nodes.min);
    let max_nodes = sp.as_ref().and_then(|p| p.max).or(l.max_nodes).unwrap_or(nodes.max);
    if min_nodes == 0 || min_nodes > max_nodes {
        return Err(f(
            "lifecycle.min_nodes",
            format!("need 1 <= min_nodes <= max_nodes, got {min_nodes}..{max_nodes}"),
        ));
    }
    let target = sp
        .as_ref()
        .and_then(|p| p.target.clone())
        .or(l.target.clone())
        .ok_or_else(|| f("lifecycle.target", "a reactive allocation needs a metric target".into()))?;
    let target = match target {
        DurationValue::Secs(x) => x,
        DurationValue::Text(t) => match t.trim().parse::<f64>() {
            Ok(x) => x,
            Err(_) => parse_duration(&t).map_err(|m| f("lifecycle.target", m))?.as_secs_f64(),
        },
    };
    if !(target.is_finite() && target > 0.0) {
        return Err(f("lifecycle.target", format!("{target}: a metric target above 0")));
    }
    let mut policy = lattice_engine::ScalePolicy::with_target(target);
    if let Some(p) = &sp {
        let d = |v: &Option<DurationValue>, name: &str| -> Result<Option<Duration>, (String, String)> {
            v.as_ref()
                .map(duration_value)
                .transpose()
                .map_err(|m| f(&format!("lifecycle.scale_policy.{name}"), m))
        };
        if let Some(x) = d(&p.evaluation_interval, "evaluation_interval")? {
            policy.evaluation_interval = x;
        }
        if let Some(x) = d(&p.scale_up_window, "scale_up_window")? {
            policy.scale_up_window = x;
        }
        if let Some(x) = d(&p.scale_down_window, "scale_down_window")? {
            policy.scale_down_window = x;
        }
        if let Some(x) = d(&p.cooldown, "cooldown")? {
            policy.cooldown = x;
        }
        if let Some(x) = p.scale_down_threshold {
            policy.scale_down_threshold = x;
        }
    }
    let range = NodeRange {
        min: min_nodes,
        max: max_nodes,
    };
    Ok((Lifecycle::Reactive { min_nodes, max_nodes }, policy, range))
}

/// A submission's `checkpoint` block: `strategy` auto | manual | none, `mechanism` signal (default) |
/// shmem | grpc | dmtcp. The error names the field (`checkpoint.strategy`, `checkpoint.mechanism`).
/// Shared with the runtime's submission API.
pub fn checkpoint_spec(
    strategy: &str,
    estimated_minutes: Option<f64>,
    mechanism: Option<&str>,
) -> Result<CheckpointSpec, (&'static str, String)> {
    Ok(CheckpointSpec {
        kind: match strategy {
            "auto" => CheckpointKind::Auto,
            "manual" => CheckpointKind::Manual,
            "none" => CheckpointKind::None,
            o => return Err(("checkpoint.strategy", format!("`{o}` is not one of auto, manual, none"))),
        },
        estimated_minutes,
        mechanism: match mechanism {
            None | Some("signal") => CheckpointMechanism::Signal,
            Some("shmem") => CheckpointMechanism::Shmem,
            Some("grpc") => CheckpointMechanism::Grpc,
            Some("dmtcp") => CheckpointMechanism::Dmtcp,
            Some(o) => {
                return Err((
                    "checkpoint.mechanism",
                    format!("`{o}` is not one of signal, shmem, grpc, dmtcp"),
                ));
            }
        },
    })
}

/// A storage tier by name, as every request names it (a trace's submit event, the API's body):
/// `hot`, `warm` or `cold`.
pub fn parse_tier(name: &str) -> Result<lattice_engine::Tier, String> {
    match name {
        "hot" => Ok(lattice_engine::Tier::Hot),
        "warm" => Ok(lattice_engine::Tier::Warm),
        "cold" => Ok(lattice_engine::Tier::Cold),
        o => Err(format!("`{o}` is not one of hot, warm, cold")),
    }
}

pub(crate) fn duration_value(d: &DurationValue) -> Result<Duration, String> {
    match d {
        DurationValue::Secs(s) => crate::duration::secs_to_duration(*s, &s.to_string()),
        DurationValue::Text(t) => parse_duration(t),
    }
}

/// A walltime: a duration, positive and at most 366 days.
pub(crate) fn walltime_value(d: &DurationValue) -> Result<Duration, String> {
    let shown = match d {
        DurationValue::Secs(s) => s.to_string(),
        DurationValue::Text(t) => t.clone(),
    };
    crate::duration::check_walltime(duration_value(d)?, &shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names for tests: one tenant, project and vCluster; a site of 16 nodes; data on the warm tier.
    struct Site(Vec<(String, Condition)>);

    impl Names for Site {
        fn tenant(&mut self, _: &str) -> TenantId {
            TenantId(0)
        }
        fn project(&mut self, _: &str, _: &str) -> ProjectId {
            ProjectId(0)
        }
        fn vcluster(&mut self, name: Option<&str>) -> Result<VClusterId, String> {
            match name {
                None | Some("default") => Ok(VClusterId(0)),
                Some(o) => Err(format!("`{o}`: no such vCluster")),
            }
        }
        fn cluster_nodes(&self) -> Option<u32> {
            Some(16)
        }
        fn dependency(&mut self, reference: &str, c: Condition) -> Result<Option<Dependency>, String> {
            self.0.push((reference.to_string(), c));
            Ok(None)
        }
        fn located(&mut self, _: &str, _: Option<Tier>) -> Tier {
            Tier::Warm
        }
    }

    fn bounded(nodes: NodesAsked) -> Request {
        Request {
            nodes,
            walltime: Some(DurationValue::Text("1h".into())),
            ..Request::default()
        }
    }

    fn field_of(req: &Request, origin: Origin) -> String {
        alloc_spec(req, origin, &mut Site(Vec::new())).unwrap_err().field
    }

    /// A count past `u32` is refused naming the field, never truncated (4294967297 used to become 1).
    #[test]
    fn node_counts_are_refused_not_truncated() {
        for n in [
            NodesAsked::Exact(4_294_967_297),
            NodesAsked::Range {
                min: 1,
                max: 4_294_967_298,
            },
            NodesAsked::Exact(0),
            NodesAsked::Range { min: 3, max: 2 },
            NodesAsked::Exact(17),
        ] {
            assert_eq!(field_of(&bounded(n), Origin::Request), "nodes", "{n:?}");
        }
        let spec = alloc_spec(&bounded(NodesAsked::Exact(16)), Origin::Request, &mut Site(Vec::new())).unwrap();
        assert_eq!(spec.nodes, NodeRange::exact(16));
    }

    /// The same limits whatever the origin, but a trace may record a zero walltime.
    #[test]
    fn limits_are_the_same_for_every_origin() {
        let mut r = bounded(NodesAsked::Exact(1));
        for (field, change) in [
            (
                "preemption_class",
                &(|r: &mut Request| r.preemption_class = Some(11)) as &dyn Fn(&mut Request),
            ),
            ("max_requeues", &|r: &mut Request| r.max_requeues = Some(101)),
            ("storage_gbps", &|r: &mut Request| r.storage_gbps = Some(-1.0)),
            ("requeue", &|r: &mut Request| r.requeue = Some("sometimes".into())),
            ("vcluster", &|r: &mut Request| r.vcluster = Some("nope".into())),
            ("tenant", &|r: &mut Request| r.tenant = Some(" ".into())),
        ] {
            let mut bad = r.clone();
            change(&mut bad);
            for origin in [Origin::Request, Origin::History] {
                assert_eq!(field_of(&bad, origin), field, "{origin:?}");
            }
        }
        r.walltime = Some(DurationValue::Secs(0.0));
        assert_eq!(field_of(&r, Origin::Request), "walltime");
        let spec = alloc_spec(&r, Origin::History, &mut Site(Vec::new())).unwrap();
        assert_eq!(spec.lifecycle.walltime(), Some(lattice_engine::Duration::ZERO));
    }

    /// Both spellings of a condition; a mutex is a condition too; an unknown one names its index.
    #[test]
    fn dependency_conditions_in_either_spelling() {
        let mut r = bounded(NodesAsked::Exact(1));
        r.depends_on = vec![
            ("a".into(), "afterok".into()),
            ("b".into(), "failure".into()),
            ("c".into(), "afterany".into()),
            ("g".into(), "corresponding".into()),
            ("lock".into(), "mutex".into()),
        ];
        let mut site = Site(Vec::new());
        let spec = alloc_spec(&r, Origin::Request, &mut site).unwrap();
        assert_eq!(spec.mutex.as_deref(), Some("lock"));
        let conditions: Vec<Condition> = site.0.iter().map(|(_, c)| *c).collect();
        assert_eq!(
            conditions,
            [
                Condition::Success,
                Condition::Failure,
                Condition::Any,
                Condition::Corresponding
            ]
        );
        r.depends_on.push(("d".into(), "before".into()));
        assert_eq!(field_of(&r, Origin::Request), "depends_on[5].condition");
    }

    /// A mount's tier is where the reader locates it unless the request says; its hint is that
    /// tier (nothing to stage) unless the request asks for another.
    #[test]
    fn mount_tiers_default_to_where_the_data_is() {
        let mut r = bounded(NodesAsked::Exact(1));
        let mount = |tier: Option<&str>, hint: Option<&str>| MountAsked {
            source: "s3://b/k".into(),
            size_gb: Some(10.0),
            tier: tier.map(Into::into),
            tier_hint: hint.map(Into::into),
        };
        r.mounts = vec![
            mount(None, None),
            mount(None, Some("hot")),
            mount(Some("cold"), None),
            mount(Some("hot"), Some("hot")),
        ];
        let spec = alloc_spec(&r, Origin::Request, &mut Site(Vec::new())).unwrap();
        let tiers: Vec<(Tier, Tier)> = spec.data.iter().map(|m| (m.tier, m.tier_hint)).collect();
        assert_eq!(
            tiers,
            [
                (Tier::Warm, Tier::Warm),
                (Tier::Warm, Tier::Hot),
                (Tier::Cold, Tier::Cold),
                (Tier::Hot, Tier::Hot)
            ]
        );
        r.mounts = vec![mount(Some("lukewarm"), None)];
        assert_eq!(field_of(&r, Origin::Request), "data.mounts[0].tier");
    }

    /// A claim with neither lifecycle nor walltime holds its nodes until released; any other
    /// request needs a walltime.
    #[test]
    fn a_claim_without_a_walltime_is_unbounded() {
        let mut r = Request {
            sensitive: true,
            ..Request::default()
        };
        let spec = alloc_spec(&r, Origin::Request, &mut Site(Vec::new())).unwrap();
        assert_eq!(spec.lifecycle, Lifecycle::Unbounded);
        r.sensitive = false;
        assert_eq!(field_of(&r, Origin::Request), "walltime");
    }
}
