//! `rm-replay bench`: replays real traces with each policy in a fresh `rm-replay` process and reports
//! whole-process wall time, jobs/s and peak resident memory (from `wait4`'s rusage), the numbers the
//! speed targets are stated in. Benchmarks measure; tests never assert on time.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub trace: String,
    pub policy: String,
    pub jobs: u64,
    /// Best (minimum) wall time over the runs, seconds.
    pub wall_s_min: f64,
    /// Median wall time, seconds.
    pub wall_s_median: f64,
    pub jobs_per_s: f64,
    /// Peak resident set size, MiB (max over runs).
    pub peak_rss_mib: f64,
    pub runs: u32,
    /// For both EASY modes: the independent reference ([`crate::reference`]) on the same trace,
    /// whole process too (it schedules every job at the same time as pyss-compatible EASY; a test
    /// checks that), measured once per trace. The table prints the ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<ReferenceRow>,
}

/// The reference's best wall time and peak memory over the same number of runs.
#[derive(Clone, Debug, Serialize)]
pub struct ReferenceRow {
    pub wall_s_min: f64,
    pub peak_rss_mib: f64,
}

/// The policies the issue asks to compare.
pub const POLICIES: [(&str, &[&str]); 4] = [
    ("fcfs", &["--policy", "fcfs"]),
    ("easy", &["--policy", "easy"]),
    ("easy --compat pyss", &["--policy", "easy", "--compat", "pyss"]),
    ("conservative", &["--policy", "conservative"]),
];

pub fn default_traces(dir: &Path) -> Vec<PathBuf> {
    [
        "KTH-SP2-1996-2.1-cln.swf.gz",
        "LANL-CM5-1994-4.1-cln.swf.gz",
        "LCG.swf.gz",
        "NASA-iPSC-1993-3.1-cln.swf.gz",
    ]
    .iter()
    .map(|f| dir.join(f))
    .collect()
}

/// Runs every (trace, policy) `runs` times.
pub fn run(traces: &[PathBuf], runs: u32, mut on_row: impl FnMut(&BenchRow)) -> Result<Vec<BenchRow>> {
    let exe = std::env::current_exe().context("locating the rm-replay executable")?;
    let mut rows = Vec::new();
    for trace in traces {
        if !trace.exists() {
            bail!("{}: trace not found", trace.display());
        }
        // The reference, measured once per trace (for both EASY rows).
        let mut trace_reference: Option<ReferenceRow> = None;
        for (label, args) in POLICIES {
            let mut walls = Vec::new();
            let mut rss: u64 = 0;
            let mut jobs = 0;
            for _ in 0..runs.max(1) {
                let mut a: Vec<String> = vec!["--trace".into(), trace.display().to_string(), "--quiet".into()];
                a.extend(args.iter().map(|s| s.to_string()));
                let m = measure(&exe, &a)?;
                walls.push(m.wall_s);
                rss = rss.max(m.max_rss_kib);
                jobs = m
                    .stdout
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("jobs="))
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("child printed no job count: {}", m.stdout))?;
            }
            walls.sort_by(f64::total_cmp);
            let min = walls[0];
            let reference = if let (true, Some(r)) = (label.starts_with("easy"), &trace_reference) {
                Some(r.clone())
            } else if label.starts_with("easy") {
                let mut best = f64::INFINITY;
                let mut rss = 0;
                for _ in 0..runs.max(1) {
                    let a = vec![
                        "reference-easy".to_string(),
                        "--trace".into(),
                        trace.display().to_string(),
                    ];
                    let m = measure(&exe, &a)?;
                    best = best.min(m.wall_s);
                    rss = rss.max(m.max_rss_kib);
                }
                trace_reference = Some(ReferenceRow {
                    wall_s_min: best,
                    peak_rss_mib: (rss as f64 / 1024.0 * 10.0).round() / 10.0,
                });
                trace_reference.clone()
            } else {
                None
            };
            let row = BenchRow {
                trace: trace
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                policy: label.to_string(),
                jobs,
                wall_s_min: min,
                wall_s_median: walls[walls.len() / 2],
                jobs_per_s: (jobs as f64 / min).round(),
                peak_rss_mib: (rss as f64 / 1024.0 * 10.0).round() / 10.0,
                runs: walls.len() as u32,
                reference,
            };
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

struct Measured {
    wall_s: f64,
    max_rss_kib: u64,
    stdout: String,
}

fn measure(exe: &Path, args: &[String]) -> Result<Measured> {
    let start = std::time::Instant::now();
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {}", exe.display()))?;
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)
        .context("reading child output")?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for our own child, which nobody else reaps.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_s = start.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("rm-replay {} failed (status {status})", args.join(" "));
    }
    Ok(Measured {
        wall_s,
        max_rss_kib: usage.ru_maxrss as u64,
        stdout,
    })
}

/// Shape of the synthetic state `rm-replay bench cycle` schedules.
#[derive(Clone, Debug)]
pub struct CycleBench {
    pub pending: u32,
    pub nodes: u32,
    pub groups: u32,
    pub conformance_groups: u32,
    /// Fraction of nodes busy with running allocations before the measured cycle.
    pub busy: f64,
    pub iterations: u32,
    pub seed: u64,
}

/// Result of the cycle benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct CycleResult {
    pub mean_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub started_per_cycle: u32,
    pub reservations_per_cycle: u32,
}

/// One scheduling cycle of an `hpc-batch`-weighted backfill (depth 10) vCluster over `nodes` GH200-like
/// nodes in `groups` dragonfly groups and `conformance_groups` fingerprints, with `pending` allocations
/// queued (1-64 nodes, 10 min - 24 h walltimes, mixed priority classes and tenants) and `busy` of the
/// nodes running. Each iteration schedules a fresh copy of the same state; only `schedule()` is timed.
pub fn cycle(b: &CycleBench) -> Result<CycleResult> {
    use lattice_engine::{
        AllocSpec, ConformanceFingerprint, CostWeights, Depth, Duration, Engine, EngineConfig, GroupId,
        NodeCapabilities, NodeSpec, NodeState, Policy, PreemptionClass, ProjectId, Time, VClusterConfig,
    };
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};
    if b.nodes == 0 || b.groups == 0 || b.conformance_groups == 0 {
        bail!("--nodes, --groups and --conformance-groups must be at least 1");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(b.seed);
    let mut unit = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let caps = NodeCapabilities {
        gpu_type: Some("GH200".into()),
        gpu_count: 4,
        cpu_cores: 72,
        memory_gb: 512,
        features: ["nvme_scratch".to_string()].into(),
        power_w: 680,
        unified_memory: true,
    };
    let per_group = b.nodes.div_ceil(b.groups);
    let nodes: Vec<NodeSpec> = (0..b.nodes)
        .map(|i| {
            let g = i / per_group;
            NodeSpec {
                name: format!("n{i:05}"),
                capabilities: caps.clone(),
                group: GroupId(g),
                conformance: ConformanceFingerprint((g % b.conformance_groups) as u64),
                home_vcluster: None,
                state: NodeState::Ready,
            }
        })
        .collect();
    let policy = Policy::Backfill {
        depth: Depth::Limited(10),
    };
    let mut engine = Engine::new(EngineConfig::new(policy), nodes)?;
    let tenants: Vec<_> = (0..8).map(|t| engine.add_tenant(&format!("t{t}"))).collect();
    let vc = engine.add_vcluster("hpc-batch");
    let mut cfg = VClusterConfig::new(policy);
    cfg.weights = Some(CostWeights {
        priority: 0.15,
        wait_time: 0.20,
        fair_share: 0.20,
        topology: 0.15,
        data_readiness: 0.10,
        backlog: 0.05,
        energy: 0.0,
        checkpoint: 0.05,
        conformance: 0.10,
    });
    engine.configure_vcluster(vc, cfg)?;
    let job = |unit: &mut dyn FnMut() -> f64, t: usize| {
        let k = 1u32 << ((unit() * unit()) * 7.0) as u32;
        let walltime = Duration::from_secs(600 + (unit() * 86_400.0) as u64);
        let mut s = AllocSpec::simple(tenants[t % tenants.len()], vc, k.min(b.nodes), walltime);
        s.project = ProjectId(0);
        s.preemption_class = PreemptionClass::new((unit() * 10.0) as u8).expect("0..=9");
        s
    };
    // Fill the machine to `busy` with running allocations.
    let mut busy = 0u32;
    let mut t = 0;
    let now = Time::from_secs(3600);
    while (busy as f64) < b.busy * b.nodes as f64 {
        let s = job(&mut unit, t);
        busy += s.nodes.min;
        t += 1;
        engine.handle_submit(Time::ZERO, s)?;
    }
    engine.schedule(Time::ZERO);
    while let Some(p) = engine.poll_proposal() {
        engine.handle_commit(Time::ZERO, p.alloc)?;
    }
    for i in 0..b.pending {
        let s = job(&mut unit, i as usize);
        engine.handle_submit(now, s)?;
    }
    let mut ms = Vec::new();
    let mut last = lattice_engine::PassStats::default();
    for _ in 0..b.iterations.max(1) {
        let mut e = engine.clone();
        let t0 = std::time::Instant::now();
        last = e.schedule(now);
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        std::hint::black_box(&e);
    }
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((0.99 * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok(CycleResult {
        mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
        p99_ms: p99,
        max_ms: *ms.last().expect("non-empty"),
        started_per_cycle: last.started,
        reservations_per_cycle: last.reservations,
    })
}

/// The generated files of a `bench scale` site.
#[derive(Clone, Debug)]
pub struct ScaleSite {
    pub trace: PathBuf,
    pub inventory: PathBuf,
    pub tenants: PathBuf,
    pub profile: PathBuf,
}

/// Writes the site of `p` under `dir` (named by its parameters), unless it is there already; returns
/// its files and whether they were generated now. The trace is streamed to disk.
pub fn scale_site(p: &lattice_traces::scale::ScaleParams, dir: &Path) -> Result<(ScaleSite, bool)> {
    use lattice_traces::scale;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = p.stem();
    let site = ScaleSite {
        trace: dir.join(format!("{stem}.jsonl")),
        inventory: dir.join(format!("{stem}.inventory.yaml")),
        tenants: dir.join("scale-tenants.yaml"),
        profile: dir.join("scale-profile.yaml"),
    };
    std::fs::write(&site.inventory, scale::inventory_yaml(p))
        .with_context(|| format!("writing {}", site.inventory.display()))?;
    std::fs::write(&site.tenants, scale::tenants_yaml())
        .with_context(|| format!("writing {}", site.tenants.display()))?;
    std::fs::write(&site.profile, scale::profile_yaml())
        .with_context(|| format!("writing {}", site.profile.display()))?;
    if site.trace.is_file() {
        return Ok((site, false));
    }
    // Written under a temporary name and renamed: an interrupted run leaves no partial trace behind.
    let tmp = dir.join(format!("{stem}.jsonl.partial"));
    let file = std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    scale::write_trace(p, &mut w).with_context(|| format!("writing {}", tmp.display()))?;
    std::io::Write::flush(&mut w).with_context(|| format!("writing {}", tmp.display()))?;
    drop(w);
    std::fs::rename(&tmp, &site.trace).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok((site, true))
}

/// What `bench scale` measures for one site.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleResult {
    pub jobs: u64,
    pub passes: u64,
    /// Best whole-process wall time over the runs (reading the trace included).
    pub wall_s: f64,
    pub peak_rss_mib: f64,
    /// (arrivals + ends + scheduling passes) per second of wall time.
    pub events_per_s: f64,
}

/// Replays the site in a fresh `rm-replay` process `runs` times with the full cost function (the
/// profile's five vClusters, tenants' fair-share targets with a 7-day usage half-life).
pub fn scale(site: &ScaleSite, runs: u32) -> Result<ScaleResult> {
    let exe = std::env::current_exe().context("locating the rm-replay executable")?;
    let args: Vec<String> = [
        "--trace",
        &site.trace.display().to_string(),
        "--nodes",
        &site.inventory.display().to_string(),
        "--tenants",
        &site.tenants.display().to_string(),
        "--weights",
        &site.profile.display().to_string(),
        "--fairshare-half-life",
        "7d",
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut best: Option<ScaleResult> = None;
    for _ in 0..runs.max(1) {
        let m = measure(&exe, &args)?;
        let field = |k: &str| -> Result<u64> {
            m.stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("child printed no {k}: {}", m.stdout))
        };
        let (jobs, passes) = (field("jobs=")?, field("passes=")?);
        // The best wall time, the largest peak memory.
        let wall_s = best.as_ref().map_or(m.wall_s, |b| b.wall_s.min(m.wall_s));
        let rss = (m.max_rss_kib as f64 / 1024.0).max(best.as_ref().map_or(0.0, |b| b.peak_rss_mib));
        best = Some(ScaleResult {
            jobs,
            passes,
            wall_s,
            peak_rss_mib: rss,
            events_per_s: (2 * jobs + passes) as f64 / wall_s,
        });
    }
    Ok(best.expect("at least one run"))
}
