//! `lattice-runtime` — the production control plane. It drives the very same `lattice-engine` that
//! `rm-replay` drives, on the wall clock instead of a virtual one: the scheduling loop ([`server`]) runs
//! each vCluster's passes, proposes node ownership through the openraft quorum
//! (`lattice-adapters`: durable redb log and state machine, Raft over gRPC), starts committed
//! allocations (on simulated agents, or hands them to `lattice-agent`s that poll for work) and retries rejected proposals next
//! cycle. [`api`] serves the REST API (`/v1/...`, `/healthz`, Prometheus `/metrics`);
//! [`lattice_control`] (its own crate, without tokio) keeps the engine, the request details and the
//! trace capture (`scheduler.trace_capture`, JSONL that `rm-replay` replays), and lays out task
//! launches and image cache orders; this crate carries out what it decides. [`config`] reads
//! `runtime/config/*.yaml`.
//!
//! [`auth`] checks bearer JWTs (RS256 JWKS, HS256 dev), the seed's roles with tenant scoping, and
//! per-user rate limits. [`grpc`] serves the same operations ([`ops`]) over gRPC. [`tls`] puts both
//! ports (and Raft between members) behind rustls TLS or mTLS.
//! [`observe`] reads allocations' metrics back from the TSDB the agents push to (`lattice top ID`,
//! `lattice compare`, diagnostics).

pub mod accounting;
pub mod api;
pub mod archive;
pub mod audit_key;
pub mod audit_verified;
pub mod auth;
pub mod bench;
pub mod config;
pub mod context;
pub mod effects;
pub mod error;
pub mod faults;
#[cfg(feature = "federation")]
pub mod federation;
pub mod grpc;
pub mod leadership;
pub mod listen;
pub mod metrics;
pub mod mirror;
pub mod observe;
pub mod oidc;
pub mod openapi;
pub mod openchami;
pub mod ops;
pub mod pb;
pub mod principal;
pub mod recording;
pub mod replay;
pub mod server;
pub mod storage_probe;
pub mod tls;

pub use config::RuntimeConfig;
pub use server::{Running, start};
