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
    /// (submissions/s and acknowledgment latency through gRPC and REST to a 1- / 3-member quorum's
    /// leader, per client count), `htc` (N `sleep 0` jobs end to end through 3 members: submit, start
    /// and completion rates; `--clients` its first count), `heartbeats` (N
    /// agents every 10 s from another process: the server's CPU share) or `audit` (queries on a
    /// held audit log of N entries).
    Bench {
        kind: String,
        /// Proposals, requests, agents or audit entries.
        #[arg(long, default_value_t = 2000)]
        n: usize,
        /// `heartbeats`: how long the agents heartbeat.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// `heartbeat-agents` (the child process of `heartbeats`): the server's gRPC address.
        #[arg(long)]
        target: Option<String>,
        /// `submit`, `submit3`: the concurrent client counts to measure, each on a fresh quorum.
        #[arg(long, value_delimiter = ',', default_value = "8,64,256")]
        clients: Vec<usize>,
        /// `submit`, `submit3`: elements per submission (a task group; 1: plain allocations).
        #[arg(long, default_value_t = 1)]
        array: u32,
        /// `htc`: simulated nodes.
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    if let Some(Cmd::Bench {
        kind,
        n,
        seconds,
        target,
        clients,
        array,
        nodes,
    }) = args.cmd
    {
        let line = match kind.as_str() {
            "raft" => lattice_runtime::bench::raft(n).await?,
            "submit" => lattice_runtime::bench::submit(n, 1, &clients, array).await?,
            "submit3" => lattice_runtime::bench::submit(n, 3, &clients, array).await?,
            "htc" => lattice_runtime::bench::htc(n, nodes, clients.first().copied().unwrap_or(64)).await?,
            "heartbeats" => lattice_runtime::bench::heartbeats(n, seconds).await?,
            "audit" => lattice_runtime::bench::audit_queries(n)?,
            "heartbeat-agents" => {
                let Some(t) = target else {
                    anyhow::bail!("bench heartbeat-agents needs --target HOST:PORT");
                };
                lattice_runtime::bench::heartbeat_agents(&t, n, seconds).await?
            }
            other => anyhow::bail!("bench {other}: raft, submit, submit3, htc, heartbeats or audit"),
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
