//! `rm-replay` replay: options → workload + inventory → simulation → outputs.

use anyhow::{Context, Result, bail};
use lattice_engine::{Depth, NodeSpec, Policy};
use lattice_sim::{SimConfig, SimResult, simulate};
use lattice_traces::{SwfOptions, TenantField, Workload, parse_swf, read_inventory, read_profile, read_trace};
use std::path::{Path, PathBuf};

/// Everything a replay needs, already validated.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub trace: Option<PathBuf>,
    pub inventory: Option<PathBuf>,
    pub procs_per_node: u32,
    pub policy: Option<String>,
    pub depth: Option<u32>,
    pub compat: Option<String>,
    pub weights: Option<PathBuf>,
    pub vcluster: Option<String>,
    pub seed: u64,
    pub commit_latency_ms: u64,
    pub tenant_field: TenantField,
    pub vcluster_by_queue: bool,
    pub check_invariants: bool,
}

/// A prepared replay: the workload and nodes, before simulation.
pub struct Prepared {
    pub workload: Workload,
    pub nodes: Vec<NodeSpec>,
    pub config: SimConfig,
    /// Human notes about how options were resolved (printed, and added to the summary notes).
    pub notes: Vec<String>,
}

pub fn resolve_policy(o: &ReplayOptions) -> Result<(Policy, Vec<String>)> {
    let mut notes = Vec::new();
    let mut from_profile = None;
    if let Some(w) = &o.weights {
        let prof = read_profile(w)?;
        let vc = match &o.vcluster {
            Some(v) => prof
                .vclusters
                .get(v)
                .with_context(|| format!("{}: no vCluster `{v}` in the profile", w.display()))?,
            None if prof.vclusters.len() == 1 => prof.vclusters.values().next().expect("one entry"),
            None => bail!(
                "{}: the profile defines {} vClusters ({}); pick one with --vcluster",
                w.display(),
                prof.vclusters.len(),
                prof.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        };
        notes.push(format!(
            "weights {} loaded and validated; cost-function ordering arrives with the cost-function issue, so \
             this replay orders the queue by arrival",
            w.display()
        ));
        from_profile = vc.policy;
    }
    let compat_pyss = match o.compat.as_deref() {
        None => false,
        Some("pyss") => true,
        Some(other) => bail!("--compat {other}: the only compatibility mode is `pyss`"),
    };
    let policy = match o.policy.as_deref() {
        Some(p) => lattice_traces::parse_policy(p, o.depth).map_err(|m| anyhow::anyhow!("--policy: {m}"))?,
        None => match (o.depth, from_profile) {
            (Some(d), _) => Policy::Backfill {
                depth: Depth::Limited(d),
            },
            (None, Some(p)) => p,
            (None, None) => Policy::EASY,
        },
    };
    if compat_pyss {
        if policy != Policy::EASY {
            bail!("--compat pyss reproduces pyss's EASY; use it with --policy easy");
        }
        return Ok((Policy::PyssEasy, notes));
    }
    Ok((policy, notes))
}

pub fn prepare(o: &ReplayOptions) -> Result<Prepared> {
    let (policy, mut notes) = resolve_policy(o)?;
    let inventory = o.inventory.as_deref().map(read_inventory).transpose()?;
    let swf = SwfOptions {
        procs_per_node: o.procs_per_node,
        tenant_field: o.tenant_field,
        vcluster_by_queue: o.vcluster_by_queue,
        cluster_nodes: inventory.as_ref().map(|i| i.nodes.len() as u32),
        pyss: policy == Policy::PyssEasy,
    };
    let workload = match &o.trace {
        Some(p) => read_trace(p, &swf).with_context(|| format!("reading trace {}", p.display()))?,
        None => parse_swf(crate::DEMO_TRACE_NAME, crate::DEMO_TRACE, &swf),
    };
    let nodes = match inventory {
        Some(inv) => inv.nodes,
        None => {
            let n = workload.cluster_nodes.with_context(|| {
                format!(
                    "{}: the trace declares no cluster size (no MaxProcs/MaxNodes header); give --nodes INVENTORY",
                    workload.source
                )
            })?;
            if n == 0 {
                bail!("{}: cluster size is 0 nodes", workload.source);
            }
            lattice_traces::homogeneous(n).nodes
        }
    };
    notes.extend(workload.notes.iter().cloned());
    let config = SimConfig {
        policy,
        commit_latency: lattice_engine::Duration(o.commit_latency_ms),
        check_invariants: o.check_invariants,
        check_all_promises: false,
        seed: o.seed,
    };
    Ok(Prepared {
        workload,
        nodes,
        config,
        notes,
    })
}

pub fn run(p: &Prepared, progress: &mut dyn FnMut(u64, u64)) -> Result<SimResult> {
    let mut r = simulate(&p.workload, p.nodes.clone(), &p.config, progress)?;
    for n in &p.notes {
        if !r.summary.notes.contains(n) {
            r.summary.notes.push(n.clone());
        }
    }
    Ok(r)
}

/// Writes `summary.json`, `jobs.csv` and `engine_cost.json` into `dir`.
pub fn write_outputs(dir: &Path, r: &SimResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut json = serde_json::to_string_pretty(&r.summary)?;
    json.push('\n');
    std::fs::write(dir.join("summary.json"), json)
        .with_context(|| format!("writing {}/summary.json", dir.display()))?;
    let mut csv = String::with_capacity(r.jobs.len() * 64);
    csv.push_str(lattice_sim::JobRecord::CSV_HEADER);
    csv.push('\n');
    for j in &r.jobs {
        j.csv_row(&mut csv);
    }
    std::fs::write(dir.join("jobs.csv"), csv).with_context(|| format!("writing {}/jobs.csv", dir.display()))?;
    let mut cost = serde_json::to_string_pretty(&r.cost)?;
    cost.push('\n');
    std::fs::write(dir.join("engine_cost.json"), cost)
        .with_context(|| format!("writing {}/engine_cost.json", dir.display()))?;
    Ok(())
}
