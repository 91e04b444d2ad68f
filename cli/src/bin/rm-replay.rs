//! `rm-replay`: replay a workload trace through the Lattice engine on a virtual clock.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use lattice_cli::{bench, compare, replay, report, sweep};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "rm-replay",
    version,
    about = "Replay a workload trace (SWF or Lattice JSONL) through the Lattice scheduler on a virtual clock",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    replay: ReplayArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure whole-process replay speed and peak memory on real traces with each policy.
    Bench(BenchArgs),
    /// Check a trace: report every problem with its line number (exit 0 when clean, 1 otherwise).
    Validate {
        file: PathBuf,
        /// SWF processors per node (for the cluster-size checks).
        #[arg(long, default_value_t = 1)]
        procs_per_node: u32,
    },
    /// Fuzz a parser of outside input (swf, jsonl, sacct, alibaba, profile, inventory, tenants,
    /// directives, or `all`) with seeded structure-aware mutations of the bundled files; prints each
    /// finding with its case and input, and `fuzz target=T cases=N panics=P findings=F` last; exit 1
    /// on any finding.
    Fuzz {
        #[arg(long, default_value = "all")]
        target: String,
        #[arg(long, default_value_t = 10_000)]
        cases: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The independent reference of pyss-compatible EASY (`lattice_cli::reference`) on an SWF trace:
    /// prints `jobs=N started=M`. `rm-replay bench` times it beside the engine.
    #[command(hide = true)]
    ReferenceEasy {
        #[arg(long)]
        trace: PathBuf,
    },
    /// Compare two earlier runs (`--output` folders): the results block of RUN with BASELINE's values and
    /// the change of each metric, overall and per vCluster.
    Compare { run: PathBuf, baseline: PathBuf },
    /// Replay the trace under many weight vectors (grid or random search) on all cores, score each run
    /// with --objective, write DIR/sweep.csv and DIR/profiles/, and name the best profile.
    Sweep(Box<SweepArgs>),
    /// Rewrite the bundled demo trace from its seeded generator.
    GenerateDemo {
        #[arg(long, default_value = "traces/library/demo-128n.swf")]
        out: PathBuf,
    },
    /// Run the regression suite: replay every trace of the manifest, check its pass/fail thresholds,
    /// print the table, write the JSON result; exit 1 when any check fails.
    Regress {
        /// The library folder holding manifest.yaml (or a manifest file).
        #[arg(long, default_value = "traces/library")]
        library: PathBuf,
        /// Run only these traces (repeat the flag).
        #[arg(long)]
        only: Vec<String>,
        /// Where to write the JSON result.
        #[arg(long, default_value = "regress.json")]
        json: PathBuf,
        /// Replays in parallel (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Run only the K-th (from 0) of N slices of the entries (entry i is in slice i mod N); the
        /// JSON then records the slice for `rm-replay regress-merge`.
        #[arg(long, value_name = "K/N")]
        shard: Option<String>,
    },
    /// Combine the JSON results of every slice of a sharded `regress --shard K/N` run: the table and
    /// the JSON of one unsharded run; exit 1 when any check fails.
    RegressMerge {
        /// The slices' JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where to write the merged JSON result.
        #[arg(long, default_value = "regress.json")]
        json: PathBuf,
    },
    /// Convert site data to the JSONL event log: a Slurm sacct dump, the Alibaba GPU pod list, or SWF.
    Import {
        #[command(subcommand)]
        kind: ImportKind,
    },
    /// Replace user, account/tenant, project and partition/vCluster names with stable keyed
    /// pseudonyms (JSONL, or SWF's numeric ids) so a trace can be shared.
    Anonymise {
        input: PathBuf,
        /// Where to write the anonymised trace.
        #[arg(long, short)]
        output: PathBuf,
        /// Secret key of the pseudonyms: the same key maps a name to the same pseudonym in every file.
        /// Default: the LATTICE_ANON_KEY environment variable.
        #[arg(long, env = "LATTICE_ANON_KEY", hide_env_values = true)]
        key: String,
    },
    /// Rewrite the regression library's generated files (six JSONL traces, inventories, tenants, the
    /// sensitive profile) from their seeded generators; the manifest is not touched.
    GenerateLibrary {
        #[arg(long, default_value = "traces/library")]
        dir: PathBuf,
        #[arg(long, default_value_t = lattice_traces::library::SEED)]
        seed: u64,
    },
    /// Write an Alps-like inventory (several thousand GH200 nodes in dragonfly groups, a few drifted
    /// fingerprints), or convert the Alibaba GPU node list to inventory YAML with --from-alibaba.
    GenerateInventory {
        #[arg(long, default_value = "profiles/inventory/alps-like.yaml")]
        out: PathBuf,
        /// Alibaba node list CSV (sn,cpu_milli,memory_mib,gpu,model) to convert instead.
        #[arg(long)]
        from_alibaba: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ImportKind {
    /// `sacct --parsable2 --allusers --format=JobID,User,Account,Partition,QOS,Submit,Start,End,Elapsed,
    /// Timelimit,NNodes,AllocTRES,State,ExitCode,Priority` output → JSONL.
    Sacct {
        input: PathBuf,
        /// The JSONL to write.
        #[arg(long, short)]
        output: PathBuf,
        /// Partition → vCluster and QOS → class mappings (`lattice-compat.yaml`); default QOS mapping
        /// low 1, normal 4, high 7, urgent 9 and no partition mapping (one vCluster).
        #[arg(long)]
        compat: Option<PathBuf>,
        /// Also write an inventory of this many identical nodes next to the output (`*.inventory.yaml`).
        #[arg(long)]
        cluster_nodes: Option<u32>,
        /// GPUs per node of that inventory.
        #[arg(long, default_value_t = 0)]
        gpus_per_node: u32,
        /// GPU model of that inventory's nodes.
        #[arg(long)]
        gpu_type: Option<String>,
    },
    /// The Alibaba GPU-cluster pod list (`openb_pod_list_*.csv`) → JSONL (+ the node list → inventory).
    Alibaba {
        input: PathBuf,
        #[arg(long, short)]
        output: PathBuf,
        /// The node list CSV (`openb_node_list_*.csv`): written as `*.inventory.yaml` next to the output.
        #[arg(long)]
        nodes_csv: Option<PathBuf>,
    },
    /// An SWF trace → JSONL (+ an inventory of its declared size next to the output).
    Swf {
        input: PathBuf,
        #[arg(long, short)]
        output: PathBuf,
        /// SWF processors per node.
        #[arg(long, default_value_t = 1)]
        procs_per_node: u32,
    },
}

#[derive(Subcommand)]
enum BenchKind {
    /// Time the HTML report of a replayed trace against a baseline (the replays are not timed).
    Report {
        /// Trace to replay (default: LANL-CM5 in --traces-dir).
        #[arg(long)]
        trace: Option<PathBuf>,
        #[arg(long, default_value = "profiles/hpc-batch.yaml")]
        weights: PathBuf,
        #[arg(long, default_value = "profiles/balanced.yaml")]
        baseline: PathBuf,
    },
    /// Time one scheduling cycle over a synthetic cluster (sizes a site's scheduler).
    Cycle {
        /// Pending allocations in the queue.
        #[arg(long, default_value_t = 1000)]
        pending: u32,
        /// Nodes in the cluster.
        #[arg(long, default_value_t = 10_000)]
        nodes: u32,
        /// Dragonfly groups.
        #[arg(long, default_value_t = 200)]
        groups: u32,
        /// Distinct conformance fingerprints.
        #[arg(long, default_value_t = 8)]
        conformance_groups: u32,
        /// Fraction of nodes running allocations when the cycle starts.
        #[arg(long, default_value_t = 0.7)]
        busy: f64,
        /// Measured cycles.
        #[arg(long, default_value_t = 100)]
        iterations: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Replay a seeded large site — by default 1,000,000 jobs over a year on 10,000 nodes in
    /// dragonfly groups, five vClusters with home nodes and their own policies and weights, lending,
    /// fair share with decay, depth-10 backfill, 85 % load — in a fresh process; last line
    /// `scale jobs=N wall_s=X peak_rss_mib=Y events_per_s=Z`.
    Scale {
        /// Job counts to run (repeat for a growth curve, e.g. --jobs 100000 --jobs 1000000).
        #[arg(long = "jobs", default_value = "1000000")]
        jobs: Vec<u64>,
        /// Nodes of the site.
        #[arg(long, default_value_t = 10_000)]
        nodes: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where the generated site (trace, inventory, tenants, profile) is written and reused.
        #[arg(long, default_value = "out/bench-scale")]
        dir: PathBuf,
    },
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    kind: Option<BenchKind>,
    /// Folder holding the bundled archive traces (KTH-SP2, LANL-CM5, LCG, NASA-iPSC).
    #[arg(long, default_value = "../shared/traces")]
    traces_dir: PathBuf,
    /// Traces to run instead of the four defaults.
    #[arg(long = "trace")]
    traces: Vec<PathBuf>,
    /// Runs per configuration (the best and the median are reported).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SweepArgs {
    #[command(subcommand)]
    action: Option<SweepAction>,
    /// Weight to vary and its range: NAME=LO:HI:STEP for a grid (repeat for several; every
    /// combination runs), NAME=LO:HI with --random. The other weights are rescaled to keep the total.
    #[arg(long = "vary", required = true)]
    vary: Vec<String>,
    /// Run only the K-th (from 0) of N deterministic slices of the points (point i is in slice i mod
    /// N) and write DIR/shard.json; `rm-replay sweep merge` combines the slices into the unsharded
    /// sweep's outputs (for a Slurm job array or a Lattice task group).
    #[arg(long, value_name = "K/N")]
    shard: Option<String>,
    /// Random search: N points drawn within the --vary ranges (seeded by --seed) instead of a grid.
    #[arg(long)]
    random: Option<usize>,
    /// What "best" means, e.g. "minimize p95_wait subject to jain >= 0.9" (metrics: summary.json keys).
    #[arg(long, default_value = "minimize p95_wait")]
    objective: String,
    /// Write the best run's profile here (deployable as is).
    #[arg(long)]
    emit_profile: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    replay: ReplayArgs,
}

#[derive(Subcommand)]
enum SweepAction {
    /// Combine the slices of a sharded sweep (`--shard K/N` folders) into DIR/sweep.csv,
    /// sweep.parquet, sensitivity.csv and profiles/ — the same as one unsharded run.
    Merge {
        /// The shard folders (each holds a shard.json and its profiles/).
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Where the merged sweep is written.
        #[arg(long)]
        output: PathBuf,
        /// Write the best run's profile here.
        #[arg(long)]
        emit_profile: Option<PathBuf>,
        /// Write the sweep's report (HTML) here.
        #[arg(long)]
        report: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum TenantFieldArg {
    User,
    Group,
}

#[derive(Args)]
struct ReplayArgs {
    /// Trace file: SWF (`.swf`, `.swf.gz`) or Lattice JSONL (`.jsonl`). Default: the bundled demo trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Node inventory YAML; default: the trace's MaxProcs/MaxNodes header, one node per --procs-per-node.
    #[arg(long = "nodes", value_name = "INVENTORY")]
    inventory: Option<PathBuf>,
    /// SWF processors per node (job nodes = ceil(processors / N)).
    #[arg(long, default_value_t = 1)]
    procs_per_node: u32,
    /// fcfs | easy | conservative | backfill (with --depth). Default: the profile's, else easy.
    #[arg(long)]
    policy: Option<String>,
    /// Backfill depth: reservations for the top N blocked allocations (0 = no backfill, 1 = EASY).
    #[arg(long)]
    depth: Option<u32>,
    /// Compatibility mode: `pyss` reproduces pyss's EASY rule by rule (with --policy easy).
    #[arg(long)]
    compat: Option<String>,
    /// Weight profile YAML (validated; picks the vCluster's policy when --policy is not given).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Which vCluster of the profile to use when it defines several.
    #[arg(long)]
    vcluster: Option<String>,
    /// Seed recorded in the summary (every random choice derives from it).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write summary.json, jobs.csv and engine_cost.json here (with --baseline, the baseline's go to
    /// DIR/baseline and the comparison to DIR/comparison.txt).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Also replay the trace with this weight profile and compare: each metric with the baseline's
    /// value and the relative change (↑/↓).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Write the site-review report here: one self-contained HTML file with charts (overlaying the
    /// baseline's when --baseline is given).
    #[arg(long)]
    report: Option<PathBuf>,
    /// With --output: also write the run's tables (computed with polars) to DIR/tables/ — jobs.parquet,
    /// intervals.parquet/.csv (utilization, queue depth, events per interval), tenant_intervals.parquet,
    /// tenants.parquet/.csv (actual vs target share), classes.csv.
    #[arg(long)]
    tables: bool,
    /// Fake quorum commit latency in milliseconds.
    #[arg(long, default_value_t = 0)]
    commit_latency_ms: u64,
    /// SWF field naming the tenant.
    #[arg(long, value_enum, default_value = "user")]
    tenant_field: TenantFieldArg,
    /// Map the SWF queue field to vClusters `q<N>` (default: one vCluster).
    #[arg(long)]
    vcluster_by_queue: bool,
    /// Run the invariant checker on every event (always on in debug builds).
    #[arg(long)]
    check: bool,
    /// Print only `jobs=N passes=N` (for scripts and the benchmark).
    #[arg(long)]
    quiet: bool,
    /// Stop the replay at this virtual time since the trace start (e.g. `7d`, `72h`).
    #[arg(long)]
    horizon: Option<String>,
    /// Fair-share usage half-life (e.g. `7d`, the default): recent usage lowers f3 more than old usage.
    #[arg(long)]
    fairshare_half_life: Option<String>,
    /// Tenant contracts YAML: max_nodes, max_concurrent_allocations, fair_share_target, burst_allowance,
    /// gpu_hours_budget, node_hours_budget per tenant.
    #[arg(long)]
    tenants: Option<PathBuf>,
    /// Inject random node failures: mean time between failures per node (e.g. `2000h`), seeded by --seed.
    #[arg(long)]
    mtbf: Option<String>,
    /// Repair time of an injected failure (default 4h).
    #[arg(long)]
    repair: Option<String>,
    /// Grace between the walltime SIGTERM and the SIGKILL (e.g. `30s`; default 0 = killed at walltime).
    #[arg(long)]
    walltime_grace: Option<String>,
    /// Sensitive claims first boot their nodes into the hardened image, taking this long per node
    /// (e.g. `5m`; nodes already running it do not boot again; a boot over 10 minutes fails the claim).
    #[arg(long)]
    hardened_boot: Option<String>,
    /// Model network domains over this VNI pool, `START-END` (the book's is `1000-4095`): a start
    /// whose domain would need a VNI the pool has not is refused and waits (a drained domain keeps
    /// its VNI 5 minutes). Default: domains not modelled.
    #[arg(long, value_parser = vni_pool_flag)]
    vni_pool: Option<(u32, u32)>,
    /// Model the quorum members' mirrors: a submission, and a dependency's end, reach a majority of
    /// their disks this long after they are written (e.g. `2s`); a start waits for both. Default:
    /// durable at once.
    #[arg(long)]
    mirror_latency: Option<String>,
    /// Target wait of a class range for SLO compliance, `CLASSES=DURATION` (`7-10=15m`, `0=1d`);
    /// repeat for several, the first match wins; other classes: 1 h (the seed's reference wait).
    #[arg(long, value_parser = slo_wait_flag)]
    slo_wait: Vec<(u8, u8, lattice_engine::Duration)>,
}

/// `--vni-pool START-END`: VNIs from 1000 up (lower ones are reserved).
fn vni_pool_flag(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("`{s}`: expected START-END, e.g. 1000-4095"))?;
    let num = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("`{x}`: {e}"));
    let (start, end) = (num(a)?, num(b)?);
    lattice_engine::VniPool::new(start, end).map_err(|e| e.to_string())?;
    Ok((start, end))
}

/// `--slo-wait CLASSES=DURATION`: a class (0-10) or a range `LO-HI`, and its target wait.
fn slo_wait_flag(s: &str) -> Result<(u8, u8, lattice_engine::Duration), String> {
    let (classes, d) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected CLASSES=DURATION, e.g. 7-10=15m"))?;
    let class = |c: &str| {
        c.trim()
            .parse::<u8>()
            .ok()
            .filter(|c| *c <= 10)
            .ok_or_else(|| format!("`{s}`: `{c}` is not a class 0-10"))
    };
    let (lo, hi) = match classes.split_once('-') {
        Some((a, b)) => (class(a)?, class(b)?),
        None => (class(classes)?, class(classes)?),
    };
    if hi < lo {
        return Err(format!("`{s}`: the range {lo}-{hi} is empty"));
    }
    let target = lattice_traces::parse_duration(d).map_err(|m| format!("`{s}`: {m}"))?;
    Ok((lo, hi, target))
}

/// User errors print `error: <message>` and their causes (exit 1), never a backtrace: those are for
/// panics. Usage errors are clap's (exit 2).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", lattice_engine::user_error_report(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes an output file, creating its folder first (`--out out/x.swf` on a fresh checkout).
fn write_file(path: &std::path::Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Bench(b)) => run_bench(b),
        Some(Cmd::GenerateDemo { out }) => {
            let text = lattice_traces::synth::generate_swf(&lattice_traces::synth::SwfGenParams::demo());
            write_file(&out, text)?;
            println!("wrote {}", out.display());
            Ok(())
        }
        Some(Cmd::Regress {
            library,
            only,
            json,
            threads,
            shard,
        }) => {
            let manifest = if library.is_dir() {
                library.join("manifest.yaml")
            } else {
                library
            };
            let shard = shard
                .as_deref()
                .map(sweep::Shard::parse)
                .transpose()
                .map_err(|m| anyhow::anyhow!("--shard {m}"))?;
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let (results, positions, entries) = lattice_cli::regress::run_shard(&manifest, &only, threads, shard)?;
            print!("{}", lattice_cli::regress::table(&results));
            let value = match shard {
                None => regress_json(&manifest.display().to_string(), &results),
                Some(sh) => serde_json::to_value(lattice_cli::regress::ShardResult {
                    manifest: manifest.display().to_string(),
                    only: only.clone(),
                    shard: sh.index,
                    of: sh.count,
                    entries,
                    positions,
                    traces: results.clone(),
                })?,
            };
            write_regress_json(&json, &value)?;
            if !results.iter().all(|r| r.pass()) {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Cmd::RegressMerge { files, json }) => {
            let (manifest, results) = lattice_cli::regress::merge(&files)?;
            print!("{}", lattice_cli::regress::table(&results));
            write_regress_json(&json, &regress_json(&manifest, &results))?;
            if !results.iter().all(|r| r.pass()) {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Cmd::Import { kind }) => run_import(kind),
        Some(Cmd::Anonymise { input, output, key }) => {
            if key.is_empty() {
                anyhow::bail!("anonymise needs a non-empty --key (or LATTICE_ANON_KEY)");
            }
            let bytes = std::fs::read(&input).with_context(|| format!("reading {}", input.display()))?;
            let text = lattice_traces::swf::decode(bytes).with_context(|| format!("reading {}", input.display()))?;
            let name = input.display().to_string();
            let jsonl = name.ends_with(".jsonl") || name.ends_with(".jsonl.gz");
            let (anon, replaced) = if jsonl {
                lattice_traces::import::anonymise_jsonl(&name, &text, &key)
            } else {
                lattice_traces::import::anonymise_swf(&name, &text, &key)
            }
            .map_err(|p| anyhow::anyhow!("{p}"))?;
            write_file(&output, anon)?;
            let counts: Vec<String> = replaced.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("wrote {} (replaced: {})", output.display(), counts.join(", "));
            Ok(())
        }
        Some(Cmd::GenerateLibrary { dir, seed }) => {
            use lattice_traces::library;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut files: Vec<(String, String)> = library::TRACES
                .iter()
                .map(|n| (format!("{n}.jsonl"), library::generate(n, seed).expect("known trace")))
                .collect();
            files.push(("library-128.yaml".into(), library::inventory_yaml(false)));
            files.push(("library-sensitive-128.yaml".into(), library::inventory_yaml(true)));
            files.push(("tenants.yaml".into(), library::tenants_yaml()));
            files.push(("sensitive-claim.profile.yaml".into(), library::sensitive_profile_yaml()));
            for (name, text) in files {
                let path = dir.join(&name);
                std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Some(Cmd::GenerateInventory { out, from_alibaba }) => {
            let text = match from_alibaba {
                None => lattice_traces::synth::alps_like_inventory(&Default::default()),
                Some(csv) => lattice_cli::report::inventory_yaml(&lattice_traces::read_inventory(&csv)?),
            };
            write_file(&out, text)?;
            println!("wrote {}", out.display());
            Ok(())
        }
        Some(Cmd::Compare { run, baseline }) => {
            let (a, b) = (compare::read_summary(&run)?, compare::read_summary(&baseline)?);
            let name = |p: &PathBuf| {
                p.file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| p.display().to_string())
            };
            print!("{}", compare::render(&name(&run), &a, &name(&baseline), &b));
            Ok(())
        }
        Some(Cmd::Validate { file, procs_per_node }) => {
            let opts = lattice_traces::SwfOptions {
                procs_per_node,
                ..Default::default()
            };
            let w = lattice_traces::read_trace_all_problems(&file, &opts)?;
            for p in &w.problems {
                println!("{p}");
            }
            let total = w.skipped_total();
            println!(
                "{}: {} jobs, {} cluster events, {} problem{}",
                file.display(),
                w.jobs.len(),
                w.events.len(),
                total,
                if total == 1 { "" } else { "s" }
            );
            if total > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Cmd::Sweep(a)) => run_sweep(*a),
        Some(Cmd::ReferenceEasy { trace }) => {
            let w = lattice_traces::read_swf(
                &trace,
                &lattice_traces::SwfOptions {
                    pyss: true,
                    ..lattice_traces::SwfOptions::default()
                },
            )?;
            let Some(procs) = w.cluster_nodes else {
                anyhow::bail!(
                    "{}: the header declares no machine size (MaxProcs/MaxNodes)",
                    trace.display()
                );
            };
            let starts = lattice_cli::reference::pyss_easy(&lattice_cli::reference::jobs(&w), procs);
            println!(
                "jobs={} started={}",
                starts.len(),
                starts.iter().filter(|s| s.is_some()).count()
            );
            Ok(())
        }
        Some(Cmd::Fuzz { target, cases, seed }) => {
            let targets: Vec<&str> = if target == "all" {
                lattice_cli::fuzz::TARGETS.to_vec()
            } else {
                vec![target.as_str()]
            };
            let mut found = 0;
            for t in targets {
                let started = std::time::Instant::now();
                let r = lattice_cli::fuzz::run(t, cases, seed).map_err(anyhow::Error::msg)?;
                for f in r.findings.iter().take(5) {
                    eprintln!(
                        "{t} case {} (seed {seed}): {}\n--- input ---\n{}\n---",
                        f.case, f.what, f.input
                    );
                }
                found += r.findings.len();
                println!(
                    "fuzz target={t} cases={} refused={} panics={} findings={} wall_s={:.1}",
                    r.cases,
                    r.refused,
                    r.panics,
                    r.findings.len(),
                    started.elapsed().as_secs_f64()
                );
            }
            if found > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        None => run_replay(cli.replay),
    }
}

fn options(a: &ReplayArgs) -> Result<replay::ReplayOptions> {
    Ok(replay::ReplayOptions {
        trace: a.trace.clone(),
        inventory: a.inventory.clone(),
        procs_per_node: a.procs_per_node,
        policy: a.policy.clone(),
        depth: a.depth,
        compat: a.compat.clone(),
        weights: a.weights.clone(),
        vcluster: a.vcluster.clone(),
        seed: a.seed,
        commit_latency_ms: a.commit_latency_ms,
        tenant_field: match a.tenant_field {
            TenantFieldArg::User => lattice_traces::TenantField::User,
            TenantFieldArg::Group => lattice_traces::TenantField::Group,
        },
        vcluster_by_queue: a.vcluster_by_queue,
        check_invariants: a.check || cfg!(debug_assertions),
        horizon: duration_flag(&a.horizon, "--horizon")?.map(|d| lattice_engine::Time(d.as_millis())),
        fairshare_half_life: duration_flag(&a.fairshare_half_life, "--fairshare-half-life")?,
        tenants: a.tenants.clone(),
        mtbf: duration_flag(&a.mtbf, "--mtbf")?,
        repair: duration_flag(&a.repair, "--repair")?,
        walltime_grace: duration_flag(&a.walltime_grace, "--walltime-grace")?,
        hardened_boot: duration_flag(&a.hardened_boot, "--hardened-boot")?,
        vni_pool: a.vni_pool,
        mirror_latency: duration_flag(&a.mirror_latency, "--mirror-latency")?,
        slo_wait: a.slo_wait.clone(),
    })
}

/// An optional duration flag (`72h`, `30m`, ...), its errors naming the flag.
fn duration_flag(v: &Option<String>, flag: &str) -> Result<Option<lattice_engine::Duration>> {
    v.as_deref()
        .map(lattice_traces::parse_duration)
        .transpose()
        .map_err(|m| anyhow::anyhow!("{flag}: {m}"))
}

fn run_replay(a: ReplayArgs) -> Result<()> {
    let opts = options(&a)?;
    let mut prepared = replay::prepare(&opts)?;
    // Runs and point events are kept only for what draws them.
    prepared.config.keep_timeline = a.report.is_some() || a.tables;
    if !a.quiet {
        for p in &prepared.workload.problems {
            eprintln!("skipped: {p}");
        }
        let shown = prepared.workload.problems.len() as u64;
        let total = prepared.workload.skipped_total();
        if total > shown {
            eprintln!(
                "skipped: ... {} more (counts by reason are in the summary)",
                total - shown
            );
        }
    }
    let bar = (!a.quiet && std::io::stdout().is_terminal() && prepared.workload.jobs.len() > 20_000).then(|| {
        let pb = indicatif::ProgressBar::new(prepared.workload.jobs.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} jobs submitted ({per_sec}, eta {eta})")
                .expect("valid template"),
        );
        pb
    });
    let mut progress = |done: u64, _total: u64| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    };
    // Without a report or tables nothing reads the records after they are written: they go to
    // jobs.csv as they are built, and only the summary's fields of each are kept.
    let keep_records = a.report.is_some() || a.tables;
    let mut jobs_csv = match &a.output {
        Some(dir) if !keep_records => Some(replay::JobsCsv::create(dir)?),
        _ => None,
    };
    let (result, controller) = if keep_records {
        replay::run_keeping(&prepared, &mut progress)?
    } else {
        replay::run_streaming(&prepared, &mut progress, &mut |j| {
            if let Some(w) = jobs_csv.as_mut() {
                w.push(j);
            }
        })?
    };
    let scored = jobs_csv.map(replay::JobsCsv::finish).transpose()?;
    // The engine holds every allocation of the trace: freeing it piece by piece costs a replay of
    // LANL-CM5 about 6 % of its time, and the process ends right after (so does the workload's).
    std::mem::forget(controller);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.quiet {
        println!("jobs={} passes={}", result.summary.jobs, result.summary.passes);
    } else {
        let name = a
            .output
            .as_ref()
            .and_then(|d| d.file_name())
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| result.summary.policy.clone());
        print!("{}", report::render(&name, &result));
    }
    if let Some(dir) = &a.output {
        match &scored {
            Some(ids) => replay::write_outputs_but_jobs(dir, &result, &|i| ids.get(&i).map_or("", String::as_str))?,
            None => replay::write_outputs(dir, &result)?,
        }
        if !a.quiet {
            println!("Wrote {}/summary.json, jobs.csv, engine_cost.json", dir.display());
        }
        if a.tables {
            let written = lattice_reports::tables::write_tables(&dir.join("tables"), &result)?;
            if !a.quiet {
                println!("Wrote {} tables to {}/tables/", written.len(), dir.display());
            }
        }
    } else if a.tables {
        anyhow::bail!("--tables needs --output DIR");
    }
    let stem = |p: &PathBuf| {
        p.file_stem()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string())
    };
    let name = opts
        .weights
        .as_ref()
        .map(stem)
        .unwrap_or_else(|| result.summary.policy.clone());
    let mut baseline_run = None;
    if let Some(baseline) = &a.baseline {
        // The same trace and options with the baseline's weights.
        let mut bopts = opts.clone();
        bopts.weights = Some(baseline.clone());
        let base = replay::run(&replay::prepare(&bopts)?, &mut |_, _| {})?;
        let text = compare::render(
            &name,
            &serde_json::to_value(&result.summary)?,
            &stem(baseline),
            &serde_json::to_value(&base.summary)?,
        );
        print!("\n{text}");
        if let Some(dir) = &a.output {
            let bdir = dir.join("baseline");
            replay::write_outputs(&bdir, &base)?;
            std::fs::write(dir.join("comparison.txt"), &text)
                .with_context(|| format!("writing {}/comparison.txt", dir.display()))?;
            if !a.quiet {
                println!(
                    "Wrote {}/summary.json, jobs.csv, engine_cost.json and {}/comparison.txt",
                    bdir.display(),
                    dir.display()
                );
            }
        }
        baseline_run = Some((stem(baseline), base));
    }
    if let Some(path) = &a.report {
        let run = lattice_reports::Run {
            name: &name,
            result: &result,
        };
        let base = baseline_run
            .as_ref()
            .map(|(n, r)| lattice_reports::Run { name: n, result: r });
        let html = lattice_reports::render_html(&run, base.as_ref())?;
        std::fs::write(path, &html).with_context(|| format!("writing {}", path.display()))?;
        if !a.quiet {
            println!("Wrote {} ({} KiB)", path.display(), html.len() / 1024);
        }
    }
    // Left to the process's exit, as the controller is.
    std::mem::forget(result);
    std::mem::forget(prepared);
    Ok(())
}

/// The inventory written next to an import's output: `site.jsonl` → `site.inventory.yaml`.
fn inventory_path(output: &std::path::Path) -> PathBuf {
    let stem = output
        .file_name()
        .map(|f| {
            f.to_string_lossy()
                .trim_end_matches(".gz")
                .trim_end_matches(".jsonl")
                .to_string()
        })
        .unwrap_or_else(|| "trace".into());
    output.with_file_name(format!("{stem}.inventory.yaml"))
}

fn run_import(kind: ImportKind) -> Result<()> {
    let write = |output: &PathBuf, imp: &lattice_traces::import::Imported| -> Result<()> {
        write_file(output, &imp.jsonl)?;
        for p in &imp.problems {
            eprintln!("{p}");
        }
        for n in &imp.notes {
            println!("note: {n}");
        }
        println!("{}: {}", output.display(), imp.summary());
        Ok(())
    };
    let write_inventory = |output: &PathBuf, text: String| -> Result<()> {
        let path = inventory_path(output);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        Ok(())
    };
    match kind {
        ImportKind::Sacct {
            input,
            output,
            compat,
            cluster_nodes,
            gpus_per_node,
            gpu_type,
        } => {
            let map = match compat {
                Some(p) => lattice_traces::import::read_compat(&p)?,
                None => Default::default(),
            };
            let imp = lattice_traces::import::sacct_file(&input, &map)?;
            write(&output, &imp)?;
            if let Some(n) = cluster_nodes {
                let mut text = format!(
                    "# {n} nodes for {} (rm-replay import sacct --cluster-nodes)\nnodes:\n  - prefix: n\n    count: {n}\n",
                    input.display()
                );
                if gpus_per_node > 0 {
                    text.push_str(&format!("    gpu_count: {gpus_per_node}\n"));
                }
                if let Some(t) = gpu_type {
                    text.push_str(&format!("    gpu_type: {t}\n"));
                }
                write_inventory(&output, text)?;
            }
        }
        ImportKind::Alibaba {
            input,
            output,
            nodes_csv,
        } => {
            let imp = lattice_traces::import::alibaba_file(&input)?;
            write(&output, &imp)?;
            if let Some(csv) = nodes_csv {
                write_inventory(&output, report::inventory_yaml(&lattice_traces::read_inventory(&csv)?))?;
            }
        }
        ImportKind::Swf {
            input,
            output,
            procs_per_node,
        } => {
            let w = lattice_traces::read_swf(
                &input,
                &lattice_traces::SwfOptions {
                    procs_per_node,
                    ..Default::default()
                },
            )?;
            for p in &w.problems {
                eprintln!("{p}");
            }
            let jsonl = lattice_traces::import::workload_to_jsonl(&w);
            write_file(&output, jsonl)?;
            println!(
                "{}: {} jobs written, {} lines skipped",
                output.display(),
                w.jobs.len(),
                w.skipped_total()
            );
            if let Some(n) = w.cluster_nodes {
                write_inventory(
                    &output,
                    format!(
                        "# {n} nodes declared by {}\nnodes:\n  - prefix: n\n    count: {n}\n",
                        input.display()
                    ),
                )?;
            }
        }
    }
    Ok(())
}

/// The JSON result of a whole regression run.
fn regress_json(manifest: &str, results: &[lattice_cli::regress::TraceResult]) -> serde_json::Value {
    serde_json::json!({
        "manifest": manifest,
        "pass": results.iter().all(|r| r.pass()),
        "traces": results,
    })
}

fn write_regress_json(path: &std::path::Path, value: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn run_sweep(a: SweepArgs) -> Result<()> {
    if let Some(SweepAction::Merge {
        shards,
        output,
        emit_profile,
        report,
    }) = a.action
    {
        let started = std::time::Instant::now();
        let (runs, spec) = sweep::merge_shards(&shards, &output)?;
        let vary: Vec<sweep::Vary> = spec
            .vary
            .iter()
            .map(|v| sweep::Vary::parse(v).map_err(|m| anyhow::anyhow!("shard --vary {m}")))
            .collect::<Result<_>>()?;
        println!("merged {} shard(s)", shards.len());
        return finish_sweep(
            &runs,
            &vary,
            &spec.objective,
            &output,
            report.as_deref(),
            emit_profile.as_deref(),
            &format!("merged in {:.1} s", started.elapsed().as_secs_f64()),
        );
    }
    let Some(base) = a.replay.weights.clone() else {
        anyhow::bail!("sweep needs --weights BASE.yaml (the profile whose weights are varied)");
    };
    let Some(out) = a.replay.output.clone() else {
        anyhow::bail!("sweep needs --output DIR (for sweep.csv and the run profiles)");
    };
    let shard = a
        .shard
        .as_deref()
        .map(sweep::Shard::parse)
        .transpose()
        .map_err(|m| anyhow::anyhow!("--shard {m}"))?;
    let vary: Vec<sweep::Vary> = a
        .vary
        .iter()
        .map(|v| sweep::Vary::parse(v).map_err(|m| anyhow::anyhow!("--vary {m}")))
        .collect::<Result<_>>()?;
    let objective = sweep::Objective::parse(&a.objective).map_err(|m| anyhow::anyhow!("--objective {m}"))?;
    objective
        .check_names(&serde_json::to_value(lattice_sim::Summary::default())?)
        .map_err(|m| anyhow::anyhow!("--objective: {m}"))?;
    let points = match a.random {
        Some(n) => sweep::random(&vary, n, a.replay.seed),
        None => {
            if let Some(v) = vary.iter().find(|v| v.step.is_none()) {
                anyhow::bail!(
                    "--vary {}: a grid needs a STEP (NAME=LO:HI:STEP), or use --random N",
                    v.name()
                );
            }
            sweep::grid(&vary)
        }
    };
    sweep::check_points(&points)?;
    let opts = options(&a.replay)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mine = shard.map_or(points.len(), |sh| (0..points.len()).filter(|&i| sh.holds(i)).count());
    let bar = indicatif::ProgressBar::new(mine as u64);
    if a.replay.quiet || !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs ({elapsed}, eta {eta})")
            .expect("valid template"),
    );
    let started = std::time::Instant::now();
    let runs = sweep::run(&opts, &base, &vary, &points, &out, threads, shard, &|| bar.inc(1))?;
    bar.finish_and_clear();
    if let Some(sh) = shard {
        let spec = sweep::SweepSpec {
            vary: a.vary.clone(),
            random: a.random,
            seed: a.replay.seed,
            objective: a.objective.clone(),
            base_profile: base.display().to_string(),
            trace: a
                .replay
                .trace
                .as_ref()
                .map_or_else(String::new, |t| t.display().to_string()),
        };
        let path = sweep::write_shard(&out, sh, points.len(), &spec, &runs)?;
        println!(
            "shard {}/{}: {} of {} runs on {} threads in {:.1} s; wrote {} (combine the shards with `rm-replay sweep merge`)",
            sh.index,
            sh.count,
            runs.len(),
            points.len(),
            threads,
            started.elapsed().as_secs_f64(),
            path.display()
        );
        return Ok(());
    }
    finish_sweep(
        &runs,
        &vary,
        &a.objective,
        &out,
        a.replay.report.as_deref(),
        a.emit_profile.as_deref(),
        &format!("on {} threads in {:.1} s", threads, started.elapsed().as_secs_f64()),
    )
}

/// The outputs of a whole sweep (run at once or merged from shards): sweep.csv/.parquet, the best
/// run, the Pareto front, sensitivity.csv, the report and the best profile.
fn finish_sweep(
    runs: &[sweep::Run],
    vary: &[sweep::Vary],
    objective_text: &str,
    out: &std::path::Path,
    report: Option<&std::path::Path>,
    emit_profile: Option<&std::path::Path>,
    how: &str,
) -> Result<()> {
    let objective = sweep::Objective::parse(objective_text).map_err(|m| anyhow::anyhow!("--objective {m}"))?;
    let table = sweep::table(runs, &objective);
    std::fs::write(out.join("sweep.csv"), table).with_context(|| format!("writing {}/sweep.csv", out.display()))?;
    lattice_reports::tables::csv_to_parquet(&out.join("sweep.csv"), &out.join("sweep.parquet"))?;
    let best = sweep::best(runs, &objective).expect("a sweep has runs");
    let b = &runs[best];
    println!("{} runs {how}; table: {}/sweep.csv", runs.len(), out.display());
    let shown: Vec<String> = vary
        .iter()
        .map(|v| format!("{}={}", v.name(), b.weights.as_array()[v.weight]))
        .collect();
    println!(
        "best ({}{}): run {} [{}] -> {} = {}",
        objective_text,
        if objective.feasible(&b.summary) {
            ""
        } else {
            "; no run meets the constraints"
        },
        b.index,
        shown.join(", "),
        objective.metric,
        sweep::metric(&b.summary, &objective.metric).unwrap_or(f64::NAN)
    );
    println!("profile: {}", b.profile.display());
    let front: Vec<String> = sweep::pareto(runs)
        .iter()
        .enumerate()
        .filter(|(_, on)| **on)
        .map(|(i, _)| runs[i].index.to_string())
        .collect();
    println!("pareto front (utilization vs p95 wait): runs {}", front.join(", "));
    let sens = sweep::sensitivity(runs, vary, &objective.metric);
    let mut csv = format!("weight,value,mean_{},runs\n", objective.metric);
    println!("sensitivity (mean {} per weight value):", objective.metric);
    for (w, x, mean, n) in &sens {
        csv.push_str(&format!("{w},{x},{mean},{n}\n"));
        println!("  {w} = {x}: {mean:.1} ({n} runs)");
    }
    std::fs::write(out.join("sensitivity.csv"), csv)
        .with_context(|| format!("writing {}/sensitivity.csv", out.display()))?;
    if let Some(path) = report {
        let front = sweep::pareto(runs);
        let points: Vec<lattice_reports::SweepPoint> = runs
            .iter()
            .zip(&front)
            .enumerate()
            .map(|(i, (r, on))| lattice_reports::SweepPoint {
                run: r.index,
                utilization: sweep::metric(&r.summary, "utilization").unwrap_or(0.0),
                p95_wait_h: sweep::metric(&r.summary, "p95_wait").unwrap_or(0.0) / 3600.0,
                pareto: *on,
                best: i == best,
                label: vary
                    .iter()
                    .map(|v| format!("{}={}", v.name(), r.weights.as_array()[v.weight]))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
            .collect();
        let html = lattice_reports::render_sweep_html(
            &format!("RM-Replay sweep: {} runs, {}", runs.len(), objective_text),
            &objective.metric,
            &points,
            &sens,
        )?;
        std::fs::write(path, &html).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} ({} KiB)", path.display(), html.len() / 1024);
    }
    if let Some(dest) = emit_profile {
        std::fs::copy(&b.profile, dest).with_context(|| format!("writing {}", dest.display()))?;
        println!("wrote {}", dest.display());
    }
    Ok(())
}

fn run_bench(b: BenchArgs) -> Result<()> {
    if let Some(BenchKind::Report {
        trace,
        weights,
        baseline,
    }) = &b.kind
    {
        let trace = trace
            .clone()
            .unwrap_or_else(|| b.traces_dir.join("LANL-CM5-1994-4.1-cln.swf.gz"));
        let replay_with = |profile: &PathBuf| -> Result<lattice_sim::SimResult> {
            let cli = Cli::try_parse_from([
                "rm-replay".as_ref(),
                "--trace".as_ref(),
                trace.as_os_str(),
                "--weights".as_ref(),
                profile.as_os_str(),
            ])?;
            replay::run(&replay::prepare(&options(&cli.replay)?)?, &mut |_, _| {})
        };
        let (run, base) = (replay_with(weights)?, replay_with(baseline)?);
        let (a, bb) = (
            lattice_reports::Run {
                name: "run",
                result: &run,
            },
            lattice_reports::Run {
                name: "baseline",
                result: &base,
            },
        );
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..b.runs.max(1) {
            let t = std::time::Instant::now();
            bytes = lattice_reports::render_html(&a, Some(&bb))?.len();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{}: {} jobs, report with baseline: {} bytes",
            trace.display(),
            run.summary.jobs,
            bytes
        );
        println!(
            "report best_ms={:.1} median_ms={:.1} bytes={bytes}",
            times[0],
            times[times.len() / 2]
        );
        return Ok(());
    }
    if let Some(BenchKind::Cycle {
        pending,
        nodes,
        groups,
        conformance_groups,
        busy,
        iterations,
        seed,
    }) = b.kind
    {
        if cfg!(debug_assertions) {
            eprintln!(
                "warning: this is a debug build; benchmark with `cargo run --release --bin rm-replay -- bench cycle`"
            );
        }
        let r = bench::cycle(&bench::CycleBench {
            pending,
            nodes,
            groups,
            conformance_groups,
            busy,
            iterations,
            seed,
        })?;
        println!(
            "{nodes} nodes, {groups} groups, {conformance_groups} conformance groups, {pending} pending, {:.0}% busy: \
             {} started and {} reservations per cycle, max {:.3} ms",
            busy * 100.0,
            r.started_per_cycle,
            r.reservations_per_cycle,
            r.max_ms
        );
        println!("cycle p99_ms={:.3} mean_ms={:.3}", r.p99_ms, r.mean_ms);
        return Ok(());
    }
    if let Some(BenchKind::Scale { jobs, nodes, seed, dir }) = &b.kind {
        if cfg!(debug_assertions) {
            eprintln!(
                "warning: this is a debug build; benchmark with `cargo run --release --bin rm-replay -- bench scale`"
            );
        }
        for &n in jobs {
            let p = lattice_traces::scale::ScaleParams {
                nodes: *nodes,
                ..lattice_traces::scale::ScaleParams::site(n, *seed)
            };
            let t = std::time::Instant::now();
            let (site, fresh) = bench::scale_site(&p, dir)?;
            if fresh {
                eprintln!(
                    "generated {} ({} jobs) in {:.1} s",
                    site.trace.display(),
                    n,
                    t.elapsed().as_secs_f64()
                );
            }
            let r = bench::scale(&site, b.runs)?;
            println!(
                "scale jobs={} wall_s={:.2} peak_rss_mib={:.0} events_per_s={:.0}",
                r.jobs, r.wall_s, r.peak_rss_mib, r.events_per_s
            );
        }
        return Ok(());
    }
    let traces = if b.traces.is_empty() {
        bench::default_traces(&b.traces_dir)
    } else {
        b.traces
    };
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; benchmark with `cargo run --release --bin rm-replay -- bench`");
    }
    println!(
        "{:<32} {:<20} {:>8} {:>10} {:>10} {:>12} {:>10} {:>12}",
        "trace", "policy", "jobs", "best s", "median s", "jobs/s", "peak MiB", "reference s"
    );
    let rows = bench::run(&traces, b.runs, |r| {
        let reference = r.reference.as_ref().map_or(String::new(), |x| {
            format!(
                "{:.3} ({:.1}x, {:.1} MiB)",
                x.wall_s_min,
                r.wall_s_min / x.wall_s_min,
                x.peak_rss_mib
            )
        });
        println!(
            "{:<32} {:<20} {:>8} {:>10.3} {:>10.3} {:>12} {:>10.1} {:>12}",
            r.trace,
            r.policy,
            r.jobs,
            r.wall_s_min,
            r.wall_s_median,
            report::thousands(r.jobs_per_s as u64),
            r.peak_rss_mib,
            reference
        );
    })?;
    if let Some(p) = b.json {
        std::fs::write(&p, serde_json::to_string_pretty(&rows)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
