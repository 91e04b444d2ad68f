//! `lattice-agent --node-id=ID --quorum-endpoint=URL`: the node agent (see the crate docs).

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Parser)]
#[command(
    version,
    about = "Lattice node agent: registers, heartbeats, runs allocations on this node"
)]
struct Args {
    /// This node's name in the inventory.
    #[arg(long)]
    node_id: String,
    /// The control plane's REST endpoint, or every member's separated by commas (e.g.
    /// https://lattice-01:8080,https://lattice-02:8080): the agent moves on to the next when one
    /// does not answer or is not the leader.
    #[arg(long)]
    quorum_endpoint: String,
    /// PEM CA that signed the control plane's certificate (default: the system roots).
    #[arg(long, alias = "ca", env = "LATTICE_BOOTSTRAP_CA")]
    bootstrap_ca: Option<PathBuf>,
    /// This node's bootstrap certificate (PEM; its CN is the node id): mTLS identity, preferred over
    /// LATTICE_AGENT_TOKEN.
    #[arg(long, env = "LATTICE_BOOTSTRAP_CERT", requires = "bootstrap_key")]
    bootstrap_cert: Option<PathBuf>,
    /// The bootstrap certificate's private key (PEM).
    #[arg(long, env = "LATTICE_BOOTSTRAP_KEY", requires = "bootstrap_cert")]
    bootstrap_key: Option<PathBuf>,
    /// Where allocations' output is written (one `ID.log` each).
    #[arg(long, default_value = "/var/lib/lattice/logs")]
    log_dir: PathBuf,
    /// How often the agent asks for work.
    #[arg(long, default_value = "1s")]
    poll: humantime::Duration,
    /// Heartbeat interval.
    #[arg(long, default_value = "10s")]
    heartbeat: humantime::Duration,
    /// SIGTERM → SIGKILL grace at the walltime.
    #[arg(long, default_value = "30s")]
    grace: humantime::Duration,
    /// Output ring buffer per allocation, in MiB.
    #[arg(long, default_value_t = 64)]
    ring_mib: usize,
    /// Also set SLURM_* compatibility variables.
    #[arg(long)]
    slurm_env: bool,
    /// Telemetry aggregation: prod (every 30 s) or debug (every second).
    #[arg(long, default_value = "prod")]
    telemetry_mode: String,
    /// Push per-allocation and GPU metrics with Prometheus remote-write (protobuf + snappy) to this URL
    /// (e.g. VictoriaMetrics' /api/v1/write).
    #[arg(long)]
    remote_write: Option<String>,
    /// Push per-allocation and GPU metrics (Prometheus text) to this Pushgateway-compatible URL.
    #[arg(long)]
    metrics_push: Option<String>,
    /// Flush allocations' output as zstd chunks to this log store (a directory laid out like the
    /// seed's bucket: TENANT/PROJECT/ALLOC/logs/{stdout,stderr}/NODE/chunk_N.log.zst; local or a
    /// mounted bucket).
    #[arg(long)]
    log_store: Option<PathBuf>,
    /// How often output is flushed to the log store (and always when a process ends).
    #[arg(long, default_value = "10s")]
    log_flush: humantime::Duration,
    /// How often the conformance fingerprint is recomputed (also at start and when asked).
    #[arg(long, default_value = "6h")]
    fingerprint_every: humantime::Duration,
    /// Where the host's `/proc`, `/sys` and `/etc` are seen: `/`, or where a containerised agent has
    /// the host's root mounted (`/host`). The conformance fingerprint and capabilities are read there.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Where checkpoint hints' shared-memory flags and callback endpoint files live.
    #[arg(long, default_value = "/dev/shm")]
    shm_dir: PathBuf,
    /// gRPC checkpoint callback: wait this long for the application's first answer …
    #[arg(long, default_value = "5s")]
    checkpoint_answer_timeout: humantime::Duration,
    /// … and this long for the checkpoint to complete …
    #[arg(long, default_value = "10m")]
    checkpoint_deadline: humantime::Duration,
    /// … and grant deferrals up to this much in all, then force.
    #[arg(long, default_value = "5m")]
    max_deferral: humantime::Duration,
    /// The site's secure wipe of a node after a sensitive claim (`sh -c`, with `LATTICE_ALLOC_ID` and
    /// `LATTICE_NODE` set; exit 0 = wiped). Without one a claim's nodes are quarantined, never
    /// returned unwiped.
    #[arg(long)]
    wipe_command: Option<String>,
    /// Running processes are recorded here; a restarted agent takes them over.
    #[arg(long, default_value = "/var/lib/lattice/agent-state.json")]
    state_file: PathBuf,
    /// The uenv registry: a directory or `file://` URL with `NAME/VERSION/TAG.squashfs` and its
    /// SHA-256 beside it (`TAG.squashfs.sha256`). Without one, only images already in the cache run.
    #[arg(long, env = "LATTICE_UENV_REGISTRY")]
    uenv_registry: Option<String>,
    /// The node-local image cache (uenv images go to `DIR/uenv/`).
    #[arg(long, default_value = "/var/cache/lattice")]
    image_cache: PathBuf,
    /// Where an allocation's uenv appears to its processes (and only to them).
    #[arg(long, default_value = "/user-environment")]
    uenv_mount: PathBuf,
    /// Where an allocation's tools uenv (`environment.tools_uenv`) appears beside it.
    #[arg(long, default_value = "/user-tools")]
    tools_mount: PathBuf,
    /// The site's uenv signing key (its Ed25519 public half, hex): allocations with
    /// `environment.sign_required` mount only images whose `TAG.squashfs.sig` (hex, the key's
    /// signature of the image's SHA-256 digest) verifies with it.
    #[arg(long, env = "LATTICE_UENV_SIGNING_KEY")]
    uenv_signing_key: Option<String>,
    /// The image cache's size (bytes, or with K/M/G/T): above the high watermark, least-recently-used
    /// images that no running allocation has mounted are evicted down to the low one. Default: no limit.
    #[arg(long, value_parser = parse_size)]
    image_cache_size: Option<u64>,
    /// Eviction starts above this fraction of `--image-cache-size`...
    #[arg(long, default_value_t = 0.9)]
    cache_high_watermark: f64,
    /// ...and stops at this one.
    #[arg(long, default_value_t = 0.7)]
    cache_low_watermark: f64,
    /// Node-local scratch: each allocation gets `DIR/ID/` (`LATTICE_SCRATCH`, `TMPDIR`), removed when it
    /// ends on this node. `none` for no scratch.
    #[arg(long, default_value = "/scratch/local")]
    scratch_dir: String,
    /// Where the site's storage is mounted on this node, by scheme: `nfs=/mnt/vast`, `s3=/mnt/s3`
    /// (repeatable). Data mounts (`nfs://home/alice` → `/home/alice`) are bind mounts from there in
    /// the allocation's own mount namespace; the default home (`nfs://home/USER`) and output
    /// directory (`s3://TENANT/PROJECT/ALLOC/`, `LATTICE_OUTPUT_DIR`) come from there too.
    #[arg(long = "data-root", value_parser = lattice_agent::data::parse_root)]
    data_roots: Vec<(String, PathBuf)>,
    /// The agent's own gRPC service (task launches' PMI fences between agents, aborts, and `Exec` for
    /// `lattice-mpi-launcher`): `host:port` (port 0 picks a free one); `none` serves nothing.
    #[arg(long, default_value = "0.0.0.0:7010")]
    peer_listen: String,
    /// The address other agents reach the service at (default: the listen address, or this host's
    /// name and the port when it listens on every interface).
    #[arg(long)]
    peer_advertise: Option<String>,
    /// A task launch's fence not complete within this is aborted ("PMI fence timeout").
    #[arg(long, default_value = "60s")]
    pmi_fence_timeout: humantime::Duration,
    /// The node's OCI image store: `DIR/NAME` are OCI image layouts (tags are versions), for
    /// submissions with `environment.image: NAME:TAG` (unpacked with umoci).
    #[arg(long, env = "LATTICE_OCI_IMAGES")]
    oci_images: Option<PathBuf>,
    /// The OCI runtime that runs containers (`runc`, `crun`; anything with `run --bundle` and
    /// `delete --force`).
    #[arg(long, default_value = "runc")]
    oci_runtime: String,
}

/// `200G`, `512M`, `1048576`: bytes (K/M/G/T are powers of 1024).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s}: the unit is K, M, G or T")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s}: expected a positive size such as 200G"))
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

fn run() -> Result<()> {
    let a = Args::parse();
    let client = lattice_agent::client::Client::new(
        &a.quorum_endpoint,
        std::env::var("LATTICE_AGENT_TOKEN").ok(),
        &lattice_agent::client::Identity {
            ca: a.bootstrap_ca,
            cert: a.bootstrap_cert,
            key: a.bootstrap_key,
        },
    )?;
    if !(0.0 < a.cache_low_watermark
        && a.cache_low_watermark <= a.cache_high_watermark
        && a.cache_high_watermark <= 1.0)
    {
        anyhow::bail!(
            "--cache-low-watermark {} / --cache-high-watermark {}: need 0 < low <= high <= 1",
            a.cache_low_watermark,
            a.cache_high_watermark
        );
    }
    let oci_bundles = a.image_cache.join("oci");
    let cfg = lattice_agent::agent::AgentConfig {
        node: a.node_id,
        poll: a.poll.into(),
        heartbeat: a.heartbeat.into(),
        grace: a.grace.into(),
        log_dir: a.log_dir,
        ring_bytes: a.ring_mib * 1024 * 1024,
        slurm_env: a.slurm_env,
        state_file: Some(a.state_file),
        telemetry: lattice_agent::telemetry::Mode::parse(&a.telemetry_mode)
            .ok_or_else(|| anyhow::anyhow!("--telemetry-mode {}: expected prod or debug", a.telemetry_mode))?,
        remote_write: a.remote_write,
        metrics_push: a.metrics_push,
        log_store: a.log_store.map(lattice_node_adapters::logstore::LogStore::new),
        log_flush: a.log_flush.into(),
        fingerprint_every: a.fingerprint_every.into(),
        host_root: a.host_root,
        shm_dir: a.shm_dir,
        callback: lattice_agent::checkpoint::CallbackTimeouts {
            answer: a.checkpoint_answer_timeout.into(),
            deadline: a.checkpoint_deadline.into(),
            max_deferral: a.max_deferral.into(),
        },
        wipe_command: a.wipe_command,
        uenv: lattice_agent::uenv::UenvConfig {
            registry: a.uenv_registry,
            cache_dir: a.image_cache,
            mount_point: a.uenv_mount,
            tools_mount_point: a.tools_mount,
            signing_key: a.uenv_signing_key,
            limits: lattice_agent::cache::Limits {
                capacity: a.image_cache_size,
                high: a.cache_high_watermark,
                low: a.cache_low_watermark,
            },
        },
        scratch_dir: (a.scratch_dir != "none").then(|| PathBuf::from(&a.scratch_dir)),
        data_roots: a.data_roots.into_iter().collect(),
        peer_listen: (a.peer_listen != "none").then_some(a.peer_listen),
        peer_advertise: a.peer_advertise,
        fence_timeout: a.pmi_fence_timeout.into(),
        oci: lattice_agent::oci::OciEngine {
            images: a.oci_images,
            bundles: oci_bundles,
            runtime: a.oci_runtime,
        },
        launcher: std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("lattice-mpi-launcher")))
            .filter(|p| p.is_file()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let s = stop.clone();
        // A tiny signal flag: the loop notices within one poll interval.
        register_flag(sig, s);
    }
    lattice_agent::agent::run(&client, &cfg, stop)?;
    Ok(())
}

static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    if let Some(f) = FLAG.get() {
        f.store(true, Ordering::SeqCst);
    }
}

fn register_flag(sig: libc::c_int, flag: Arc<AtomicBool>) {
    let _ = FLAG.set(flag);
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(sig, on_signal as *const () as libc::sighandler_t);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(super::parse_size("1048576"), Ok(1 << 20));
        assert_eq!(super::parse_size("200G"), Ok(200 << 30));
        assert_eq!(super::parse_size("3t"), Ok(3 << 40));
        for bad in ["", "0", "12X", "G", "-5M", "99999999999T"] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
    }
}
