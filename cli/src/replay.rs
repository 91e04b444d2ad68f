//! `rm-replay` replay: options → workload + inventory → simulation → outputs.

use anyhow::{Context, Result, bail};
use lattice_engine::{Depth, Policy, VClusterConfig};
use lattice_sim::{JobRecord, SimConfig, SimResult};
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
    /// What another profile's configurations are resolved against ([`Prepared::for_profile`]).
    plan: VClusterPlan,
}

/// The trace's vClusters a profile configures (before the trace's jobs were put in the one a
/// profile names), the default policy, and the trace's own notes.
#[derive(Clone, Debug, Default)]
struct VClusterPlan {
    names: Vec<String>,
    default_policy: Option<Policy>,
    trace_notes: Vec<String>,
}

impl Prepared {
    /// The configuration and notes this replay has with `o`'s profile instead (`o` differs from
    /// the prepared options in `weights` only): what [`prepare`] would give, without reading and
    /// parsing the trace again — a sweep's points share one parsed trace.
    pub fn for_profile(&self, o: &ReplayOptions) -> Result<(SimConfig, Vec<String>)> {
        let mut notes = Vec::new();
        let (vclusters, _) = vcluster_configs(o, &self.plan.names, self.plan.default_policy, &mut notes)?;
        notes.extend(self.plan.trace_notes.iter().cloned());
        Ok((
            SimConfig {
                vclusters,
                ..self.config.clone()
            },
            notes,
        ))
    }
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
/// The vClusters a profile must configure: those the trace's jobs use (an SWF read with
/// `--vcluster-by-queue` also registers `default`, which no job may be in), or all without jobs.
fn used_vclusters(workload: &Workload) -> Vec<String> {
    let used: std::collections::BTreeSet<u32> = workload.jobs.iter().map(|j| j.spec.vcluster.0).collect();
    let all = workload.vclusters.names();
    if workload.jobs.is_empty() {
        all.to_vec()
    } else {
        (0..all.len())
            .filter(|i| used.contains(&(*i as u32)))
            .map(|i| all[i].clone())
            .collect()
    }
}

/// The profile's configurations of the trace's vClusters `names`; and, when the trace names none
/// but `default` and the profile has no `default`, the one vCluster of the profile its jobs run in.
fn vcluster_configs(
    o: &ReplayOptions,
    names: &[String],
    default_policy: Option<Policy>,
    notes: &mut Vec<String>,
) -> Result<(BTreeMap<String, VClusterConfig>, Option<String>)> {
    let mut out = BTreeMap::new();
    let Some(path) = &o.weights else {
        return Ok((out, None));
    };
    let prof = read_profile(path)?;
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
        notes.push(format!("trace jobs run in vCluster `{name}` of {}", path.display()));
        out.insert(name.clone(), entry.config(default_policy));
        return Ok((out, Some(name)));
    }
    for n in names {
        let entry = prof.vclusters.get(n).with_context(|| {
            format!(
                "{}: the trace uses vCluster `{n}`, which the profile does not define (it defines {})",
                path.display(),
                prof.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        out.insert(n.clone(), entry.config(default_policy));
    }
    Ok((out, None))
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
    let plan = VClusterPlan {
        names: used_vclusters(&workload),
        default_policy,
        trace_notes: workload.notes.clone(),
    };
    let (vclusters, chosen) = vcluster_configs(o, &plan.names, default_policy, &mut notes)?;
    if let Some(name) = chosen {
        // The trace's jobs run in the chosen vCluster.
        workload.vclusters = lattice_engine::Registry::default();
        workload.vclusters.intern(&name);
    }
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
        // Kept unless the command needs no report or tables (`rm-replay` turns it off then).
        keep_timeline: true,
        slo_wait: o.slo_wait.clone(),
    };
    // The trace's requests are handed to the engine as they are (not copied) once their ids agree.
    lattice_sim::align_ids(&mut workload, &inventory);
    Ok(Prepared {
        workload,
        inventory,
        config,
        notes,
        plan,
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
    run_with(p, &p.config, &p.notes, progress)
}

/// [`run_keeping`] with another configuration and notes ([`Prepared::for_profile`]) over the same
/// parsed trace and inventory.
pub fn run_with(
    p: &Prepared,
    config: &SimConfig,
    notes: &[String],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(SimResult, lattice_engine::Controller)> {
    let (mut r, ctl) = lattice_sim::simulate_with(&p.workload, &p.inventory, config, progress, |ctl, _| ctl)?;
    for n in notes {
        if !r.summary.notes.contains(n) {
            r.summary.notes.push(n.clone());
        }
    }
    Ok((r, ctl))
}

/// [`run_keeping`] keeping no records: each is handed to `sink` as it is built, in submission order
/// (the result's `jobs` is empty; its summary is the same).
pub fn run_streaming(
    p: &Prepared,
    progress: &mut dyn FnMut(u64, u64),
    sink: &mut dyn FnMut(&JobRecord),
) -> Result<(SimResult, lattice_engine::Controller)> {
    run_streaming_with(p, &p.config, &p.notes, progress, sink)
}

/// [`run_streaming`] with another configuration and notes, as [`run_with`].
pub fn run_streaming_with(
    p: &Prepared,
    config: &SimConfig,
    notes: &[String],
    progress: &mut dyn FnMut(u64, u64),
    sink: &mut dyn FnMut(&JobRecord),
) -> Result<(SimResult, lattice_engine::Controller)> {
    let (mut r, ctl) = lattice_sim::simulate_streaming(&p.workload, &p.inventory, config, progress, sink)?;
    for n in notes {
        if !r.summary.notes.contains(n) {
            r.summary.notes.push(n.clone());
        }
    }
    Ok((r, ctl))
}

/// `jobs.csv` written row by row as a streaming replay builds its records
/// ([`run_streaming`]), keeping only the ids of the allocations that have a start score (for
/// `scores.csv`).
pub struct JobsCsv {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    line: String,
    next: u32,
    scored: BTreeMap<u32, String>,
    error: Option<std::io::Error>,
}

impl JobsCsv {
    /// Creates `dir` and `dir/jobs.csv` with its header.
    pub fn create(dir: &Path) -> Result<JobsCsv> {
        use std::io::Write;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("jobs.csv");
        let file = std::fs::File::create(&path).with_context(|| format!("writing {}", path.display()))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
        let mut header = JobRecord::csv_header();
        header.push('\n');
        out.write_all(header.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(JobsCsv {
            path,
            out,
            line: String::new(),
            next: 0,
            scored: BTreeMap::new(),
            error: None,
        })
    }

    /// Writes the next record's row (the first write error is kept for [`JobsCsv::finish`]).
    pub fn push(&mut self, j: &JobRecord) {
        use std::io::Write;
        if j.score.is_some() {
            self.scored.insert(self.next, j.id.clone());
        }
        self.next += 1;
        if self.error.is_some() {
            return;
        }
        self.line.clear();
        j.csv_row(&mut self.line);
        if let Err(e) = self.out.write_all(self.line.as_bytes()) {
            self.error = Some(e);
        }
    }

    /// Flushes the file; gives the ids of the scored allocations by allocation index.
    pub fn finish(mut self) -> Result<BTreeMap<u32, String>> {
        use std::io::Write;
        let named = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", self.path.display());
        if let Some(e) = self.error.take() {
            return Err(named(e));
        }
        self.out.flush().map_err(named)?;
        Ok(self.scored)
    }
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

/// Writes `summary.json`, `jobs.csv` and `engine_cost.json` (and `scores.csv`, `audit.jsonl` when
/// there are any) into `dir`.
pub fn write_outputs(dir: &Path, r: &SimResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Both tables are streamed row by row: a year's replay does not hold a second copy as text.
    let mut header = lattice_sim::JobRecord::csv_header();
    header.push('\n');
    write_rows(&dir.join("jobs.csv"), &header, r.jobs.iter(), |j, out| j.csv_row(out))?;
    write_outputs_but_jobs(dir, r, &|i| r.jobs.get(i as usize).map_or("", |j| j.id.as_str()))
}

/// [`write_outputs`] less `jobs.csv` (a streaming replay wrote it, [`JobsCsv`]); `id_of(i)` names
/// allocation `i` in `scores.csv`.
pub fn write_outputs_but_jobs<'a>(dir: &Path, r: &SimResult, id_of: &dyn Fn(u32) -> &'a str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut json = serde_json::to_string_pretty(&r.summary)?;
    json.push('\n');
    std::fs::write(dir.join("summary.json"), json)
        .with_context(|| format!("writing {}/summary.json", dir.display()))?;
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
            let id = id_of(*i);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep point over the shared parsed trace ([`Prepared::for_profile`]) replays exactly as a
    /// replay prepared from scratch with that point's profile: the same jobs, summary and notes.
    #[test]
    fn a_profile_over_a_shared_trace_replays_as_prepared_afresh() {
        let profiles = concat!(env!("CARGO_MANIFEST_DIR"), "/../profiles");
        let dir = std::env::temp_dir().join(format!("lattice-for-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let other = dir.join("other.yaml");
        let text = std::fs::read_to_string(format!("{profiles}/hpc-batch.yaml")).unwrap();
        std::fs::write(
            &other,
            text.replace("fair_share: 0.20", "fair_share: 0.60")
                .replace("policy: easy", "policy: fcfs"),
        )
        .unwrap();
        let o = |weights: &Path| ReplayOptions {
            trace: None,
            inventory: None,
            procs_per_node: 1,
            policy: None,
            depth: None,
            compat: None,
            weights: Some(weights.to_path_buf()),
            vcluster: None,
            seed: 1,
            commit_latency_ms: 0,
            tenant_field: lattice_traces::TenantField::User,
            vcluster_by_queue: false,
            check_invariants: true,
            horizon: None,
            fairshare_half_life: None,
            tenants: None,
            mtbf: None,
            repair: None,
            walltime_grace: None,
            hardened_boot: None,
            vni_pool: None,
            mirror_latency: None,
            slo_wait: Vec::new(),
        };
        let base = prepare(&o(Path::new(&format!("{profiles}/hpc-batch.yaml")))).unwrap();
        let (config, notes) = base.for_profile(&o(&other)).unwrap();
        let (shared, _) = run_with(&base, &config, &notes, &mut |_, _| {}).unwrap();
        let afresh = run(&prepare(&o(&other)).unwrap(), &mut |_, _| {}).unwrap();
        let rows = |r: &SimResult| {
            let mut s = String::new();
            for j in &r.jobs {
                j.csv_row(&mut s);
            }
            s
        };
        assert_eq!(rows(&shared), rows(&afresh));
        let summary = |r: &SimResult| {
            let mut v = serde_json::to_value(&r.summary).unwrap();
            v.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.contains("cpu") && !k.contains("wall"));
            v
        };
        assert_eq!(summary(&shared), summary(&afresh));
        assert!(notes.iter().any(|n| n.contains("other.yaml")), "{notes:?}");
        // The profile mattered: the base's own run differs.
        assert_ne!(rows(&run(&base, &mut |_, _| {}).unwrap()), rows(&afresh));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
