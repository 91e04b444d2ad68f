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
    /// Measure: `raft` (commit latency p50/p99 on 3 local members, commits/s), `submit`
    /// (submissions/s through the REST API) or `heartbeats` (N agents every 10 s: CPU share).
    Bench {
        kind: String,
        /// Proposals or requests.
        #[arg(long, default_value_t = 2000)]
        n: usize,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    let args = Args::parse();
    if let Some(Cmd::Bench { kind, n }) = args.cmd {
        let line = match kind.as_str() {
            "raft" => lattice_runtime::bench::raft(n).await?,
            "submit" => lattice_runtime::bench::submit(n).await?,
            "heartbeats" => lattice_runtime::bench::heartbeats(n, 20).await?,
            other => anyhow::bail!("bench {other}: raft, submit or heartbeats"),
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
    tokio::signal::ctrl_c().await?;
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
