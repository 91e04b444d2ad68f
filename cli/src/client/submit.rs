//! `lattice submit`: an allocation from flags, or from a script's `#LATTICE`/`#SBATCH` directives.

use super::{Client, Output, print_value};
use crate::directives::{SubmitFields, parse_script};
use anyhow::{Context, Result, bail};
use serde_json::json;

#[derive(clap::Args)]
pub struct SubmitArgs {
    #[arg(long)]
    pub nodes: Option<u32>,
    #[arg(long)]
    pub walltime: Option<String>,
    /// The tenant's project.
    #[arg(long)]
    pub project: Option<String>,
    /// 0-10 (default 5): higher classes preempt lower ones and are preempted last. Also
    /// `--priority`, which takes a QOS name too (low 1, normal 4, high 7, urgent 9).
    #[arg(long, visible_alias = "priority", value_parser = crate::directives::parse_class)]
    pub preemption_class: Option<i64>,
    /// Never preempted: no checkpoint, class 7 or more (the default class then 7).
    #[arg(long, conflicts_with = "checkpoint")]
    pub no_preempt: bool,
    /// A sensitive allocation (dedicated nodes claimed at once, audited, wiped after; needs a
    /// claiming role).
    #[arg(long)]
    pub sensitive: bool,
    /// Mount the uenvs only when their images are signed with the site's uenv signing key
    /// (`environment.sign_required`; an unsigned image fails the prologue).
    #[arg(long)]
    pub sign_required: bool,
    /// A port the allocation serves, reachable within its network domain: `[NAME:]PORT[/PROTOCOL]`
    /// (`8080`, `api:8443/https`; repeatable; protocol tcp, http, https or grpc).
    #[arg(long, value_name = "[NAME:]PORT[/PROTOCOL]")]
    pub expose: Vec<String>,
    #[arg(long)]
    pub gpu_type: Option<String>,
    #[arg(long)]
    pub gpus: Option<u32>,
    /// A node feature, or `KEY=VALUE` for gpu_type, gpu_count, cpu_cores, memory_gb, topology
    /// (repeatable; `--constraint gpu_type=GH200`).
    #[arg(long)]
    pub constraint: Vec<String>,
    /// At least this many cores per node.
    #[arg(long)]
    pub cpu_cores: Option<u32>,
    /// At least this much memory per node, GB.
    #[arg(long)]
    pub memory_gb: Option<u32>,
    /// Placement: `tight` (the fewest dragonfly groups; may wait for a better placement) or `any` (never waits for topology).
    #[arg(long)]
    pub topology: Option<String>,
    /// Nodes with unified CPU-GPU memory only (GH200, MI300A).
    #[arg(long)]
    pub unified_memory: bool,
    /// An unbounded allocation (a service: runs until cancelled).
    #[arg(long, conflicts_with = "reactive")]
    pub service: bool,
    /// A reactive allocation: scales between --min-nodes and --max-nodes on --scale-metric.
    #[arg(long)]
    pub reactive: bool,
    #[arg(long)]
    pub min_nodes: Option<u32>,
    #[arg(long)]
    pub max_nodes: Option<u32>,
    /// `gpu_utilization`, `cpu_utilization`, or a metric the tasks report.
    #[arg(long)]
    pub scale_metric: Option<String>,
    #[arg(long)]
    pub scale_target: Option<String>,
    /// The scaling policy's windows, `KEY=VALUE` (`cooldown=5m`, `scale_up_window=2m`, ...).
    #[arg(long)]
    pub scale_policy: Vec<String>,
    /// `signal`, `grpc` or `shmem` (how the application takes checkpoint hints; `dmtcp` too),
    /// or the strategy: `auto`, `manual`, `none`.
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// With `--checkpoint=grpc`: the loopback port the application serves its checkpoint callback
    /// on (alone, it implies `--checkpoint=grpc`).
    #[arg(long)]
    pub checkpoint_port: Option<u16>,
    /// The checkpoint write's estimate, minutes.
    #[arg(long)]
    pub checkpoint_minutes: Option<f64>,
    /// After a node failure: `never`, `on_node_failure` (the default), `always`.
    #[arg(long)]
    pub requeue: Option<String>,
    #[arg(long)]
    pub max_requeues: Option<u32>,
    /// At most one running allocation holds this name at a time.
    #[arg(long)]
    pub mutex: Option<String>,
    /// The storage bandwidth it uses, GB/s.
    #[arg(long)]
    pub storage_gbps: Option<f64>,
    /// No home, output and checkpoint mounts by default.
    #[arg(long)]
    pub no_data_defaults: bool,
    #[arg(long)]
    pub name: Option<String>,
    /// Simulated agents only: how long the run takes.
    #[arg(long)]
    pub duration: Option<String>,
    /// A task group (job array): `0-99%20` = indices 0..99, at most 20 running at once
    /// (`$LATTICE_TASK_INDEX` in each; `${INDEX}` in the command is replaced by it).
    #[arg(long, value_parser = crate::directives::TaskGroupSpec::parse)]
    pub task_group: Option<crate::directives::TaskGroupSpec>,
    /// The software environment: a uenv, `name/version:tag` (mounted at /user-environment for the
    /// job's processes).
    #[arg(long)]
    pub uenv: Option<String>,
    /// The uenv view to activate (its environment variables).
    #[arg(long)]
    pub view: Option<String>,
    /// A second uenv with your tools (profilers, debuggers), `name/version:tag`: mounted at
    /// /user-tools beside --uenv, leaving the job's environment as it was.
    #[arg(long)]
    pub tools_uenv: Option<String>,
    /// An OCI image instead of a uenv, `NAME[:TAG]` from the nodes' image store (a container).
    #[arg(long)]
    pub image: Option<String>,
    /// A data mount, `SOURCE:TARGET[:ro]` (`s3://bucket/dataset:/data`), repeatable: the agents
    /// mount it from the site's storage for the job's processes alone.
    #[arg(long = "data-mount", value_parser = crate::directives::DataMountSpec::parse)]
    pub data_mount: Vec<crate::directives::DataMountSpec>,
    /// Start only after these end: `ID:success|failure|any,...` (`#SBATCH --dependency=afterok:ID`).
    #[arg(long = "depends-on")]
    pub depends_on: Option<String>,
    /// Federation: run it at this peer site, or `auto` (the federation broker picks by data
    /// gravity, capacity, energy price and authorization; sensitive work never leaves). Prints
    /// `SITE/ID` when it went elsewhere.
    #[arg(long)]
    pub site: Option<String>,
    /// A batch script (its directives are read), or the command after `--`.
    #[arg(trailing_var_arg = true)]
    pub command: Vec<String>,
}

impl SubmitArgs {
    /// The fields the flags set (over a script's directives), through the same names
    /// `#LATTICE` lines use.
    /// `vcluster`: the global `--vcluster` given on the command line.
    pub fn fields(&self, tenant: Option<String>, vcluster: Option<String>) -> Result<SubmitFields> {
        let class = match (self.no_preempt, self.preemption_class) {
            (true, Some(c)) if c < 7 => bail!("--no-preempt needs --preemption-class 7 or more (got {c})"),
            (true, c) => Some(c.unwrap_or(7)),
            (false, c) => c,
        };
        let mut f = SubmitFields {
            nodes: self.nodes,
            walltime: self.walltime.clone(),
            tenant,
            vcluster,
            preemption_class: class,
            gpu_type: self.gpu_type.clone(),
            gpu_count: self.gpus,
            tags: self
                .name
                .clone()
                .map(|n| [("name".to_string(), n)].into_iter().collect())
                .unwrap_or_default(),
            task_group: self.task_group,
            uenv: self.uenv.clone(),
            view: self.view.clone(),
            tools_uenv: self.tools_uenv.clone(),
            image: self.image.clone(),
            data_mounts: self.data_mount.clone(),
            depends_on: match &self.depends_on {
                Some(d) => crate::directives::parse_depends_on(d).map_err(anyhow::Error::msg)?,
                None => Vec::new(),
            },
            ..SubmitFields::default()
        };
        for c in &self.constraint {
            f.constraint(c).map_err(anyhow::Error::msg)?;
        }
        let num = |v: Option<u32>| v.map(|n| n.to_string());
        let float = |v: Option<f64>| v.map(|n| n.to_string());
        let flag = |b: bool| b.then(String::new);
        let mut set: Vec<(&str, Option<String>)> = vec![
            ("project", self.project.clone()),
            ("service", flag(self.service)),
            ("reactive", flag(self.reactive)),
            ("min-nodes", num(self.min_nodes)),
            ("max-nodes", num(self.max_nodes)),
            ("scale-metric", self.scale_metric.clone()),
            ("scale-target", self.scale_target.clone()),
            ("cpu-cores", num(self.cpu_cores)),
            ("memory-gb", num(self.memory_gb)),
            ("topology", self.topology.clone()),
            ("unified-memory", flag(self.unified_memory)),
            (
                "checkpoint",
                self.checkpoint.clone().or(self.no_preempt.then(|| "none".to_string())),
            ),
            ("checkpoint-minutes", float(self.checkpoint_minutes)),
            ("checkpoint-port", self.checkpoint_port.map(|p| p.to_string())),
            ("requeue", self.requeue.clone()),
            ("max-requeues", num(self.max_requeues)),
            ("mutex", self.mutex.clone()),
            ("storage-gbps", float(self.storage_gbps)),
            ("no-data-defaults", flag(self.no_data_defaults)),
            ("duration", self.duration.clone()),
        ];
        set.extend(self.scale_policy.iter().map(|p| ("scale-policy", Some(p.clone()))));
        for (k, v) in set {
            if let Some(v) = v {
                f.set(k, Some(&v)).map_err(anyhow::Error::msg)?;
            }
        }
        Ok(f)
    }
}

/// `[NAME:]PORT[/PROTOCOL]` as the request's `expose` entry (the name defaults to `port-PORT`).
pub fn expose(spec: &str) -> Result<serde_json::Value> {
    let (rest, protocol) = match spec.rsplit_once('/') {
        Some((r, p)) => (r, Some(p)),
        None => (spec, None),
    };
    let (name, port) = match rest.rsplit_once(':') {
        Some((n, p)) => (n.to_string(), p),
        None => (format!("port-{rest}"), rest),
    };
    let port: u32 = match port.parse() {
        Ok(p) if (1..=65535).contains(&p) => p,
        _ => bail!("--expose {spec}: the port is a number from 1 to 65535"),
    };
    let mut e = json!({"name": name, "port": port});
    if let Some(p) = protocol {
        e["protocol"] = json!(p);
    }
    Ok(e)
}

/// `lattice submit`: prints the new allocation's id (`SITE/ID` when it went to a peer site).
/// `vcluster`: the global `--vcluster` (over a script's directive); `default_vcluster`: where it goes
/// when neither says (the flag, or the config file's `vcluster:`).
pub fn run(
    client: &Client,
    output: Output,
    tenant: &Option<String>,
    (vcluster, default_vcluster): (&Option<String>, &Option<String>),
    args: SubmitArgs,
) -> Result<()> {
    // A script file: its directives, then the flags on top.
    let mut fields = SubmitFields::default();
    // Quoted for `/bin/sh -c`: the job runs exactly the arguments typed after `--`.
    let mut entrypoint = crate::directives::shell_join(&args.command);
    if let [script] = args.command.as_slice()
        && std::path::Path::new(script).is_file()
    {
        let text = std::fs::read_to_string(script).with_context(|| format!("reading {script}"))?;
        let (f, warnings) = parse_script(&text);
        for w in warnings {
            eprintln!("{w}");
        }
        fields = f;
        entrypoint = format!("bash {}", crate::directives::shell_join(&[script]));
    }
    let flags = args.fields(tenant.clone(), vcluster.clone())?;
    let f = fields.overlay(&flags);
    let Some(tenant) = f.tenant.clone() else {
        bail!("no tenant: pass --tenant, set LATTICE_TENANT, or `tenant:` in ~/.config/lattice/config.yaml");
    };
    if entrypoint.is_empty() {
        bail!("nothing to run: `lattice submit [flags] -- COMMAND` or `lattice submit SCRIPT`");
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let mut body = f.request(&tenant, &user, &entrypoint);
    if f.vcluster.is_none()
        && let Some(v) = default_vcluster
    {
        body["vcluster"] = json!(v);
    }
    if args.sensitive {
        body["sensitive"] = json!(true);
    }
    if args.sign_required {
        body["environment"]["sign_required"] = json!(true);
    }
    if !args.expose.is_empty() {
        let exposed = args.expose.iter().map(|e| expose(e)).collect::<Result<Vec<_>>>()?;
        body["connectivity"]["expose"] = json!(exposed);
    }
    if let Some(site) = &args.site {
        let v = client.call(
            "POST",
            "/api/v1/federation/allocations",
            Some(&json!({"site": site, "request": body})),
        )?;
        for w in v["routing"]["warnings"].as_array().into_iter().flatten() {
            eprintln!("warning: {}", w.as_str().unwrap_or_default());
        }
        print_value(&v, output, crate::observe::federated_submit)?;
        return Ok(());
    }
    let v = client.call("POST", "/v1/allocations", Some(&body))?;
    print_value(&v, output, |v| format!("{}\n", v["id"].as_str().unwrap_or_default()))?;
    Ok(())
}
