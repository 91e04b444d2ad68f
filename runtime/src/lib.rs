//! `lattice-runtime` — the production control plane. It drives the very same `lattice-engine` that
//! `rm-replay` drives, on the wall clock instead of a virtual one: the scheduling loop ([`server`]) runs
//! each vCluster's passes, proposes node ownership through the openraft quorum
//! (`lattice-adapters`: durable redb log and state machine, Raft over gRPC), starts committed
//! allocations (on simulated agents, or hands them to `lattice-agent`s that poll for work) and retries rejected proposals next
//! cycle. [`api`] serves the REST API (`/v1/...`, `/healthz`, Prometheus `/metrics`); [`control`]
//! keeps the engine, the request details and the trace capture (`scheduler.trace_capture`, JSONL that
//! `rm-replay` replays); [`config`] reads `runtime/config/*.yaml`.
//!
//! [`auth`] checks bearer JWTs (RS256 JWKS, HS256 dev), the seed's roles with tenant scoping, and
//! per-user rate limits. [`grpc`] serves the same operations ([`ops`]) over gRPC. [`tls`] puts both
//! ports (and Raft between members) behind rustls TLS or mTLS. [`tasks`] lays out task launches
//! within running allocations (`lattice launch`) and hands each node's ranks to its agent; [`cache`]
//! keeps the operators' image cache orders (`lattice cache warm|evict`) and the nodes' caches.
//! [`observe`] reads allocations' metrics back from the TSDB the agents push to (`lattice top ID`,
//! `lattice compare`, diagnostics).

pub mod accounting;
pub mod api;
pub mod auth;
pub mod bench;
pub mod cache;
pub mod config;
pub mod context;
pub mod control;
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
pub mod network;
pub mod observe;
pub mod openapi;
pub mod openchami;
pub mod ops;
pub mod pb;
pub mod replay;
pub mod server;
pub mod tasks;
pub mod tls;
pub mod world;

pub use config::RuntimeConfig;
pub use server::{Running, start};
