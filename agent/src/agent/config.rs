//! The agent's configuration: its node, its intervals, where its files go and what the site provides
//! (the log store, telemetry sinks, uenv and OCI images, storage roots, the wipe command).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// What an agent runs with (the `lattice-agent` binary's flags).
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node: String,
    pub poll: Duration,
    pub heartbeat: Duration,
    /// SIGTERM → SIGKILL at the walltime.
    pub grace: Duration,
    pub log_dir: PathBuf,
    pub ring_bytes: usize,
    /// Also set the `SLURM_*` compatibility variables.
    pub slurm_env: bool,
    /// Where the running processes are recorded, so a restarted agent takes them over.
    pub state_file: Option<PathBuf>,
    /// Telemetry: the aggregation mode (how often allocations and GPUs are sampled and the GPU alert
    /// rules evaluated), and where samples go — a Prometheus remote-write endpoint and/or a
    /// Pushgateway-compatible URL (Prometheus text).
    pub telemetry: crate::telemetry::Mode,
    pub remote_write: Option<String>,
    pub metrics_push: Option<String>,
    /// The log store output is flushed to as zstd chunks every `log_flush` (and when a process ends).
    pub log_store: Option<lattice_node_adapters::logstore::LogStore>,
    pub log_flush: Duration,
    /// How often the conformance fingerprint is recomputed (the book: every 6 h).
    pub fingerprint_every: Duration,
    /// Where the host's `/proc`, `/sys` and `/etc` are seen (`/`; `/host` for an agent in a
    /// container with the host's root mounted there): the fingerprint and capabilities are read there.
    pub host_root: PathBuf,
    /// Where shmem checkpoint flags and gRPC endpoint files live (`/dev/shm`).
    pub shm_dir: PathBuf,
    pub callback: crate::checkpoint::CallbackTimeouts,
    /// The site's secure-wipe command for a released sensitive claim's node (`sh -c`, with
    /// `LATTICE_ALLOC_ID` and `LATTICE_NODE`); exit 0 = wiped. Without one a wipe fails (the node is
    /// quarantined): a sensitive node is never returned unwiped.
    pub wipe_command: Option<String>,
    /// uenv images: the registry, the node-local cache and the mount point.
    pub uenv: crate::uenv::UenvConfig,
    /// Each allocation's scratch is `DIR/ID/` (`LATTICE_SCRATCH`, `TMPDIR`), created at its start and
    /// removed when its process ends — also one a restarted agent took over. `None`: no scratch.
    pub scratch_dir: Option<PathBuf>,
    /// Where the site's storage is mounted on this node, by scheme (`nfs`, `s3`): data mounts and
    /// the default home and output directories come from there ([`crate::data`]).
    pub data_roots: BTreeMap<String, PathBuf>,
    /// The agent's own gRPC service (task launches' fences, aborts, `Exec`): where it listens, and the
    /// address other agents reach it at (default: the listen address; this host's name for
    /// `0.0.0.0`). `None`: no service (single-node launches still run).
    pub peer_listen: Option<String>,
    pub peer_advertise: Option<String>,
    /// A task launch's fence not complete within this is aborted ("PMI fence timeout").
    pub fence_timeout: Duration,
    /// `lattice-mpi-launcher`, for `mpirun` inside allocations (`HYDRA_LAUNCHER_EXEC`).
    pub launcher: Option<PathBuf>,
    /// OCI images: the store of image layouts, where bundles go, and the OCI runtime ([`crate::oci`]).
    pub oci: crate::oci::OciEngine,
}
