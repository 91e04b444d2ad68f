//! `lattice-dst`: deterministic simulation testing of the control plane (see the crate's docs).

use anyhow::Result;
use clap::Parser;

/// Deterministic simulation testing: the real quorum members, mirror and controller with
/// clients on a simulated network, disk and clock, faults injected from a seed, safety checked
/// after every step and liveness once the faults heal. Prints each failing seed's reproducer;
/// the last line is `dst seeds=N failures=F digest=HEX` (same seeds ⇒ same digest). Exit 1 on
/// any failure.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// How many seeds (consecutive, from --seed).
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Steps of the faulty phase per seed (10 ms of simulated time each).
    #[arg(long, default_value_t = 2000)]
    steps: u64,
    /// `all`, `none`, or a list of: partition, asymmetric, isolate-leader, loss, delay, crash,
    /// power-loss, cluster-crash, clock-jump, isolate-agent, agent-crash, slow-agent.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Quorum members (3 or 5).
    #[arg(long, default_value_t = 3)]
    members: u64,
    /// Node agents as simulated hosts speaking the agent protocol, one node each (0: the
    /// runtime's own simulated agents run the work, on 12 nodes).
    #[arg(long, default_value_t = 6)]
    agents: usize,
    /// What the clients do: `full` (gRPC clients submitting and cancelling, a REST client
    /// submitting and cancelling DAGs, with agents an operator draining nodes, without them a
    /// claimant of sensitive nodes) or `basic`
    /// (the gRPC clients only: the workload the earliest regression seeds were found with).
    #[arg(long, default_value = "full")]
    workload: String,
    /// A test-only injected bug the run must catch: ack-without-majority, agent-no-fence,
    /// weights-leader-local, audit-drops-release (needs `--agents 0`: the sensitive claimant).
    #[arg(long)]
    bug: Option<String>,
    /// Seeds run in parallel (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one line per seed.
    #[arg(long)]
    verbose: bool,
    /// Print each seed's event log.
    #[arg(long)]
    log: bool,
    /// Stop starting seeds after the first failure.
    #[arg(long)]
    fail_fast: bool,
}

/// User errors print `error: <message>` and their causes (exit 1); usage errors are clap's (exit 2).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", lattice_engine::user_error_report(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let a = Args::parse();
    // The simulation's members log like production ones: only errors unless asked.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()))
        .init();
    if !(1..=7).contains(&a.members) {
        anyhow::bail!("--members: {}; 1 to 7", a.members);
    }
    if a.agents > 64 {
        anyhow::bail!("--agents: {}; 0 to 64", a.agents);
    }
    let opts = lattice_dst::Options {
        seeds: a.seeds,
        seed: a.seed,
        steps: a.steps,
        faults: lattice_dst::parse_faults(&a.faults).map_err(anyhow::Error::msg)?,
        members: a.members,
        agents: a.agents,
        workload: lattice_dst::Workload::parse(&a.workload).map_err(anyhow::Error::msg)?,
        bugs: a
            .bug
            .as_deref()
            .map(lattice_dst::Bugs::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?
            .unwrap_or_default(),
        threads: a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        keep_log: a.log,
        fail_fast: a.fail_fast,
    };
    let verbose = a.verbose;
    let t0 = std::time::Instant::now();
    let report = lattice_dst::run(&opts, &|r| {
        for line in &r.log {
            println!("seed {} {line}", r.seed);
        }
        if let Some(f) = &r.failure {
            println!("FAIL {f}");
        } else if verbose {
            println!(
                "seed {} ok: {} acknowledged, {} faults, {} events, {:.1} s simulated",
                r.seed, r.acked, r.faults, r.events, r.simulated_s
            );
        }
    });
    let acked: usize = report.seeds.iter().map(|s| s.acked).sum();
    let faults: usize = report.seeds.iter().map(|s| s.faults).sum();
    let (built, installed) = (
        lattice_adapters::raft_store::SNAPSHOTS_BUILT.load(std::sync::atomic::Ordering::Relaxed),
        lattice_adapters::raft_store::SNAPSHOTS_INSTALLED.load(std::sync::atomic::Ordering::Relaxed),
    );
    println!("snapshots: {built} built, {installed} installed on lagging members");
    println!(
        "{} seeds x {} steps: {acked} acknowledged submissions, {faults} faults injected, {:.1} s",
        report.seeds.len(),
        opts.steps,
        t0.elapsed().as_secs_f64()
    );
    println!("{}", report.last_line());
    if report.failures() > 0 {
        std::process::exit(1);
    }
    Ok(())
}
