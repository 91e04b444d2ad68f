//! `lattice-runtime --config FILE [--bootstrap]`: one control-plane member.

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Lattice control plane: quorum member, scheduler and API")]
struct Args {
    /// Runtime configuration YAML (see runtime/config/minimal.yaml and production.yaml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Form the quorum from the configured members (first start only; ignored when state exists).
    #[arg(long)]
    bootstrap: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Measure: `raft` (commit latency p50/p99 on 3 local members, commits/s), `submit` / `submit3`
    /// (submissions/s through REST and gRPC to a 1- / 3-member quorum's leader) or `heartbeats` (N
    /// agents every 10 s from another process: the server's CPU share).
    Bench {
        kind: String,
        /// Proposals, requests or agents.
        #[arg(long, default_value_t = 2000)]
        n: usize,
        /// `heartbeats`: how long the agents heartbeat.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// `heartbeat-agents` (the child process of `heartbeats`): the server's gRPC address.
        #[arg(long)]
        target: Option<String>,
    },
    /// Deterministic simulation testing: the real quorum members, mirror and controller with
    /// clients on a simulated network, disk and clock, faults injected from a seed, safety checked
    /// after every step and liveness once the faults heal. Prints each failing seed's reproducer;
    /// the last line is `dst seeds=N failures=F digest=HEX` (same seeds ⇒ same digest). Exit 1 on
    /// any failure.
    Dst {
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
        /// submitting and cancelling DAGs, and with agents an operator draining nodes) or `basic`
        /// (the gRPC clients only: the workload the earliest regression seeds were found with).
        #[arg(long, default_value = "full")]
        workload: String,
        /// A test-only injected bug the run must catch: ack-without-majority, agent-no-fence.
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
    },
}

/// User errors print `error: <message>` and their causes (exit 1), never a backtrace: those are for
/// panics. Usage errors are clap's (exit 2).
#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", lattice_engine::user_error_report(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let args = Args::parse();
    // The simulation's members log like production ones: only errors unless asked.
    let quiet = matches!(args.cmd, Some(Cmd::Dst { .. }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| if quiet { "off" } else { "info,openraft=warn" }.into()),
        )
        .init();
    if let Some(Cmd::Dst {
        seeds,
        seed,
        steps,
        faults,
        members,
        agents,
        workload,
        bug,
        threads,
        verbose,
        log,
        fail_fast,
    }) = &args.cmd
    {
        if !(1..=7).contains(members) {
            anyhow::bail!("--members: {members}; 1 to 7");
        }
        if *agents > 64 {
            anyhow::bail!("--agents: {agents}; 0 to 64");
        }
        let opts = lattice_runtime::dst::Options {
            seeds: *seeds,
            seed: *seed,
            steps: *steps,
            faults: lattice_runtime::dst::parse_faults(faults).map_err(anyhow::Error::msg)?,
            members: *members,
            agents: *agents,
            workload: lattice_runtime::dst::Workload::parse(workload).map_err(anyhow::Error::msg)?,
            bugs: bug
                .as_deref()
                .map(lattice_runtime::dst::Bugs::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?
                .unwrap_or_default(),
            threads: threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            keep_log: *log,
            fail_fast: *fail_fast,
        };
        let verbose = *verbose;
        let t0 = std::time::Instant::now();
        let report = tokio::task::block_in_place(|| {
            lattice_runtime::dst::run(&opts, &|r| {
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
            })
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
        return Ok(());
    }
    if let Some(Cmd::Bench {
        kind,
        n,
        seconds,
        target,
    }) = args.cmd
    {
        let line = match kind.as_str() {
            "raft" => lattice_runtime::bench::raft(n).await?,
            "submit" => lattice_runtime::bench::submit(n, 1).await?,
            "submit3" => lattice_runtime::bench::submit(n, 3).await?,
            "heartbeats" => lattice_runtime::bench::heartbeats(n, seconds).await?,
            "heartbeat-agents" => {
                let Some(t) = target else {
                    anyhow::bail!("bench heartbeat-agents needs --target HOST:PORT");
                };
                lattice_runtime::bench::heartbeat_agents(&t, n, seconds).await?
            }
            other => anyhow::bail!("bench {other}: raft, submit, submit3 or heartbeats"),
        };
        println!("{line}");
        return Ok(());
    }
    let Some(config) = args.config else {
        anyhow::bail!("--config FILE is required");
    };
    let cfg = lattice_runtime::RuntimeConfig::read(&config)?;
    let running = lattice_runtime::start(cfg, args.bootstrap).await?;
    println!(
        "lattice-runtime: REST on http://{}, quorum gRPC on {}",
        running.rest_addr, running.grpc_addr
    );
    // SIGINT (Ctrl-C) or SIGTERM (systemd, kill): stop serving and close the stores cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    running.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn arguments_are_consistent() {
        use clap::CommandFactory;
        super::Args::command().debug_assert();
    }
}
