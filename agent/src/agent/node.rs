//! This node as the agent finds it at start: its capabilities and conformance fingerprint, the address
//! other agents reach its service at, and the Slurm compatibility `srun`.

use super::config::AgentConfig;
use crate::discovery::{Capabilities, Sources, fingerprint};
use std::path::PathBuf;

/// Writes `LOG_DIR/.compat/srun`, which runs `lattice srun` (the `lattice` beside this agent, else the
/// one on the PATH); the directory, or `None` when it cannot be written.
pub(super) fn compat_bin(log_dir: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = log_dir.join(".compat");
    let lattice = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("lattice")))
        .filter(|p| p.is_file())
        .map_or_else(|| "lattice".to_string(), |p| p.display().to_string());
    let script = format!("#!/bin/sh\nexec '{}' srun \"$@\"\n", lattice.replace('\'', "'\\''"));
    let srun = dir.join("srun");
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&srun, script))
        .and_then(|()| std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)));
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("lattice-agent: srun compatibility in {}: {e}", dir.display());
            None
        }
    }
}

/// The address other agents reach this agent's service at: the one configured, else the bound
/// address — with this host's name when it listens on every interface.
fn advertise(configured: Option<&str>, bound: std::net::SocketAddr) -> String {
    if let Some(a) = configured {
        return a.to_string();
    }
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let host = ok
        .then(|| {
            let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            String::from_utf8_lossy(&name[..end]).into_owned()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    format!("{host}:{}", bound.port())
}

/// The node's capabilities and conformance fingerprint (the GPU driver from the GPU provider).
pub fn discover(sources: &Sources, gpu: &dyn crate::gpu::GpuProvider) -> (Capabilities, String) {
    let mut caps: Capabilities = sources.capabilities();
    let mut components = sources.components();
    let (gpus, model, driver, memory) = crate::gpu::summary_with_memory(gpu);
    caps.gpu_count = gpus;
    caps.gpu_model = model;
    caps.gpu_memory_gib = memory;
    if let Some(d) = driver {
        components.insert("gpu_driver".into(), d);
    }
    (caps, fingerprint(&components))
}

/// Starts the agent's own gRPC service when it has a listen address (task launches' fences,
/// aborts, `Exec`); the address other agents reach it at, `None` without a service or when it could
/// not be started (said: multi-node task launches will fail here).
pub(super) fn serve(cfg: &AgentConfig, tasks: &crate::tasks::Tasks) -> Option<String> {
    cfg.peer_listen.as_deref().and_then(|listen| match tasks.serve(listen) {
        Ok(a) => {
            let advertised = advertise(cfg.peer_advertise.as_deref(), a);
            eprintln!(
                "lattice-agent {}: agent service on {a} (reached at {advertised})",
                cfg.node
            );
            Some(advertised)
        }
        Err(e) => {
            eprintln!(
                "lattice-agent {}: agent service on {listen}: {e}; multi-node task launches will fail here",
                cfg.node
            );
            None
        }
    })
}
