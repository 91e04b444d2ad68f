//! `lattice-node-adapters` — the node side's real adapters, what a node agent needs and nothing of the
//! quorum: the agents' own gRPC service — the PMI fence between the agents of a task launch, aborts,
//! `Exec` for `lattice-mpi-launcher` and terminals ([`peer`]); the client of the applications' gRPC
//! checkpoint callback ([`checkpoint`]); and the durable log store of zstd chunks the agents write and
//! the control plane reads ([`logstore`]). It links no openraft and no redb: `lattice-agent` builds
//! on it alone, and `lattice-adapters` re-exports it for the control plane.

pub mod checkpoint;
pub mod logstore;
pub mod peer;
