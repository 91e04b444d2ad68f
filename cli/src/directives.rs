//! `#LATTICE` and `#SBATCH` directives of a batch script (book: "Slurm Migration"), turned into the
//! fields of a submission. Supported Slurm options map per the migration table; unsupported ones
//! (`--mem`, `--cpus-per-task`, `--mail-*`, ...) produce warnings, never errors, so existing scripts keep
//! working. Command-line flags override directives; `#LATTICE` lines override `#SBATCH` ones.

use std::collections::BTreeMap;

/// The submission fields a script (or the command line) can set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SubmitFields {
    pub nodes: Option<u32>,
    pub walltime: Option<String>,
    pub tenant: Option<String>,
    pub vcluster: Option<String>,
    pub preemption_class: Option<i64>,
    pub gpu_type: Option<String>,
    pub gpu_count: Option<u32>,
    pub features: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    /// A task group (job array): `--task-group=0-99%20` / `--array=0-99%20`.
    pub task_group: Option<TaskGroupSpec>,
    /// The software environment: `--uenv=prgenv-gnu/24.11:v1` and `--view=default`.
    pub uenv: Option<String>,
    pub view: Option<String>,
    /// A tools uenv mounted at /user-tools beside it: `--tools-uenv=profiling/2024.1`.
    pub tools_uenv: Option<String>,
    /// An OCI image instead: `--image=NAME:TAG` (or `--container-image`, pyxis' spelling).
    pub image: Option<String>,
    /// Data mounts: `--data-mount=s3://bucket/dataset:/data[:ro]` (repeatable).
    pub data_mounts: Vec<DataMountSpec>,
    /// Dependencies: (allocation id, success | failure | any), from `--depends-on=ID:COND,...` or
    /// Slurm's `--dependency=afterok:ID[:ID],afterany:ID`.
    pub depends_on: Vec<(String, String)>,
    /// The tenant's project (`--project`).
    pub project: Option<String>,
    /// `bounded` (the default), `unbounded` (`--service`), `reactive` (`--reactive`).
    pub lifecycle: Option<String>,
    /// A reactive allocation's node range, metric and target, and its policy's windows
    /// (`--scale-policy KEY=VALUE`, repeatable).
    pub min_nodes: Option<u32>,
    pub max_nodes: Option<u32>,
    pub scale_metric: Option<String>,
    pub scale_target: Option<String>,
    pub scale_policy: BTreeMap<String, String>,
    /// Per-node minimums and placement: `--cpu-cores`, `--memory-gb`, `--topology`,
    /// `--unified-memory`.
    pub cpu_cores: Option<u32>,
    pub memory_gb: Option<u32>,
    pub topology: Option<String>,
    pub unified_memory: Option<bool>,
    /// `--checkpoint=auto|manual|none|signal|grpc|shmem|dmtcp` (a mechanism means `auto` by it)
    /// and `--checkpoint-minutes` (the write's estimate).
    pub checkpoint: Option<String>,
    pub checkpoint_minutes: Option<f64>,
    /// `--checkpoint-port` (with `--checkpoint=grpc`): the application's callback port on loopback.
    pub checkpoint_port: Option<u16>,
    /// `--requeue=never|on_node_failure|always`, `--max-requeues`, `--mutex`, `--storage-gbps`.
    pub requeue: Option<String>,
    pub max_requeues: Option<u32>,
    pub mutex: Option<String>,
    pub storage_gbps: Option<f64>,
    /// `--no-data-defaults`: no home, output and checkpoint mounts by default.
    pub data_defaults: Option<bool>,
    /// Simulated agents only: how long the run takes (`--duration`).
    pub duration: Option<String>,
}

/// The checkpoint strategies and mechanisms `--checkpoint` takes.
const CHECKPOINT: [&str; 7] = ["auto", "manual", "none", "signal", "grpc", "shmem", "dmtcp"];

/// `--depends-on=a-000012:success,a-000013:any` (the condition defaults to success).
pub fn parse_depends_on(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (id, cond) = p.trim().split_once(':').unwrap_or((p.trim(), "success"));
            match cond {
                "success" | "failure" | "any" if !id.is_empty() => Ok((id.to_string(), cond.to_string())),
                _ => Err(format!("`{p}`: expected ID[:success|failure|any]")),
            }
        })
        .collect()
}

/// Slurm's `--dependency=afterok:123:124,afterany:125` (afterok → success, afternotok → failure,
/// afterany → any; `?`-separated alternatives and `singleton` are not supported).
pub fn parse_slurm_dependency(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let mut it = part.split(':');
        let cond = match it.next().unwrap_or_default() {
            "afterok" => "success",
            "afternotok" => "failure",
            "afterany" => "any",
            other => {
                return Err(format!(
                    "`{other}`: only afterok, afternotok and afterany map to Lattice"
                ));
            }
        };
        let ids: Vec<&str> = it.collect();
        if ids.is_empty() {
            return Err(format!("`{part}`: no job id"));
        }
        out.extend(ids.into_iter().map(|id| (id.to_string(), cond.to_string())));
    }
    Ok(out)
}

/// One `--data-mount=SOURCE:TARGET[:ro|:rw]` (the seed's `lattice submit --data-mount`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataMountSpec {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

impl DataMountSpec {
    /// `s3://bucket/dataset:/data`, `nfs://home/alice:/home/alice:rw`, `s3://d:/in:ro`.
    pub fn parse(s: &str) -> Result<DataMountSpec, String> {
        let usage = || format!("`{s}`: expected SOURCE:TARGET[:ro|:rw], e.g. s3://bucket/dataset:/data");
        let (rest, read_only) = match s.rsplit_once(':') {
            Some((r, "ro")) => (r, true),
            Some((r, "rw")) => (r, false),
            _ => (s, false),
        };
        // The target is the absolute path after the last `:/` that is not the scheme's `://`.
        let at = rest
            .match_indices(":/")
            .map(|(i, _)| i)
            .filter(|i| !rest[*i..].starts_with("://"))
            .last()
            .ok_or_else(usage)?;
        let (source, target) = (&rest[..at], &rest[at + 1..]);
        if source.is_empty() || !source.contains("://") {
            return Err(usage());
        }
        Ok(DataMountSpec {
            source: source.to_string(),
            target: target.to_string(),
            read_only,
        })
    }

    /// The request's `data.mounts[i]`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"source": self.source, "target": self.target,
            "access": if self.read_only { "read-only" } else { "read-write" }})
    }
}

/// A task group's indices `start..=end` and concurrency limit (`%N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskGroupSpec {
    pub start: u32,
    pub end: u32,
    pub concurrency: Option<u32>,
}

impl TaskGroupSpec {
    /// `0-99%20`, `0-99`, `7` (one element): Slurm's `--array` syntax without step or lists.
    pub fn parse(s: &str) -> Result<TaskGroupSpec, String> {
        let (range, conc) = match s.split_once('%') {
            Some((r, c)) => (
                r,
                Some(
                    c.parse::<u32>()
                        .ok()
                        .filter(|c| *c >= 1)
                        .ok_or_else(|| format!("`{s}`: the concurrency after % is a number, at least 1"))?,
                ),
            ),
            None => (s, None),
        };
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{s}`: expected START-END[%CONCURRENCY], e.g. 0-99%20"))
        };
        let (start, end) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(range)?, num(range)?),
        };
        if end < start {
            return Err(format!("`{s}`: end {end} < start {start}"));
        }
        Ok(TaskGroupSpec {
            start,
            end,
            concurrency: conc,
        })
    }

    /// The request's `task_group` block.
    pub fn to_json(self) -> serde_json::Value {
        let mut v = serde_json::json!({"range": {"start": self.start, "end": self.end}});
        if let Some(c) = self.concurrency {
            v["concurrency"] = c.into();
        }
        v
    }
}

impl SubmitFields {
    /// `other`'s set fields win.
    pub fn overlay(mut self, other: &SubmitFields) -> SubmitFields {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f.clone(); } )* };
        }
        take!(
            nodes,
            walltime,
            tenant,
            vcluster,
            preemption_class,
            gpu_type,
            gpu_count,
            ntasks,
            ntasks_per_node,
            task_group,
            uenv,
            view,
            tools_uenv,
            image,
            project,
            lifecycle,
            min_nodes,
            max_nodes,
            scale_metric,
            scale_target,
            cpu_cores,
            memory_gb,
            topology,
            unified_memory,
            checkpoint,
            checkpoint_minutes,
            checkpoint_port,
            requeue,
            max_requeues,
            mutex,
            storage_gbps,
            data_defaults,
            duration
        );
        self.scale_policy.extend(other.scale_policy.clone());
        if !other.features.is_empty() {
            self.features = other.features.clone();
        }
        self.data_mounts.extend(other.data_mounts.iter().cloned());
        self.depends_on.extend(other.depends_on.iter().cloned());
        self.tags.extend(other.tags.clone());
        self
    }

    /// One Lattice option (`#LATTICE --KEY=VALUE` or the command line's `--KEY VALUE`) of those
    /// the trace format has beyond Slurm's; `Ok(false)` when `key` is not one of them. A bad
    /// value names the option and what it takes.
    pub fn set(&mut self, key: &str, val: Option<&str>) -> Result<bool, String> {
        let text = || {
            val.map(str::to_string)
                .ok_or_else(|| format!("--{key}: a value is needed"))
        };
        fn number<T: std::str::FromStr>(key: &str, v: String, what: &str) -> Result<T, String> {
            v.parse().map_err(|_| format!("--{key}={v}: {what}"))
        }
        match key {
            "project" => self.project = Some(text()?),
            "service" => self.lifecycle = Some("unbounded".into()),
            "reactive" => self.lifecycle = Some("reactive".into()),
            "lifecycle" => match text()?.as_str() {
                l @ ("bounded" | "unbounded" | "reactive") => self.lifecycle = Some(l.into()),
                l => return Err(format!("--lifecycle={l}: bounded, unbounded or reactive")),
            },
            "min-nodes" => self.min_nodes = Some(number(key, text()?, "a node count")?),
            "max-nodes" => self.max_nodes = Some(number(key, text()?, "a node count")?),
            "scale-metric" => self.scale_metric = Some(text()?),
            "scale-target" => self.scale_target = Some(text()?),
            "scale-policy" => {
                let v = text()?;
                let (k, x) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--scale-policy={v}: KEY=VALUE, e.g. cooldown=5m"))?;
                self.scale_policy.insert(k.to_string(), x.to_string());
            }
            "cpu-cores" => self.cpu_cores = Some(number(key, text()?, "a number of cores")?),
            "memory-gb" => self.memory_gb = Some(number(key, text()?, "a number of GB")?),
            "topology" => self.topology = Some(text()?),
            "unified-memory" => self.unified_memory = Some(true),
            "checkpoint" => match text()?.as_str() {
                c if CHECKPOINT.contains(&c) => self.checkpoint = Some(c.into()),
                c => return Err(format!("--checkpoint={c}: one of {}", CHECKPOINT.join(", "))),
            },
            "checkpoint-minutes" => self.checkpoint_minutes = Some(number(key, text()?, "minutes")?),
            "checkpoint-port" => {
                let t = text()?;
                match t.parse::<u16>() {
                    Ok(p) if p > 0 => self.checkpoint_port = Some(p),
                    _ => return Err(format!("--checkpoint-port={t}: a port from 1 to 65535")),
                }
            }
            "requeue" => match text()?.as_str() {
                r @ ("never" | "on_node_failure" | "always") => self.requeue = Some(r.into()),
                r => return Err(format!("--requeue={r}: never, on_node_failure or always")),
            },
            "max-requeues" => self.max_requeues = Some(number(key, text()?, "a count")?),
            "mutex" => self.mutex = Some(text()?),
            "storage-gbps" => self.storage_gbps = Some(number(key, text()?, "GB/s")?),
            "no-data-defaults" => self.data_defaults = Some(false),
            "duration" => self.duration = Some(text()?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `--constraint` items: `KEY=VALUE` for `gpu_type`, `gpu_count`, `cpu_cores`, `memory_gb`,
    /// `topology`; anything else is a node feature.
    pub fn constraint(&mut self, item: &str) -> Result<(), String> {
        const KEYS: [&str; 5] = ["gpu_type", "gpu_count", "cpu_cores", "memory_gb", "topology"];
        // `KEY=VALUE`, or the book's `KEY:VALUE` (`--constraint=gpu_type:GH200`) for a known key.
        let split = item
            .split_once('=')
            .or_else(|| item.split_once(':').filter(|(k, _)| KEYS.contains(k)));
        let Some((k, v)) = split else {
            self.features.push(item.to_string());
            return Ok(());
        };
        let n = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("--constraint {item}: {k} takes a number"))
        };
        match k {
            "gpu_type" => self.gpu_type = Some(v.to_string()),
            "gpu_count" => self.gpu_count = Some(n(v)?),
            "cpu_cores" => self.cpu_cores = Some(n(v)?),
            "memory_gb" => self.memory_gb = Some(n(v)?),
            "topology" => self.topology = Some(v.to_string()),
            _ => {
                return Err(format!(
                    "--constraint {item}: gpu_type, gpu_count, cpu_cores, memory_gb or topology (or a feature)"
                ));
            }
        }
        Ok(())
    }

    /// The REST request (`POST /v1/allocations`) these fields make, running `entrypoint` for
    /// `tenant`'s `user`.
    pub fn request(&self, tenant: &str, user: &str, entrypoint: &str) -> serde_json::Value {
        use serde_json::json;
        let mut body = json!({
            "tenant": tenant,
            "user": user,
            "entrypoint": entrypoint,
            "resources": {"nodes": self.node_count()},
            "lifecycle": {"type": self.lifecycle.as_deref().unwrap_or("bounded")},
            "tags": self.tags,
        });
        // A bounded allocation runs an hour unless told; the others until they are cancelled.
        match (&self.walltime, self.lifecycle.as_deref()) {
            (Some(w), _) => body["lifecycle"]["walltime"] = json!(w),
            (None, None | Some("bounded")) => body["lifecycle"]["walltime"] = json!("1h"),
            _ => {}
        }
        if self.min_nodes.is_some() || self.max_nodes.is_some() {
            let n = self.node_count();
            body["resources"]["nodes"] =
                json!({"min": self.min_nodes.unwrap_or(n), "max": self.max_nodes.unwrap_or(n)});
        }
        let lifecycle = &mut body["lifecycle"];
        for (k, v) in [("min_nodes", self.min_nodes), ("max_nodes", self.max_nodes)] {
            if let (Some(v), true) = (v, self.lifecycle.as_deref() == Some("reactive")) {
                lifecycle[k] = json!(v);
            }
        }
        if let Some(m) = &self.scale_metric {
            lifecycle["metric"] = json!(m);
        }
        if let Some(t) = &self.scale_target {
            lifecycle["target"] = t.parse::<f64>().map_or_else(|_| json!(t), |x| json!(x));
        }
        if !self.scale_policy.is_empty() {
            lifecycle["scale_policy"] = self
                .scale_policy
                .iter()
                .map(|(k, v)| (k.clone(), v.parse::<f64>().map_or_else(|_| json!(v), |x| json!(x))))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        if !self.depends_on.is_empty() {
            body["depends_on"] = json!(
                self.depends_on
                    .iter()
                    .map(|(r, c)| json!({"ref": r, "condition": c}))
                    .collect::<Vec<_>>()
            );
        }
        let fields: [(&str, Option<serde_json::Value>); 9] = [
            ("project", self.project.as_ref().map(|v| json!(v))),
            ("vcluster", self.vcluster.as_ref().map(|v| json!(v))),
            ("preemption_class", self.preemption_class.map(|v| json!(v))),
            ("requeue", self.requeue.as_ref().map(|v| json!(v))),
            ("max_requeues", self.max_requeues.map(|v| json!(v))),
            ("mutex", self.mutex.as_ref().map(|v| json!(v))),
            ("storage_gbps", self.storage_gbps.map(|v| json!(v))),
            ("duration", self.duration.as_ref().map(|v| json!(v))),
            ("task_group", self.task_group.map(TaskGroupSpec::to_json)),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        let mut constraints = serde_json::Map::new();
        let wanted: [(&str, Option<serde_json::Value>); 6] = [
            ("gpu_type", self.gpu_type.as_ref().map(|v| json!(v))),
            ("gpu_count", self.gpu_count.map(|v| json!(v))),
            ("cpu_cores", self.cpu_cores.map(|v| json!(v))),
            ("memory_gb", self.memory_gb.map(|v| json!(v))),
            ("topology", self.topology.as_ref().map(|v| json!(v))),
            ("require_unified_memory", self.unified_memory.map(|v| json!(v))),
        ];
        for (k, v) in wanted {
            if let Some(v) = v {
                constraints.insert(k.into(), v);
            }
        }
        if !self.features.is_empty() {
            constraints.insert("features".into(), json!(self.features));
        }
        if !constraints.is_empty() {
            body["resources"]["constraints"] = constraints.into();
        }
        if let Some(c) = &self.checkpoint {
            let (strategy, mechanism) = match c.as_str() {
                s @ ("auto" | "manual" | "none") => (s, None),
                m => ("auto", Some(m)),
            };
            body["checkpoint"] = json!({"strategy": strategy});
            if let Some(m) = mechanism {
                body["checkpoint"]["mechanism"] = json!(m);
            }
        }
        if let Some(m) = self.checkpoint_minutes {
            if body.get("checkpoint").is_none() {
                body["checkpoint"] = json!({"strategy": "auto"});
            }
            body["checkpoint"]["estimated_minutes"] = json!(m);
        }
        if let Some(p) = self.checkpoint_port {
            if body.get("checkpoint").is_none() {
                body["checkpoint"] = json!({"strategy": "auto", "mechanism": "grpc"});
            }
            body["checkpoint"]["port"] = json!(p);
        }
        if self.image.is_some() {
            body["environment"] = json!({"image": self.image, "uenv": self.uenv});
        } else if self.uenv.is_some() || self.view.is_some() {
            body["environment"] = json!({"uenv": self.uenv, "view": self.view});
        }
        if let Some(t) = &self.tools_uenv {
            // (Beside an image too: the server refuses that, naming the field.)
            body["environment"]["tools_uenv"] = json!(t);
        }
        if !self.data_mounts.is_empty() || self.data_defaults.is_some() {
            body["data"] = json!({"mounts": self.data_mounts.iter().map(|m| m.to_json()).collect::<Vec<_>>()});
            if let Some(d) = self.data_defaults {
                body["data"]["defaults"] = json!(d);
            }
        }
        body
    }

    /// Nodes: `--nodes` wins; else `ceil(ntasks / ntasks_per_node)` (1 task per node by default).
    pub fn node_count(&self) -> u32 {
        self.nodes.unwrap_or_else(|| match self.ntasks {
            Some(t) => t.div_ceil(self.ntasks_per_node.unwrap_or(1).max(1)),
            None => 1,
        })
    }
}

/// The migration chapter's default QOS → preemption class mapping.
/// `--preemption-class` / `--priority` (the book's Slurm table: `--qos=high` is `--priority=high`):
/// a class 0-10, or a QOS name (low, normal, high, urgent).
pub fn parse_class(v: &str) -> Result<i64, String> {
    match (v.parse::<i64>(), qos_class(v)) {
        (Ok(c), _) if (0..=10).contains(&c) => Ok(c),
        (_, Some(c)) => Ok(c),
        _ => Err(format!("`{v}`: expected a class 0-10, or low, normal, high or urgent")),
    }
}

pub fn qos_class(qos: &str) -> Option<i64> {
    match qos {
        "low" => Some(1),
        "normal" => Some(4),
        "high" => Some(7),
        "urgent" => Some(9),
        _ => None,
    }
}

/// `--key=value` / `--key value` / `-N 2` options of one directive line.
fn options(line: &str) -> Vec<(String, Option<String>)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if let Some(rest) = w.strip_prefix("--") {
            match rest.split_once('=') {
                Some((k, v)) => out.push((k.to_string(), Some(v.to_string()))),
                None => {
                    let v = words.get(i + 1).filter(|n| !n.starts_with('-')).map(|v| v.to_string());
                    if v.is_some() {
                        i += 1;
                    }
                    out.push((rest.to_string(), v));
                }
            }
        } else if let Some(short) = w.strip_prefix('-') {
            let long = match short {
                "N" => "nodes",
                "n" => "ntasks",
                "t" => "time",
                "p" => "partition",
                "A" => "account",
                "J" => "job-name",
                "C" => "constraint",
                "q" => "qos",
                "d" => "dependency",
                "a" => "array",
                other => other,
            };
            let v = words.get(i + 1).map(|v| v.to_string());
            if v.is_some() {
                i += 1;
            }
            out.push((long.to_string(), v));
        }
        i += 1;
    }
    out
}

/// Slurm `--time` → a duration the API reads: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]`.
pub fn slurm_time(t: &str) -> Option<String> {
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, t),
    };
    let p: Vec<u64> = rest.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let secs = match (days, p.as_slice()) {
        (0, [m]) => m * 60,
        (0, [m, s]) => m * 60 + s,
        (_, [h]) => h * 3600,
        (_, [h, m]) => h * 3600 + m * 60,
        (_, [h, m, s]) => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(format!("{}s", days * 86400 + secs))
}

/// Parses a script's directives: the fields and the warnings for what was ignored.
pub fn parse_script(text: &str) -> (SubmitFields, Vec<String>) {
    let (mut slurm, mut lattice) = (SubmitFields::default(), SubmitFields::default());
    let mut warnings = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let (is_slurm, rest) = if let Some(r) = t.strip_prefix("#SBATCH") {
            (true, r)
        } else if let Some(r) = t.strip_prefix("#LATTICE") {
            (false, r)
        } else {
            continue;
        };
        let f = if is_slurm { &mut slurm } else { &mut lattice };
        for (k, v) in options(rest) {
            let val = v.clone().unwrap_or_default();
            let num = |s: &str| s.parse::<u32>().ok();
            match k.as_str() {
                "nodes" => f.nodes = num(val.split('-').next().unwrap_or("")),
                "ntasks" => f.ntasks = num(&val),
                "ntasks-per-node" => f.ntasks_per_node = num(&val),
                "time" if is_slurm => match slurm_time(&val) {
                    Some(w) => f.walltime = Some(w),
                    None => warnings.push(format!("#SBATCH --time={val}: not a Slurm time; ignored")),
                },
                "walltime" | "time" => f.walltime = Some(val),
                "partition" | "vcluster" => f.vcluster = Some(val),
                "account" | "tenant" => f.tenant = Some(val),
                "job-name" => {
                    f.tags.insert("name".into(), val);
                }
                "constraint" => {
                    f.features.clear();
                    for item in val.split(['&', ',']).filter(|i| !i.is_empty()) {
                        if let Err(e) = f.constraint(item) {
                            warnings.push(format!("{e}; ignored"));
                        }
                    }
                }
                "gres" => match val.strip_prefix("gpu:") {
                    Some(g) => {
                        let mut parts = g.rsplitn(2, ':');
                        f.gpu_count = parts.next().and_then(|n| n.parse().ok());
                        if let Some(model) = parts.next() {
                            f.gpu_type = Some(model.to_string());
                        }
                    }
                    None => warnings.push(format!("--gres={val} ignored (only GPUs are a resource; use --constraint)")),
                },
                "gpu-type" => f.gpu_type = Some(val),
                "gpus" => f.gpu_count = num(&val),
                "qos" => match qos_class(&val) {
                    Some(c) => f.preemption_class = Some(c),
                    None => warnings.push(format!("--qos={val}: no QOS mapping; default class kept")),
                },
                "preemption-class" | "priority" => match parse_class(&val) {
                    Ok(c) => f.preemption_class = Some(c),
                    Err(e) => warnings.push(format!("--{k}: {e}; default class kept")),
                },
                "exclusive" => {}
                "mem" | "mem-per-cpu" | "mem-per-gpu" => warnings.push(format!(
                    "Warning: #SBATCH --{k}={val} ignored (Lattice uses full-node scheduling, memory is not constrainable)"
                )),
                "cpus-per-task" => warnings.push(format!("#SBATCH --{k}={val} ignored (full-node scheduling)")),
                "mail-user" | "mail-type" => warnings.push(format!(
                    "Warning: #SBATCH --{k}={val} ignored (use `lattice watch` for event notifications)"
                )),
                "output" | "error" => warnings.push(format!(
                    "--{k}={val}: logs always go to S3; the path is only a download hint"
                )),
                "array" | "task-group" => match TaskGroupSpec::parse(&val) {
                    Ok(t) => f.task_group = Some(t),
                    Err(e) => warnings.push(format!("--{k}: {e}; ignored")),
                },
                "uenv" => f.uenv = Some(val),
                "view" => f.view = Some(val),
                "tools-uenv" => f.tools_uenv = Some(val),
                "image" | "container-image" => f.image = Some(val),
                "data-mount" => match DataMountSpec::parse(&val) {
                    Ok(m) => f.data_mounts.push(m),
                    Err(e) => warnings.push(format!("--data-mount: {e}; ignored")),
                },
                "dependency" => match parse_slurm_dependency(&val) {
                    Ok(d) => f.depends_on.extend(d),
                    Err(e) => warnings.push(format!("--dependency={val}: {e}; ignored")),
                },
                "depends-on" => match parse_depends_on(&val) {
                    Ok(d) => f.depends_on.extend(d),
                    Err(e) => warnings.push(format!("--depends-on: {e}; ignored")),
                },
                "requeue" if is_slurm => f.requeue = Some("on_node_failure".into()),
                "no-requeue" if is_slurm => f.requeue = Some("never".into()),
                other if !is_slurm => match f.set(other, v.as_deref()) {
                    Ok(true) => {}
                    Ok(false) => warnings.push(format!(
                        "--{other}{} ignored (not supported)",
                        v.map(|v| format!("={v}")).unwrap_or_default()
                    )),
                    Err(e) => warnings.push(format!("{e}; ignored")),
                },
                other => warnings.push(format!("--{other}{} ignored (not supported)", v.map(|v| format!("={v}")).unwrap_or_default())),
            }
        }
    }
    (slurm.overlay(&lattice), warnings)
}

/// Joins a command's arguments into one `/bin/sh -c` string that runs exactly them (POSIX shell
/// quoting): an argument made only of characters the shell leaves alone stays as it is, any other is
/// single-quoted (a `'` inside becomes `'\''`). `["echo", "a  b"]` → `echo 'a  b'`.
pub fn shell_join<S: AsRef<str>>(args: &[S]) -> String {
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        let a = a.as_ref();
        if i > 0 {
            out.push(' ');
        }
        let plain = !a.is_empty()
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
        if plain {
            out.push_str(a);
        } else {
            out.push('\'');
            out.push_str(&a.replace('\'', "'\\''"));
            out.push('\'');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn constraints_read_key_equals_and_the_books_key_colon_value() {
        let mut f = super::SubmitFields::default();
        f.constraint("gpu_type=GH200").unwrap();
        assert_eq!(f.gpu_type.as_deref(), Some("GH200"));
        let mut f = super::SubmitFields::default();
        f.constraint("gpu_type:MI300A").unwrap();
        f.constraint("gpu_count:4").unwrap();
        f.constraint("nvme").unwrap();
        f.constraint("site:zurich").unwrap();
        assert_eq!((f.gpu_type.as_deref(), f.gpu_count), (Some("MI300A"), Some(4)));
        assert_eq!(
            f.features,
            ["nvme", "site:zurich"],
            "an unknown key's colon stays a feature"
        );
        assert!(f.constraint("gpu_count:four").is_err());
    }

    #[test]
    fn a_checkpoint_port_is_the_grpc_mechanisms() {
        let mut f = super::SubmitFields::default();
        f.set("checkpoint-port", Some("9999")).unwrap();
        let body = f.request("t", "u", "serve");
        assert_eq!(
            body["checkpoint"],
            serde_json::json!({"strategy": "auto", "mechanism": "grpc", "port": 9999})
        );
        f.set("checkpoint", Some("grpc")).unwrap();
        assert_eq!(f.request("t", "u", "serve")["checkpoint"]["port"], 9999);
        assert!(f.set("checkpoint-port", Some("0")).is_err());
        assert!(f.set("checkpoint-port", Some("70000")).is_err());
    }

    use super::*;
    use proptest::prelude::*;

    /// What `/bin/sh -c CMD` passes to a program as its arguments.
    fn argv_seen_by_sh(cmd: &str) -> Vec<String> {
        let o = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {cmd}"))
            .output()
            .unwrap();
        let out = String::from_utf8(o.stdout).unwrap();
        out.split_terminator('\0').map(String::from).collect()
    }

    #[test]
    fn shell_join_runs_the_command_exactly_as_typed() {
        assert_eq!(shell_join(&["sleep", "20"]), "sleep 20");
        assert_eq!(shell_join(&["echo", "a  b"]), "echo 'a  b'");
        assert_eq!(shell_join(&["sh", "-c", "echo a b"]), "sh -c 'echo a b'");
        assert_eq!(shell_join(&["it's"]), "'it'\\''s'");
        assert_eq!(shell_join(&[""]), "''");
        let o = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(shell_join(&["sh", "-c", "echo a b"]))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "a b\n");
        let o = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(shell_join(&["echo", "a  b"]))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "a  b\n");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any arguments (no NUL: argv cannot hold one) reach the program unchanged.
        #[test]
        fn shell_join_round_trips_through_sh(args in proptest::collection::vec("[^\\x00]{0,12}", 1..5)) {
            prop_assert_eq!(argv_seen_by_sh(&shell_join(&args)), args);
        }
    }

    #[test]
    fn uenv_and_view_directives_set_the_environment() {
        let (f, warnings) = parse_script(
            "#!/bin/bash\n#SBATCH --uenv=prgenv-gnu/24.10:v1\n#SBATCH --view=default\n#LATTICE --uenv=prgenv-gnu/24.11:v1\nmake\n",
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(f.uenv.as_deref(), Some("prgenv-gnu/24.11:v1"));
        assert_eq!(f.view.as_deref(), Some("default"));
        let (f, warnings) =
            parse_script("#!/bin/bash\n#SBATCH --container-image=busybox:1\n#LATTICE --image=busybox:2\nls\n");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(f.image.as_deref(), Some("busybox:2"));
    }

    /// `--tools-uenv` (book: "Application Profiling Integration") reaches the request beside the
    /// uenv, and alone.
    #[test]
    fn a_tools_uenv_directive_mounts_beside_the_uenv() {
        let (f, warnings) = parse_script(
            "#!/bin/bash\n#LATTICE --uenv=prgenv-gnu/24.11:v1\n#LATTICE --tools-uenv=profiling/2024.1\nnsys profile ./train\n",
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        let body = f.request("physics", "alice", "nsys profile ./train");
        assert_eq!(
            body["environment"],
            serde_json::json!({"uenv": "prgenv-gnu/24.11:v1", "view": null, "tools_uenv": "profiling/2024.1"})
        );
        let (f, _) = parse_script("#!/bin/bash\n#LATTICE --tools-uenv=profiling/2024.1\nrun\n");
        assert_eq!(
            f.request("physics", "alice", "run")["environment"],
            serde_json::json!({"tools_uenv": "profiling/2024.1"})
        );
    }

    #[test]
    fn dependencies_from_flags_and_slurm_directives() {
        assert_eq!(
            parse_depends_on("a-1:success,a-2:any,a-3").unwrap(),
            [
                ("a-1".into(), "success".into()),
                ("a-2".into(), "any".into()),
                ("a-3".into(), "success".into())
            ]
        );
        assert!(parse_depends_on("a-1:maybe").is_err());
        let (f, warnings) = parse_script("#!/bin/bash\n#SBATCH --dependency=afterok:a-7:a-8,afterany:a-9\nrun\n");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            f.depends_on,
            [
                ("a-7".to_string(), "success".to_string()),
                ("a-8".into(), "success".into()),
                ("a-9".into(), "any".into())
            ]
        );
        let (f, warnings) = parse_script("#!/bin/bash\n#SBATCH --dependency=singleton\nrun\n");
        assert!(
            f.depends_on.is_empty() && warnings[0].contains("singleton"),
            "{warnings:?}"
        );
    }

    #[test]
    fn data_mounts_are_source_target_and_an_optional_mode() {
        let m = |s: &str| DataMountSpec::parse(s);
        assert_eq!(
            m("s3://bucket/dataset:/data").unwrap(),
            DataMountSpec {
                source: "s3://bucket/dataset".into(),
                target: "/data".into(),
                read_only: false
            }
        );
        let ro = m("nfs://home/{user}:/home/{user}:ro").unwrap();
        assert_eq!(
            (ro.source.as_str(), ro.target.as_str(), ro.read_only),
            ("nfs://home/{user}", "/home/{user}", true)
        );
        assert_eq!(ro.to_json()["access"], "read-only");
        for bad in ["s3://bucket", "/data:/x", ":/x", "s3://b:data", ""] {
            assert!(m(bad).is_err(), "{bad}");
        }
        let (f, warnings) =
            parse_script("#!/bin/bash\n#LATTICE --data-mount=s3://d/in:/in:ro\n#LATTICE --data-mount=oops\nrun\n");
        assert_eq!(f.data_mounts.len(), 1);
        assert!(warnings.len() == 1 && warnings[0].contains("oops"), "{warnings:?}");
    }

    #[test]
    fn arrays_become_task_groups() {
        let (f, warnings) = parse_script("#!/bin/bash\n#SBATCH --array=0-99%20\n#SBATCH -N 1\n./sweep\n");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            f.task_group,
            Some(TaskGroupSpec {
                start: 0,
                end: 99,
                concurrency: Some(20)
            })
        );
        assert_eq!(
            f.task_group.unwrap().to_json(),
            serde_json::json!({"range": {"start": 0, "end": 99}, "concurrency": 20})
        );
        assert_eq!(
            TaskGroupSpec::parse("7").unwrap(),
            TaskGroupSpec {
                start: 7,
                end: 7,
                concurrency: None
            }
        );
        for bad in ["9-3", "0-9%0", "a-b", "0-9%x", ""] {
            assert!(TaskGroupSpec::parse(bad).is_err(), "{bad}");
        }
        // A bad one is a warning, and the script is still submitted without it.
        let (f, warnings) = parse_script("#SBATCH --array=5-1\n");
        assert_eq!(f.task_group, None);
        assert!(warnings[0].contains("end 1 < start 5"), "{warnings:?}");
    }

    #[test]
    fn sbatch_directives_map_per_the_migration_table() {
        let script = "#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH -t 01:30:00\n#SBATCH --partition=gpu\n#SBATCH --account=ml-team\n#SBATCH --job-name=train\n#SBATCH --gres=gpu:a100:4\n#SBATCH --qos=high\n#SBATCH --mem=64G\n#SBATCH --mail-user=a@b.c\n#SBATCH --exclusive\nsrun ./train\n";
        let (f, warnings) = parse_script(script);
        assert_eq!(f.nodes, Some(4));
        assert_eq!(f.walltime.as_deref(), Some("5400s"));
        assert_eq!(
            (f.vcluster.as_deref(), f.tenant.as_deref()),
            (Some("gpu"), Some("ml-team"))
        );
        assert_eq!(f.tags.get("name").map(String::as_str), Some("train"));
        assert_eq!((f.gpu_type.as_deref(), f.gpu_count), (Some("a100"), Some(4)));
        assert_eq!(f.preemption_class, Some(7));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("--mem=64G ignored"));
        assert!(warnings[1].contains("--mail-user"));
    }

    #[test]
    fn lattice_directives_win_and_ntasks_become_nodes() {
        let script = "#SBATCH --ntasks=128\n#SBATCH --ntasks-per-node=32\n#SBATCH --time=2-00\n#LATTICE --walltime=72h\n#LATTICE --preemption-class=2\n";
        let (f, w) = parse_script(script);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(f.node_count(), 4);
        assert_eq!(f.walltime.as_deref(), Some("72h"));
        assert_eq!(f.preemption_class, Some(2));
        let (f, w) = parse_script("#LATTICE --priority=high\n");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(f.preemption_class, Some(7), "the book's --priority=high");
        let (f, w) = parse_script("#LATTICE --priority=11\n");
        assert_eq!((f.preemption_class, w.len()), (None, 1), "{w:?}");
        assert_eq!((parse_class("0"), parse_class("urgent")), (Ok(0), Ok(9)));
        let (f, _) = parse_script("#SBATCH --time=2-00\n");
        assert_eq!(f.walltime.as_deref(), Some("172800s"));
        assert_eq!(slurm_time("30"), Some("1800s".into()));
        assert_eq!(slurm_time("10:00"), Some("600s".into()));
        assert_eq!(slurm_time("x"), None);
    }

    /// The object paths of a JSON value (`a`, `a.b`, ...), not into arrays.
    fn paths(v: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        for (k, x) in v.as_object().into_iter().flatten() {
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.insert(p.clone());
            paths(x, &p, out);
        }
    }

    /// Every field of the trace format's submit event (`traces/jsonl-schema.json`, derived from
    /// the schema, so a new field fails here until the CLI can ask for it) can be asked for by a
    /// `#LATTICE` directive and by the same `lattice submit` flag: the request both make carries
    /// it, and they make the same request.
    #[test]
    fn every_trace_field_has_a_directive_and_a_flag() {
        // (trace field, where the request has it, the option that sets it).
        let options: [(&str, &str, &str); 30] = [
            ("tenant", "tenant", "--tenant=t"),
            ("project", "project", "--project=p"),
            ("vcluster", "vcluster", "--vcluster=v"),
            ("user", "user", ""),
            ("nodes", "resources.nodes", "--nodes=2"),
            (
                "gpu_type",
                "resources.constraints.gpu_type",
                "--constraint=gpu_type=GH200",
            ),
            ("constraints", "resources.constraints", "--gpus=4"),
            (
                "constraints.gpu_type",
                "resources.constraints.gpu_type",
                "--gpu-type=GH200",
            ),
            ("constraints.gpu_count", "resources.constraints.gpu_count", "--gpus=4"),
            (
                "constraints.cpu_cores",
                "resources.constraints.cpu_cores",
                "--cpu-cores=64",
            ),
            (
                "constraints.memory_gb",
                "resources.constraints.memory_gb",
                "--memory-gb=512",
            ),
            (
                "constraints.features",
                "resources.constraints.features",
                "--constraint=nvme",
            ),
            (
                "constraints.topology",
                "resources.constraints.topology",
                "--topology=tight",
            ),
            (
                "constraints.require_unified_memory",
                "resources.constraints.require_unified_memory",
                "--unified-memory",
            ),
            ("walltime", "lifecycle.walltime", "--walltime=2h"),
            ("lifecycle", "lifecycle", "--reactive"),
            ("lifecycle.type", "lifecycle.type", "--reactive"),
            ("lifecycle.walltime", "lifecycle.walltime", "--walltime=2h"),
            ("lifecycle.min_nodes", "lifecycle.min_nodes", "--min-nodes=1"),
            ("lifecycle.max_nodes", "lifecycle.max_nodes", "--max-nodes=4"),
            ("lifecycle.metric", "lifecycle.metric", "--scale-metric=queue_depth"),
            ("lifecycle.target", "lifecycle.target", "--scale-target=10"),
            (
                "lifecycle.scale_policy",
                "lifecycle.scale_policy",
                "--scale-policy=cooldown=5m",
            ),
            ("preemption_class", "preemption_class", "--preemption-class=3"),
            ("priority", "preemption_class", "--preemption-class=3"),
            ("checkpoint", "checkpoint", "--checkpoint=signal"),
            ("checkpoint.strategy", "checkpoint.strategy", "--checkpoint=signal"),
            (
                "checkpoint.estimated_minutes",
                "checkpoint.estimated_minutes",
                "--checkpoint-minutes=2",
            ),
            ("checkpoint.mechanism", "checkpoint.mechanism", "--checkpoint=signal"),
            ("depends_on", "depends_on", "--depends-on=a-000001:any"),
        ];
        let more: [(&str, &str, &str); 11] = [
            ("duration", "duration", "--duration=10m"),
            ("storage_gbps", "storage_gbps", "--storage-gbps=2.5"),
            ("requeue", "requeue", "--requeue=always"),
            ("max_requeues", "max_requeues", "--max-requeues=2"),
            ("task_group", "task_group", "--task-group=0-9%2"),
            ("task_group.range", "task_group.range", "--task-group=0-9%2"),
            ("task_group.concurrency", "task_group.concurrency", "--task-group=0-9%2"),
            ("mutex", "mutex", "--mutex=db"),
            ("data", "data", "--data-mount=s3://b/d:/data:ro"),
            ("data.mounts", "data.mounts", "--data-mount=s3://b/d:/data:ro"),
            ("data.defaults", "data.defaults", "--no-data-defaults"),
        ];
        // The API names allocations itself (a capture writes the names it gave).
        let not_asked = ["id"];
        let table: Vec<_> = options.iter().chain(more.iter()).collect();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/jsonl-schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut trace = std::collections::BTreeSet::new();
        fn fields(node: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
            for (k, v) in node["properties"].as_object().into_iter().flatten() {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                if !p.contains("scale_policy") && !p.contains("range") {
                    fields(v, &p, out);
                }
            }
        }
        fields(&schema["$defs"]["alloc"], "", &mut trace);
        let mut missing = Vec::new();
        for f in &trace {
            if !not_asked.contains(&f.as_str()) && !table.iter().any(|t| t.0 == f) {
                missing.push(f.clone());
            }
        }
        assert!(missing.is_empty(), "trace fields without a CLI option: {missing:?}");

        let opts: std::collections::BTreeSet<&str> = table.iter().map(|t| t.2).filter(|o| !o.is_empty()).collect();
        let script: String = opts.iter().map(|o| format!("#LATTICE {o}\n")).collect();
        let (f, warnings) = parse_script(&script);
        assert!(warnings.is_empty(), "{warnings:?}");
        let body = f.request(f.tenant.as_deref().unwrap(), "u", "true");
        let mut have = std::collections::BTreeSet::new();
        paths(&body, "", &mut have);
        for (field, at, _) in &table {
            assert!(have.contains(*at), "{field}: the request has no {at}: {body}");
        }
        // The request is one the API takes.
        let req: Result<lattice_control::SubmitRequest, _> = serde_json::from_value(body.clone());
        assert!(req.is_ok(), "{req:?}: {body}");

        // The command line's flags make the same request.
        #[derive(clap::Parser)]
        struct Cli {
            #[arg(long)]
            tenant: Option<String>,
            #[arg(long)]
            vcluster: Option<String>,
            #[command(flatten)]
            submit: crate::client::submit::SubmitArgs,
        }
        let mut argv = vec!["lattice".to_string()];
        for o in &opts {
            match o.split_once('=') {
                Some((k, v)) => argv.extend([k.to_string(), v.to_string()]),
                None => argv.push(o.to_string()),
            }
        }
        let cli = <Cli as clap::Parser>::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let flags = cli.submit.fields(cli.tenant.clone(), cli.vcluster.clone()).unwrap();
        assert_eq!(flags.request("t", "u", "true"), body);
    }
}
