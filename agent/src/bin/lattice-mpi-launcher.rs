//! `lattice-mpi-launcher` — how `mpirun` (MPICH's Hydra) starts its proxies on an allocation's nodes
//! without SSH (book: "MPI Process Management", Direct mpirun). Inside an allocation the agent sets
//! `HYDRA_LAUNCHER=ssh`, `HYDRA_LAUNCHER_EXEC` to this program and `HYDRA_HOST_FILE` to the
//! allocation's nodes, so Hydra calls it as it would call `ssh`: `lattice-mpi-launcher [-x ...] HOST
//! COMMAND...`. It asks HOST's node agent (its address from `LATTICE_AGENTS`) to run COMMAND inside
//! the allocation — presenting the allocation's `LATTICE_LAUNCH_TOKEN` — streams the output back and
//! exits with the command's status. As with ssh, the words of COMMAND are joined and run by `sh -c`.

use anyhow::{Context, Result, bail};
use std::io::Write;

/// SSH options Hydra may pass before the host (those taking a value take the next word).
const WITH_VALUE: &[&str] = &["-p", "-l", "-o", "-i", "-F", "-E", "-c", "-m"];

fn main() -> std::process::ExitCode {
    match run() {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprint!("{}", lattice_engine::user_error_report(e.as_ref()));
            std::process::ExitCode::from(255)
        }
    }
}

fn run() -> Result<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() && args[i].starts_with('-') {
        if WITH_VALUE.contains(&args[i].as_str()) {
            i += 1;
        }
        i += 1;
    }
    let Some(host) = args.get(i) else {
        bail!("usage: lattice-mpi-launcher [ssh options] HOST COMMAND...");
    };
    let command = args[i + 1..].join(" ");
    if command.trim().is_empty() {
        bail!("lattice-mpi-launcher {host}: no command");
    }
    let alloc = std::env::var("LATTICE_ALLOC_ID").context("LATTICE_ALLOC_ID: run inside an allocation")?;
    let token = std::env::var("LATTICE_LAUNCH_TOKEN").context("LATTICE_LAUNCH_TOKEN: run inside an allocation")?;
    let agents = std::env::var("LATTICE_AGENTS").unwrap_or_default();
    let addr = agents
        .split(',')
        .filter_map(|p| p.split_once('='))
        .find(|(n, _)| n == host)
        .map(|(_, a)| a.to_string())
        .with_context(|| format!("{host}: not a node of allocation {alloc} (LATTICE_AGENTS={agents})"))?;
    let peer = lattice_node_adapters::peer::Peer::client().context("starting the gRPC client")?;
    let code = peer
        .exec(
            &addr,
            &alloc,
            &token,
            vec!["/bin/sh".into(), "-c".into(), command],
            Vec::new(),
            |e| match e {
                lattice_node_adapters::peer::ExecEvent::Stdout(b) => {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(&b);
                    let _ = o.flush();
                }
                lattice_node_adapters::peer::ExecEvent::Stderr(b) => {
                    let mut o = std::io::stderr().lock();
                    let _ = o.write_all(&b);
                    let _ = o.flush();
                }
                lattice_node_adapters::peer::ExecEvent::Exit(_) => {}
            },
        )
        .with_context(|| format!("{host} ({addr})"))?;
    Ok(code)
}
