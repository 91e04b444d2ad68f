//! `lattice-runtime --config FILE [--bootstrap]`: one control-plane member.

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Lattice control plane: quorum member, scheduler and API")]
struct Args {
    /// Runtime configuration YAML (see runtime/config/minimal.yaml and production.yaml).
    #[arg(long)]
    config: PathBuf,
    /// Form the quorum from the configured members (first start only; ignored when state exists).
    #[arg(long)]
    bootstrap: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .init();
    let args = Args::parse();
    let cfg = lattice_runtime::RuntimeConfig::read(&args.config)?;
    let running = lattice_runtime::start(cfg, args.bootstrap).await?;
    println!(
        "lattice-runtime: REST on http://{}, quorum gRPC on {}",
        running.rest_addr, running.grpc_addr
    );
    tokio::signal::ctrl_c().await?;
    running.shutdown().await;
    Ok(())
}
