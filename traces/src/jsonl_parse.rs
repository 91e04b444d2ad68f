//! Reading a JSONL event log into a [`Workload`]: each line is parsed by the function for its event
//! type ([`Parser::line`] dispatches), then completions and releases are applied to the submissions
//! they name, and dependencies are resolved in submission order ([`Parser::finish`]). A bad line is
//! skipped and counted by reason with its line and field; nothing fails the whole file.

use crate::error::{Problem, TraceError};
use crate::jsonl::{
    BareEventIn, BrokerEventIn, ChangeEvent, ClaimEvent, CompleteEvent, DagEvent, Deps, EVENT_TYPES, EventHead,
    LoadCurveEventIn, MAX_DAG_SIZE, MetricEventIn, NodeAddedIn, NodeCapabilitiesIn, NodeEventIn, PriceEventIn,
    ReleaseEvent, SettingsEvent, SubmitEvent, SubmitIn, VClusterEvent, WeightsEvent, duration_value, field_of,
    load_curve, submit_job, ts_millis, validate_dag, walltime_value,
};
use crate::workload::{TraceEvent, TraceEventKind, TraceJob, Workload};
use lattice_engine::{DependencyCondition, Duration, TaskGroupRef, Time};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Reads a JSONL trace file (plain or `.gz`).
pub fn read_jsonl(path: &Path) -> Result<Workload, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    let text = crate::swf::decode(bytes).map_err(|e| TraceError::io(path, e))?;
    Ok(parse_jsonl(&path.display().to_string(), &text))
}

/// Parses JSONL text. Never fails: bad lines are skipped and counted by reason with their line number.
pub fn parse_jsonl(file: &str, text: &str) -> Workload {
    parse_jsonl_with(file, text, false)
}

/// [`parse_jsonl`], optionally keeping every problem.
pub fn parse_jsonl_with(file: &str, text: &str, keep_all_problems: bool) -> Workload {
    let mut p = Parser::new(file, keep_all_problems);
    for (ln, line) in text.lines().enumerate() {
        p.line(ln as u64 + 1, line.trim());
    }
    p.finish()
}

/// A submission waiting for the whole file: its completion or release may come later, and its
/// dependencies are resolved once every submission is known.
struct Pending {
    ts_ms: i64,
    line: u64,
    job: TraceJob,
    deps: Deps,
}

/// What a submission-kind line failed on: `(field, reason, message)`.
type Refusal = (String, String, String);

/// The reader's state between lines.
struct Parser<'f> {
    file: &'f str,
    w: Workload,
    pending: Vec<Pending>,
    by_id: BTreeMap<String, usize>,
    completions: Vec<(u64, CompleteEvent)>,
    releases: Vec<(u64, i64, String)>,
    /// Cluster events: (ts, line, what).
    others: Vec<(i64, u64, TraceEventKind)>,
    next_group: u64,
    /// Equal requests share one spec.
    specs: crate::shared_specs::SharedSpecs,
}

impl<'f> Parser<'f> {
    fn new(file: &'f str, keep_all_problems: bool) -> Self {
        Parser {
            file,
            w: Workload {
                source: file.to_string(),
                keep_all_problems,
                ..Workload::default()
            },
            pending: Vec::new(),
            by_id: BTreeMap::new(),
            completions: Vec::new(),
            releases: Vec::new(),
            others: Vec::new(),
            next_group: 0,
            specs: Default::default(),
        }
    }

    /// Skips line `line`, counted under `reason`.
    fn skip(&mut self, line: u64, field: Option<&str>, reason: &str, message: String) {
        self.w.skip(Problem {
            file: self.file.to_string(),
            line,
            field: field.map(str::to_string),
            reason: reason.to_string(),
            message,
        });
    }

    /// The line as event `T`, or skipped as an invalid field (the field serde names, when it does).
    fn event<T: DeserializeOwned>(&mut self, t: &str, line: u64) -> Option<T> {
        match serde_json::from_str(t) {
            Ok(e) => Some(e),
            Err(e) => {
                self.skip(line, field_of(&e).as_deref(), "invalid_field", e.to_string());
                None
            }
        }
    }

    fn cluster_event(&mut self, ts_ms: i64, line: u64, kind: TraceEventKind) {
        self.others.push((ts_ms, line, kind));
    }

    /// One line: blank lines and `#` comments are ignored; the rest is an event of a known type.
    fn line(&mut self, line: u64, t: &str) {
        if t.is_empty() || t.starts_with('#') {
            return;
        }
        let head: EventHead = match serde_json::from_str(t) {
            Ok(h) => h,
            Err(e) => return self.skip(line, None, "invalid_json", format!("not a trace event: {e}")),
        };
        let ts_ms = match ts_millis(&head.ts) {
            Ok(v) => v,
            Err(m) => return self.skip(line, Some("ts"), "invalid_field", m),
        };
        match head.kind.as_str() {
            "submit" => self.submit(t, ts_ms, line),
            "dag" => self.dag(t, ts_ms, line),
            "claim" => self.claim(t, ts_ms, line),
            "node_fail" | "node_recover" | "drain" | "undrain" | "prologue_fail" | "drift" | "conform"
            | "wipe_retry" => self.node_event(t, ts_ms, line),
            "node_added" => self.node_added(t, ts_ms, line),
            "energy_price" => self.energy_price(t, ts_ms, line),
            "metric" => self.metric(t, ts_ms, line),
            "load_curve" => self.load_curve(t, ts_ms, line),
            "storage_outage" | "storage_recover" => self.storage(t, ts_ms, line, head.kind == "storage_outage"),
            "weights" => self.weights(t, ts_ms, line),
            "vcluster" => self.vcluster(t, ts_ms, line),
            "settings" => self.settings(t, ts_ms, line),
            "checkpoint_bandwidth" | "gpu_memory" => self.broker_input(t, ts_ms, line, head.kind == "gpu_memory"),
            "node_capabilities" => {
                if let Some(e) = self.event::<NodeCapabilitiesIn>(t, line) {
                    let kind = TraceEventKind::NodeCapabilities {
                        node: e.node,
                        capabilities: e.capabilities,
                    };
                    self.cluster_event(ts_ms, line, kind);
                }
            }
            "cancel" | "walltime" => self.change(t, ts_ms, line, head.kind == "cancel"),
            "release" => {
                if let Some(e) = self.event::<ReleaseEvent>(t, line) {
                    self.releases.push((line, ts_ms, e.alloc_id));
                }
            }
            "complete" => {
                if let Some(e) = self.event::<CompleteEvent>(t, line) {
                    self.completions.push((line, e));
                }
            }
            other => self.skip(
                line,
                Some("type"),
                "unknown_event_type",
                format!("unknown event type `{other}` (known: {})", EVENT_TYPES.join(", ")),
            ),
        }
    }

    fn submit(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(ev) = self.event::<SubmitEvent>(t, line) else {
            return;
        };
        if let Err(pr) = self.push_submit(ev.alloc, ts_ms, line, None) {
            self.skip(line, Some(&pr.0), &pr.1, pr.2);
        }
    }

    /// A DAG: validated as a whole, then its allocations submitted in a topological order, their
    /// ids and references prefixed with the DAG's id.
    fn dag(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(ev) = self.event::<DagEvent>(t, line) else {
            return;
        };
        match validate_dag(&ev.dag, MAX_DAG_SIZE) {
            Err(m) => self.skip(line, Some("dag"), "invalid_dag", m),
            Ok(order) => {
                let id = ev.dag.id.clone();
                for k in order {
                    let mut a = ev.dag.allocations[k].clone();
                    a.id = Some(format!("{id}/{}", a.id.clone().unwrap_or_default()));
                    for d in &mut a.depends_on {
                        if d.condition != "mutex" {
                            d.reference = format!("{id}/{}", d.reference);
                        }
                    }
                    if let Err(pr) = self.push_submit(a, ts_ms, line, Some(&id)) {
                        self.skip(line, Some(&pr.0), &pr.1, pr.2);
                    }
                }
            }
        }
    }

    /// A sensitive claim: a submission that needs the user's identity.
    fn claim(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(ev) = self.event::<ClaimEvent>(t, line) else {
            return;
        };
        if ev.claim.user.is_none() {
            let why = "a sensitive claim needs the user identity".to_string();
            return self.skip(line, Some("claim.user"), "invalid_field", why);
        }
        match submit_job(&mut self.w, ev.claim, line, true) {
            Ok((job, deps)) => {
                if self.by_id.insert(job.id.clone(), self.pending.len()).is_some() {
                    let why = format!("id `{}` already submitted", job.id);
                    return self.skip(line, Some("claim.id"), "duplicate_id", why);
                }
                let mut job = job;
                job.spec = self.specs.share(job.spec);
                self.pending.push(Pending { ts_ms, line, job, deps });
            }
            Err((field, msg)) => self.skip(line, Some(&field.replacen("alloc.", "claim.", 1)), "invalid_field", msg),
        }
    }

    /// A node's failure, recovery, drain, undrain, prologue failure, drift, conformance or wipe retry.
    fn node_event(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(e) = self.event::<NodeEventIn>(t, line) else {
            return;
        };
        let heartbeat = match e.mode.as_deref() {
            None | Some("hardware") => false,
            Some("heartbeat") if e.kind == "node_fail" => true,
            Some(o) => {
                let why = format!("`{o}` is not one of hardware, heartbeat");
                return self.skip(line, Some("mode"), "invalid_field", why);
            }
        };
        let node = e.node;
        let kind = match e.kind.as_str() {
            "node_fail" => TraceEventKind::NodeFail { node, heartbeat },
            "node_recover" => TraceEventKind::NodeRecover { node },
            "drain" => TraceEventKind::Drain { node },
            "prologue_fail" => TraceEventKind::PrologueFail { node },
            "drift" | "conform" => TraceEventKind::Drift {
                node,
                drifted: e.kind == "drift",
            },
            "wipe_retry" => TraceEventKind::WipeRetry { node },
            _ => TraceEventKind::Undrain { node },
        };
        self.cluster_event(ts_ms, line, kind);
    }

    /// Nodes joining the site: one inventory entry (a name, or a prefix and a count).
    fn node_added(&mut self, t: &str, ts_ms: i64, line: u64) {
        match serde_json::from_str::<NodeAddedIn>(t)
            .map_err(|e| (field_of(&e), e.to_string()))
            .and_then(|e| crate::inventory::parse_node_entry(&e.node).map_err(|m| (Some("node".into()), m)))
        {
            Ok(nodes) => {
                for node in nodes {
                    self.cluster_event(ts_ms, line, TraceEventKind::NodeAdded(Box::new(node)));
                }
            }
            Err((field, m)) => self.skip(line, field.as_deref(), "invalid_field", m),
        }
    }

    /// The broker's measured inputs: the store's write bandwidth (`gbps`), a node's GPU memory
    /// (`node`, `gb`); each a positive number, else the line is skipped naming the field.
    fn broker_input(&mut self, t: &str, ts_ms: i64, line: u64, gpu: bool) {
        let Some(e) = self.event::<BrokerEventIn>(t, line) else {
            return;
        };
        let positive = |v: Option<f64>| v.filter(|x| x.is_finite() && *x > 0.0);
        let kind = match (gpu, e.node, positive(e.gb), positive(e.gbps)) {
            (true, Some(node), Some(gb), None) => TraceEventKind::GpuMemory { node, gb },
            (false, None, None, Some(gbps)) => TraceEventKind::CheckpointBandwidth { gbps },
            (true, None, ..) => {
                return self.skip(line, Some("node"), "invalid_field", "gpu_memory names its node".into());
            }
            (true, ..) => {
                return self.skip(
                    line,
                    Some("gb"),
                    "invalid_field",
                    "gb: a positive number of GB per GPU".into(),
                );
            }
            (false, ..) => {
                return self.skip(
                    line,
                    Some("gbps"),
                    "invalid_field",
                    "gbps: a positive number of GB/s".into(),
                );
            }
        };
        self.cluster_event(ts_ms, line, kind);
    }

    fn energy_price(&mut self, t: &str, ts_ms: i64, line: u64) {
        match self.event::<PriceEventIn>(t, line) {
            Some(e) if e.price.is_finite() => {
                self.cluster_event(ts_ms, line, TraceEventKind::EnergyPrice { price: e.price })
            }
            Some(_) => self.skip(line, Some("price"), "invalid_field", "price must be a number".into()),
            None => {}
        }
    }

    fn metric(&mut self, t: &str, ts_ms: i64, line: u64) {
        match self.event::<MetricEventIn>(t, line) {
            Some(e) if e.value.is_finite() => {
                let kind = TraceEventKind::Metric {
                    alloc: e.alloc_id,
                    value: e.value,
                };
                self.cluster_event(ts_ms, line, kind)
            }
            Some(_) => self.skip(line, Some("value"), "invalid_field", "value must be a number".into()),
            None => {}
        }
    }

    fn load_curve(&mut self, t: &str, ts_ms: i64, line: u64) {
        match serde_json::from_str::<LoadCurveEventIn>(t)
            .map_err(|e| (field_of(&e).unwrap_or_default(), e.to_string()))
            .and_then(load_curve)
        {
            Ok(kind) => self.cluster_event(ts_ms, line, kind),
            Err((field, m)) => self.skip(line, (!field.is_empty()).then_some(field.as_str()), "invalid_field", m),
        }
    }

    fn storage(&mut self, t: &str, ts_ms: i64, line: u64, outage: bool) {
        if self.event::<BareEventIn>(t, line).is_some() {
            let kind = if outage {
                TraceEventKind::StorageOutage
            } else {
                TraceEventKind::StorageRecover
            };
            self.cluster_event(ts_ms, line, kind);
        }
    }

    /// A vCluster's new cost weights (all nine, each >= 0).
    fn weights(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(e) = self.event::<WeightsEvent>(t, line) else {
            return;
        };
        match lattice_engine::CostWeights::NAMES
            .iter()
            .zip(e.weights.as_array())
            .find(|(_, v)| !(v.is_finite() && *v >= 0.0))
        {
            Some((name, v)) => {
                let field = format!("weights.{name}");
                self.skip(line, Some(&field), "invalid_field", format!("{v}: weights are >= 0"))
            }
            None => {
                let kind = TraceEventKind::Weights {
                    vcluster: e.vcluster,
                    weights: e.weights,
                };
                self.cluster_event(ts_ms, line, kind)
            }
        }
    }

    /// A vCluster's scheduler configuration (checked here: a bad key skips the line, naming it).
    /// The vCluster exists from the start of the replay.
    fn vcluster(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(e) = self.event::<VClusterEvent>(t, line) else {
            return;
        };
        let base = lattice_engine::VClusterConfig::new(lattice_engine::Policy::Backfill {
            depth: lattice_engine::Depth::Limited(10),
        });
        if let Err(err) = crate::vcluster_config::apply_config(&base, &e.config) {
            let field = format!("config.{}", err.field);
            return self.skip(line, Some(&field), "invalid_field", err.message);
        }
        self.w.vclusters.intern(&e.vcluster);
        let kind = TraceEventKind::VCluster {
            vcluster: e.vcluster,
            config: e.config,
        };
        self.cluster_event(ts_ms, line, kind)
    }

    /// The site settings in force from this time on (a bad key or value skips the line, naming it).
    fn settings(&mut self, t: &str, ts_ms: i64, line: u64) {
        let Some(e) = self.event::<SettingsEvent>(t, line) else {
            return;
        };
        let parsed = match crate::vcluster_config::settings_of(&e.settings) {
            Ok(p) => p,
            Err(err) => {
                let field = format!("settings.{}", err.field);
                return self.skip(line, Some(&field), "invalid_field", err.message);
            }
        };
        let mut settings = lattice_engine::controller::settings::Settings::new();
        for (key, ms) in parsed {
            let Some(ms) = ms else {
                let field = format!("settings.{key}");
                return self.skip(
                    line,
                    Some(&field),
                    "invalid_field",
                    "a settings event carries the settings in force: a value, not null".to_string(),
                );
            };
            settings.insert(key, ms);
        }
        self.cluster_event(ts_ms, line, TraceEventKind::Settings { settings })
    }

    /// `cancel` (`alloc_id`) or `walltime` (`alloc_id`, `walltime`).
    fn change(&mut self, t: &str, ts_ms: i64, line: u64, cancel: bool) {
        let Some(e) = self.event::<ChangeEvent>(t, line) else {
            return;
        };
        if cancel {
            return self.cluster_event(ts_ms, line, TraceEventKind::Cancel { alloc: e.alloc_id });
        }
        match e.walltime.as_ref().map(walltime_value) {
            Some(Ok(walltime)) => {
                let kind = TraceEventKind::Walltime {
                    alloc: e.alloc_id,
                    walltime,
                };
                self.cluster_event(ts_ms, line, kind)
            }
            Some(Err(m)) => self.skip(line, Some("walltime"), "invalid_field", m),
            None => self.skip(line, Some("walltime"), "missing_field", "the new walltime".into()),
        }
    }

    /// Registers one submission (expanding a task group into its elements `id[i]`).
    fn push_submit(&mut self, a: SubmitIn, ts_ms: i64, line: u64, dag: Option<&str>) -> Result<(), Refusal> {
        let tg = a.task_group;
        let (job, deps) =
            submit_job(&mut self.w, a, line, false).map_err(|(f, m)| (f, "invalid_field".to_string(), m))?;
        let elements: Vec<(TraceJob, Deps)> = match tg {
            None => vec![(job, deps)],
            Some(t) => {
                if t.range.end < t.range.start {
                    return Err((
                        "alloc.task_group.range".into(),
                        "invalid_field".into(),
                        format!("end {} < start {}", t.range.end, t.range.start),
                    ));
                }
                if t.range.end - t.range.start >= crate::request::MAX_TASK_GROUP {
                    return Err((
                        "alloc.task_group.range".into(),
                        "invalid_field".into(),
                        format!(
                            "{} elements; a task group has at most {}",
                            u64::from(t.range.end - t.range.start) + 1,
                            crate::request::MAX_TASK_GROUP
                        ),
                    ));
                }
                if t.concurrency == Some(0) {
                    return Err((
                        "alloc.task_group.concurrency".into(),
                        "invalid_field".into(),
                        "must be at least 1".into(),
                    ));
                }
                let group = self.next_group;
                self.next_group += 1;
                (t.range.start..=t.range.end)
                    .map(|i| {
                        let mut e = job.clone();
                        e.id = format!("{}[{i}]", job.id);
                        e.names_mut().group_name = Some(job.id.clone());
                        e.spec_mut().task_group = Some(TaskGroupRef {
                            group,
                            index: i,
                            concurrency: t.concurrency,
                        });
                        (e, deps.clone())
                    })
                    .collect()
            }
        };
        for (mut job, deps) in elements {
            if let Some(d) = dag {
                job.names_mut().dag = Some(d.to_string());
            }
            if self.by_id.insert(job.id.clone(), self.pending.len()).is_some() {
                return Err((
                    "alloc.id".into(),
                    "duplicate_id".into(),
                    format!("id `{}` already submitted", job.id),
                ));
            }
            job.spec = self.specs.share(job.spec);
            self.pending.push(Pending { ts_ms, line, job, deps });
        }
        Ok(())
    }

    /// The whole file read: completions and releases applied, events and submissions put in time
    /// order, dependencies resolved.
    fn finish(mut self) -> Workload {
        self.apply_completions();
        self.apply_releases();
        let epoch = self
            .pending
            .iter()
            .map(|p| p.ts_ms)
            .chain(self.others.iter().map(|o| o.0))
            .min()
            .unwrap_or(0);
        let mut others = std::mem::take(&mut self.others);
        others.sort_by_key(|o| (o.0, o.1));
        self.w.events = others
            .into_iter()
            .map(|(ts, line, kind)| TraceEvent {
                time: Time((ts - epoch) as u64),
                kind,
                line,
            })
            .collect();
        self.link(epoch)
    }

    /// A completion gives its submission's run time and exit.
    fn apply_completions(&mut self) {
        for (line, c) in std::mem::take(&mut self.completions) {
            let Some(&i) = self.by_id.get(&c.alloc_id) else {
                let why = format!("complete for `{}`, which was never submitted", c.alloc_id);
                self.skip(line, Some("alloc_id"), "unknown_alloc", why);
                continue;
            };
            match duration_value(&c.duration) {
                Ok(d) => {
                    self.pending[i].job.runtime = Some(d);
                    self.pending[i].job.exit_ok = c.exit == 0;
                }
                Err(m) => self.skip(line, Some("duration"), "invalid_field", m),
            }
        }
    }

    /// A release ends a claim: its run time is the time it was held in the original trace.
    fn apply_releases(&mut self) {
        for (line, ts, id) in std::mem::take(&mut self.releases) {
            match self.by_id.get(&id) {
                Some(&i) if self.pending[i].job.spec.sensitive_claim && ts >= self.pending[i].ts_ms => {
                    self.pending[i].job.runtime = Some(Duration((ts - self.pending[i].ts_ms) as u64));
                }
                _ => {
                    let why = format!("release of `{id}`, which is not an earlier claim");
                    self.skip(line, Some("alloc_id"), "unknown_claim", why)
                }
            }
        }
    }

    /// Submissions in order (by ts, then line), each dependency resolved to an earlier job; a job
    /// whose dependency is unknown or later is skipped (and so is whatever depends on it).
    fn link(mut self, epoch: i64) -> Workload {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|p| (p.ts_ms, p.line));
        let index: BTreeMap<String, usize> = pending.iter().enumerate().map(|(i, p)| (p.job.id.clone(), i)).collect();
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, p) in pending.iter().enumerate() {
            if let Some(g) = p.job.group_name() {
                groups.entry(g.to_string()).or_default().push(i);
            }
        }
        let mut dropped: BTreeSet<usize> = BTreeSet::new();
        let mut jobs: Vec<TraceJob> = Vec::with_capacity(pending.len());
        let mut new_index = vec![usize::MAX; pending.len()];
        for (i, mut p) in pending.into_iter().enumerate() {
            p.job.submit = Time((p.ts_ms - epoch) as u64);
            let mut ok = true;
            for (r, cond) in &p.deps {
                // A name refers to one job, or to every element of a task group.
                let targets: Option<Vec<usize>> = match (cond, p.job.spec.task_group) {
                    (None, Some(tg)) if groups.contains_key(r) => {
                        // corresponding: element i after element i; an index the predecessor lacks has no
                        // predecessor at all (it is released like a root, per the seed).
                        Some(
                            index
                                .get(&format!("{r}[{}]", tg.index))
                                .map(|&j| vec![j])
                                .unwrap_or_default(),
                        )
                    }
                    _ => index.get(r).map(|&j| vec![j]).or_else(|| groups.get(r).cloned()),
                };
                let cond = cond.unwrap_or(DependencyCondition::Success);
                match targets {
                    Some(ts) if ts.iter().all(|&j| j < i && !dropped.contains(&j)) => {
                        for j in ts {
                            p.job.deps.push((new_index[j], cond));
                        }
                    }
                    _ => {
                        let why = format!("depends on `{r}`, which is not submitted earlier in the trace");
                        self.skip(p.line, Some("alloc.depends_on"), "unknown_dependency", why);
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                new_index[i] = jobs.len();
                jobs.push(p.job);
            } else {
                dropped.insert(i);
            }
        }
        self.w.jobs = jobs;
        self.w
    }
}
