//! `rm-replay` replay: options → workload + inventory → simulation → outputs.

use anyhow::{Context, Result, bail};
use lattice_engine::{Depth, Policy, VClusterConfig};
use lattice_sim::{SimConfig, SimResult};
use lattice_traces::{
    Inventory, SwfOptions, TenantField, Workload, parse_swf, read_inventory, read_profile, read_trace,
};
use std::collections::BTreeMap;
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
    /// Stop the replay at this virtual time.
    pub horizon: Option<lattice_engine::Time>,
    /// Fair-share usage half-life (hourly periods, a window of four half-lives); default 7 days.
    pub fairshare_half_life: Option<lattice_engine::Duration>,
    /// Tenant contracts YAML (quotas, share targets).
    pub tenants: Option<PathBuf>,
    /// Failure injector: mean time between failures per node, and repair time (default 4 h).
    pub mtbf: Option<lattice_engine::Duration>,
    pub repair: Option<lattice_engine::Duration>,
    /// SIGTERM→SIGKILL grace for allocations past their walltime (default 0: killed at walltime).
    pub walltime_grace: Option<lattice_engine::Duration>,
    /// Claims boot their nodes into the hardened image first, this long per node.
    pub hardened_boot: Option<lattice_engine::Duration>,
    /// Network domains modelled over this VNI pool (`None`: not modelled).
    pub vni_pool: Option<(u32, u32)>,
    /// The mirrors' latency (`None`: records durable at once).
    pub mirror_latency: Option<lattice_engine::Duration>,
    /// Target waits per class range for SLO compliance (`--slo-wait 7-10=15m`).
    pub slo_wait: Vec<(u8, u8, lattice_engine::Duration)>,
}

/// A prepared replay: the workload and nodes, before simulation.
pub struct Prepared {
    pub workload: Workload,
    pub inventory: Inventory,
    pub config: SimConfig,
    /// Human notes about how options were resolved (printed, and added to the summary notes).
    pub notes: Vec<String>,
}

/// The default policy from `--policy/--depth/--compat` (`None` when none was given).
pub fn cli_policy(o: &ReplayOptions) -> Result<Option<Policy>> {
    let compat_pyss = match o.compat.as_deref() {
        None => false,
        Some("pyss") => true,
        Some(other) => bail!("--compat {other}: the only compatibility mode is `pyss`"),
    };
    let policy = match (o.policy.as_deref(), o.depth) {
        (Some(p), d) => Some(lattice_traces::parse_policy(p, d).map_err(|m| anyhow::anyhow!("--policy: {m}"))?),
        (None, Some(d)) => Some(Policy::Backfill {
            depth: Depth::Limited(d),
        }),
        (None, None) => None,
    };
    if compat_pyss {
        if policy.is_some_and(|p| p != Policy::EASY) {
            bail!("--compat pyss reproduces pyss's EASY; use it with --policy easy");
        }
        return Ok(Some(Policy::PyssEasy));
    }
    Ok(policy)
}

/// Per-vCluster configs from the profile: every vCluster of the trace needs an entry (a trace with the
/// single vCluster `default` takes the profile's only entry, or the one named by `--vcluster`).
fn vcluster_configs(
    o: &ReplayOptions,
    workload: &mut Workload,
    default_policy: Option<Policy>,
    notes: &mut Vec<String>,
) -> Result<BTreeMap<String, VClusterConfig>> {
    let mut out = BTreeMap::new();
    let Some(path) = &o.weights else {
        return Ok(out);
    };
    let prof = read_profile(path)?;
    // Only the vClusters the trace's jobs actually use need an entry (an SWF read with
    // `--vcluster-by-queue` also registers `default`, which no job may be in).
    let used: std::collections::BTreeSet<u32> = workload.jobs.iter().map(|j| j.spec.vcluster.0).collect();
    let all = workload.vclusters.names();
    let names: Vec<String> = if workload.jobs.is_empty() {
        all.to_vec()
    } else {
        (0..all.len())
            .filter(|i| used.contains(&(*i as u32)))
            .map(|i| all[i].clone())
            .collect()
    };
    let only_default = names.len() == 1 && names[0] == "default" && !prof.vclusters.contains_key("default");
    if only_default {
        let (name, entry) = match &o.vcluster {
            Some(v) => (
                v.clone(),
                prof.vclusters
                    .get(v)
                    .with_context(|| format!("{}: no vCluster `{v}` in the profile", path.display()))?,
            ),
            None if prof.vclusters.len() == 1 => {
                let (k, v) = prof.vclusters.iter().next().expect("one entry");
                (k.clone(), v)
            }
            None => bail!(
                "{}: the profile defines {} vClusters ({}) and the trace names none; pick one with --vcluster",
                path.display(),
                prof.vclusters.len(),
                prof.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        };
        // The trace's jobs run in the chosen vCluster.
        workload.vclusters = lattice_engine::Registry::default();
        workload.vclusters.intern(&name);
        notes.push(format!("trace jobs run in vCluster `{name}` of {}", path.display()));
        out.insert(name, entry.config(default_policy));
        return Ok(out);
    }
    for n in &names {
        let entry = prof.vclusters.get(n).with_context(|| {
            format!(
                "{}: the trace uses vCluster `{n}`, which the profile does not define (it defines {})",
                path.display(),
                prof.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        out.insert(n.clone(), entry.config(default_policy));
    }
    Ok(out)
}

pub fn prepare(o: &ReplayOptions) -> Result<Prepared> {
    let default_policy = cli_policy(o)?;
    let mut notes = Vec::new();
    let inventory = o.inventory.as_deref().map(read_inventory).transpose()?;
    let swf = SwfOptions {
        procs_per_node: o.procs_per_node,
        tenant_field: o.tenant_field,
        vcluster_by_queue: o.vcluster_by_queue,
        cluster_nodes: inventory.as_ref().map(|i| i.nodes.len() as u32),
        pyss: default_policy == Some(Policy::PyssEasy),
    };
    let mut workload = match &o.trace {
        Some(p) => read_trace(p, &swf).with_context(|| format!("reading trace {}", p.display()))?,
        None => parse_swf(crate::DEMO_TRACE_NAME, crate::DEMO_TRACE, &swf),
    };
    let inventory = match inventory {
        Some(inv) => inv,
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
            lattice_traces::homogeneous(n)
        }
    };
    let vclusters = vcluster_configs(o, &mut workload, default_policy, &mut notes)?;
    notes.extend(workload.notes.iter().cloned());
    let contracts = match &o.tenants {
        Some(p) => lattice_traces::read_tenants(p)?,
        None => lattice_traces::Contracts::default(),
    };
    let config = SimConfig {
        policy: default_policy.unwrap_or(Policy::EASY),
        vclusters,
        commit_latency: lattice_engine::Duration(o.commit_latency_ms),
        check_invariants: o.check_invariants,
        check_all_promises: false,
        seed: o.seed,
        fair_share: match o.fairshare_half_life {
            Some(h) => lattice_engine::FairShareConfig::from_half_life(h, lattice_engine::Duration::from_hours(1), {
                // Remember four half-lives (usage then counts 1/16).
                (4 * h.as_millis()).div_ceil(3_600_000).max(1) as u32
            }),
            None => lattice_engine::FairShareConfig::default(),
        },
        horizon: o.horizon,
        tenants: contracts.tenants,
        projects: contracts.projects,
        sensitive_pool_size: inventory.sensitive_pool_size,
        wipe: lattice_sim::WipeModel::default(),
        storage_outages: Vec::new(),
        fairness_window: lattice_engine::Duration::from_hours(24),
        failures: o.mtbf.map(|mtbf| lattice_sim::FailureModel {
            mtbf,
            repair: o.repair.unwrap_or(lattice_engine::Duration::from_hours(4)),
        }),
        walltime_grace: o.walltime_grace.unwrap_or(lattice_engine::Duration::ZERO),
        hardened_boot: o.hardened_boot.map(|d| lattice_sim::BootModel {
            min: d,
            max: d,
            ..lattice_sim::BootModel::default()
        }),
        network: o.vni_pool.map(|(start, end)| lattice_sim::NetworkModel {
            vni_pool_start: start,
            vni_pool_end: end,
            ..lattice_sim::NetworkModel::default()
        }),
        // Every preemption is reported in a replay (the fake agents do not lose reports).
        preemption_reports: None,
        durability: o.mirror_latency.map(|d| lattice_sim::DurabilityModel {
            record_latency: d,
            end_latency: d,
        }),
        decision_log: false,
        slo_wait: o.slo_wait.clone(),
    };
    Ok(Prepared {
        workload,
        inventory,
        config,
        notes,
    })
}

pub fn run(p: &Prepared, progress: &mut dyn FnMut(u64, u64)) -> Result<SimResult> {
    run_keeping(p, progress).map(|(r, _)| r)
}

/// [`run`], handing back the replay's controller (with every allocation's state) instead of dropping
/// it: a one-shot command can leave it to the process's exit rather than free it piece by piece.
pub fn run_keeping(
    p: &Prepared,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(SimResult, lattice_engine::Controller)> {
    let (mut r, ctl) = lattice_sim::simulate_with(&p.workload, &p.inventory, &p.config, progress, |ctl, _| ctl)?;
    for n in &p.notes {
        if !r.summary.notes.contains(n) {
            r.summary.notes.push(n.clone());
        }
    }
    Ok((r, ctl))
}

/// Writes `header` and then one row per item (`row` appends it to a reused line) to `path`, buffered.
fn write_rows<T>(
    path: &Path,
    header: &str,
    items: impl Iterator<Item = T>,
    row: impl Fn(T, &mut String),
) -> Result<()> {
    use std::io::Write;
    let named = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
    let file = std::fs::File::create(path).map_err(named)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
    out.write_all(header.as_bytes()).map_err(named)?;
    let mut line = String::new();
    for item in items {
        line.clear();
        row(item, &mut line);
        out.write_all(line.as_bytes()).map_err(named)?;
    }
    out.flush().map_err(named)?;
    Ok(())
}

/// Writes `summary.json`, `jobs.csv` and `engine_cost.json` into `dir`.
pub fn write_outputs(dir: &Path, r: &SimResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut json = serde_json::to_string_pretty(&r.summary)?;
    json.push('\n');
    std::fs::write(dir.join("summary.json"), json)
        .with_context(|| format!("writing {}/summary.json", dir.display()))?;
    // Both tables are streamed row by row: a year's replay does not hold a second copy as text.
    let mut header = lattice_sim::JobRecord::csv_header();
    header.push('\n');
    write_rows(&dir.join("jobs.csv"), &header, r.jobs.iter(), |j, out| j.csv_row(out))?;
    if !r.scores.is_empty() {
        use std::fmt::Write;
        let names = lattice_engine::CostWeights::NAMES;
        let mut header = String::from("id,score");
        for n in names {
            let _ = write!(header, ",f_{n}");
        }
        for n in names {
            let _ = write!(header, ",w_{n}");
        }
        header.push('\n');
        let r6 = |x: f64| (x * 1e6).round() / 1e6;
        let row = |(i, b): &(u32, Box<lattice_engine::ScoreBreakdown>), out: &mut String| {
            let id = r.jobs.get(*i as usize).map_or("", |j| j.id.as_str());
            let _ = write!(out, "{},{}", lattice_sim::metrics::csv_field(id), r6(b.total));
            for v in b.components.iter().chain(b.weighted.iter()) {
                let _ = write!(out, ",{}", r6(*v));
            }
            out.push('\n');
        };
        write_rows(&dir.join("scores.csv"), &header, r.scores.iter(), row)?;
    }
    if !r.audit.entries().is_empty() {
        std::fs::write(dir.join("audit.jsonl"), r.audit.to_jsonl())
            .with_context(|| format!("writing {}/audit.jsonl", dir.display()))?;
    }
    let mut cost = serde_json::to_string_pretty(&r.cost)?;
    cost.push('\n');
    std::fs::write(dir.join("engine_cost.json"), cost)
        .with_context(|| format!("writing {}/engine_cost.json", dir.display()))?;
    Ok(())
}
