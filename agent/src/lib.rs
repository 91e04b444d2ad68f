//! `lattice-agent` — the node agent (book: "Node Lifecycle", "MPI Process Management"). It registers
//! its node with the control plane and heartbeats with a strictly increasing sequence number
//! ([`client`]); reports the node's capabilities and its conformance fingerprint ([`discovery`]);
//! polls for work and runs each allocation's entrypoint as a real process in its own process group
//! with the seed's environment, enforcing the walltime (SIGTERM, grace, SIGKILL), its output going
//! straight to log files, stdout and stderr apart ([`runner`]); records running processes in a state file so a restarted
//! agent takes them over, and reports each exit ([`agent`]). Blocking I/O on a few threads: an agent
//! does little, often.
//!
//! GPUs come from [`gpu`] (NVML with the `nvidia` feature; the seed's local alert rules).
//!
//! Telemetry ([`telemetry`]): per-allocation counters from /proc and GPU samples at the aggregation
//! mode's period, the local GPU alert rules, pushed by Prometheus remote-write ([`remote_write`]) or as
//! Prometheus text to a Pushgateway.
//!
//! Identity: a bootstrap certificate over mTLS (its CN is the node id), or `LATTICE_AGENT_TOKEN` in
//! development. During a partition the agent runs on and buffers heartbeats and exit reports, replayed
//! when the control plane is back.
//!
//! Output is flushed to the log store (zstd chunks, `lattice_node_adapters::logstore`) and streamed live to
//! the control plane while someone follows it.
//!
//! Checkpoint hints by signal, shared-memory flag or gRPC callback ([`checkpoint`]). uenv software
//! environments: pulled into the node-local cache with hash verification and mounted for the
//! allocation's processes alone ([`uenv`]); OCI images run in containers of a real OCI runtime (runc,
//! crun) behind a port ([`oci`]). Data mounts and the defaults (home, output and checkpoint
//! directories) from the site's storage roots on the node, in the allocation's mount namespace
//! ([`data`]).
//!
//! Task launches within a running allocation (`lattice launch`, MPI without SSH): this node's ranks
//! with the seed's rank environment, their stdout and stderr kept apart, and a PMI server (PMI-2 and
//! PMI-1 wire protocols, [`pmi`]) whose fence spans the launch's nodes through the agents' own gRPC
//! service ([`tasks`]). Terminals inside running allocations (`lattice attach`, `lattice session`): a
//! PTY with the allocation's environment, relayed by the control plane ([`attach`]).
//! With the `ebpf` feature, CPU time and block I/O per allocation come from tracepoint programs
//! ([`ebpf`]); the /proc sampler is the fallback. A sensitive allocation runs in a cgroup of its own
//! ([`cgroup`]) whose file opens under its data paths an `openat` program records (audit mode).

pub mod agent;
pub mod attach;
pub mod cache;
pub mod cgroup;
pub mod checkpoint;
pub mod client;
pub mod data;
pub mod discovery;
#[cfg(feature = "ebpf")]
pub mod ebpf;
pub mod fence;
pub mod gpu;
pub mod oci;
pub mod pmi;
pub mod probe;
pub mod protocol;
pub mod remote_write;
pub mod runner;
pub mod tasks;
pub mod telemetry;
pub mod uenv;
