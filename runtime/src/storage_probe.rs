//! Checkpoint-storage health (book: "Checkpoint Broker": no checkpoints while the store is down).
//! The leader probes the checkpoint store as the members mount it — a small file written, synced,
//! read back and removed, within a timeout — and feeds the engine the outage and its end
//! ([`lattice_control::Control::storage_health`]), as a trace's `storage_outage`/`storage_recover`
//! events feed `rm-replay`'s. The probe's timed write is the store's measured write bandwidth, the
//! broker's write-time estimate ([`lattice_control::Control::checkpoint_bandwidth`]).

use crate::context::Shared;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `services.checkpoint_store` in the runtime config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// The store's mount on the members (e.g. the VAST NFS export's checkpoint folder).
    pub path: PathBuf,
    #[serde(default = "interval_default")]
    pub interval: String,
    /// A probe that takes longer failed.
    #[serde(default = "timeout_default")]
    pub timeout: String,
    /// Failed probes in a row that make an outage.
    #[serde(default = "failures_default")]
    pub failures: u32,
    /// MiB each probe writes: the write (to the disk, synced) is timed, and the bandwidth it shows
    /// is the checkpoint broker's write-time estimate.
    #[serde(default = "probe_mib_default")]
    pub probe_mib: u32,
}

fn probe_mib_default() -> u32 {
    8
}

fn interval_default() -> String {
    "10s".into()
}
fn timeout_default() -> String {
    "5s".into()
}
fn failures_default() -> u32 {
    2
}

fn duration(text: &str, what: &str) -> anyhow::Result<Duration> {
    let d = lattice_traces::parse_duration(text).map_err(|m| anyhow::anyhow!("checkpoint_store.{what}: {m}"))?;
    Ok(Duration::from_millis(d.0.max(1)))
}

/// One probe: `bytes` written to a file under `dir` and synced (timed), read back and removed; the
/// write bandwidth it showed, GB/s.
pub fn probe(dir: &Path, bytes: usize) -> std::io::Result<f64> {
    use std::io::Write;
    let file = dir.join(format!(".lattice-probe-{}", std::process::id()));
    let mut body = b"lattice checkpoint-store probe ".repeat(bytes / 31 + 1);
    body.truncate(bytes.max(1));
    let result = (|| {
        let t0 = std::time::Instant::now();
        let mut f = std::fs::File::create(&file)?;
        f.write_all(&body)?;
        f.sync_all()?;
        let took = t0.elapsed().as_secs_f64().max(1e-6);
        if std::fs::read(&file)? != body {
            return Err(std::io::Error::other("read back differs"));
        }
        Ok(body.len() as f64 / took / 1e9)
    })();
    let _ = std::fs::remove_file(&file);
    result
}

/// Probes every `interval` on the leader; `failures` failures in a row are an outage, one success
/// ends it.
pub async fn run(shared: Arc<Shared>, cfg: ProbeConfig, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let (interval, timeout) = match (duration(&cfg.interval, "interval"), duration(&cfg.timeout, "timeout")) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!("{e:#}; the checkpoint store is not probed");
            return;
        }
    };
    let mut failed = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopped.changed() => {}
        }
        if *stopped.borrow() {
            return;
        }
        if !shared.member.is_leader() {
            failed = 0;
            continue;
        }
        let dir = cfg.path.clone();
        let bytes = cfg.probe_mib as usize * 1024 * 1024;
        let outcome = tokio::time::timeout(timeout, tokio::task::spawn_blocking(move || probe(&dir, bytes))).await;
        if let Ok(Ok(Ok(gbps))) = outcome {
            shared.metrics.checkpoint_storage_write_gbps.set(gbps);
            if shared.control.lock().await.probed_bandwidth(gbps) {
                tracing::info!(
                    "checkpoint store {}: write bandwidth {gbps:.2} GB/s",
                    cfg.path.display()
                );
            }
        }
        let error = match outcome {
            Ok(Ok(Ok(_))) => None,
            Ok(Ok(Err(e))) => Some(e.to_string()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {timeout:?}")),
        };
        failed = if error.is_some() { failed + 1 } else { 0 };
        let up = match &error {
            None => true,
            Some(_) if failed >= cfg.failures.max(1) => false,
            Some(e) => {
                tracing::debug!("checkpoint store {}: probe failed ({e})", cfg.path.display());
                continue;
            }
        };
        let changed = shared.control.lock().await.storage_health(up);
        if changed {
            match &error {
                Some(e) => tracing::warn!("checkpoint store {} is down: {e}", cfg.path.display()),
                None => tracing::info!("checkpoint store {} is back", cfg.path.display()),
            }
            shared.metrics.checkpoint_storage_unavailable.set(i64::from(!up));
            shared.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_writes_reads_back_and_removes_its_file() {
        let dir = std::env::temp_dir().join(format!("lattice-probe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gbps = probe(&dir, 1 << 20).unwrap();
        assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left behind");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(probe(&dir, 1 << 20).is_err(), "a store that is gone fails the probe");
    }
}
