//! `lattice-engine` — the Lattice scheduling core.
//!
//! **Pure and deterministic.** No I/O, no threads, no system clock, no unseeded randomness: every input
//! carries `now` ([`Time`], integer milliseconds), and time never goes backwards (asserted by [`Clock`]).
//! The same sequence of inputs always yields the same decisions, so a decision seen in `rm-replay` is the
//! decision the production runtime makes on the same state.
//!
//! **Sans-I/O API** (like quinn-proto): drivers call `handle_*(now, ..)` with inputs (submissions,
//! quorum commits/rejects, completions, node events), run [`Engine::schedule`] once the inputs of a
//! timestamp are in, and drain [`Proposal`]s with [`Engine::poll_proposal`]. Two drivers exist by design:
//! `lattice-sim` (virtual clock, fake quorum and nodes) and `lattice-runtime` (wall clock, Raft, agents).
//!
//! Main types: [`Engine`] with one scheduler instance per vCluster pool ([`VClusterConfig`]: policy,
//! weights, cycle interval, reference wait); [`Policy`] (`fcfs`, backfill with depth `d` — `easy` is
//! `d = 1`, `conservative` unlimited — `bin-pack`, `reservation`, and the pyss-compatible EASY); the cost
//! function f1..f9 with per-allocation breakdowns ([`cost`], ordering in [`pass`]); the placement picker
//! over node classes — pool, capabilities, dragonfly group, conformance fingerprint ([`classes`]); the
//! availability [`Profile`]; [`Allocation`]/[`AllocSpec`] and [`Node`] with their state machines.
//!
//! Deliberately not here (yet): the full fair-share model (f3 reads plain accumulated usage), quotas,
//! borrowing, preemption, DAG conditions beyond success/failure/any.

pub mod alloc;
pub mod audit;
pub mod autoscale;
pub mod broker;
pub mod claim;
pub mod classes;
pub mod controller;
pub mod cost;
pub mod engine;
pub mod error;
pub mod fairshare;
pub mod ids;
mod inputs;
pub mod kai;
mod meta;
pub mod network;
pub mod node;
pub mod nodeset;
pub mod pass;
pub mod policy;
pub mod preempt;
pub mod profile;
pub mod quota;
pub mod refusal;
mod running;
pub mod staging;
pub mod tenant;
pub mod time;
pub mod waiting;
pub mod weights;
pub mod world;

pub use alloc::{
    AllocSpec, AllocState, Allocation, CheckpointKind, CheckpointMechanism, CheckpointSpec, Constraints, Dependency,
    DependencyCondition, EndReason, Lifecycle, NodeRange, PreemptionClass, RequeuePolicy, TaskGroupRef, TopologyHint,
};
pub use autoscale::{ScalePolicy, ScaleStats};
pub use broker::{BrokerConfig, CheckpointDecision};
pub use classes::{ClassInfo, ClassKey, PickRules, Placement};
pub use controller::{
    ControlError, ControlStats, Controller, DriftTimeout, HeartbeatGrace, Input, NodeOrder, PREEMPT_GRACE,
};
pub use cost::{CostInputs, ScoreBreakdown};
pub use engine::{Engine, EngineConfig, PassStats, Proposal, Reservation};
pub use error::{EngineError, SubmitError, user_error_report};
pub use fairshare::{FairShareConfig, UsageLedger};
pub use ids::{AllocId, GroupId, NodeId, ProjectId, TenantId, VClusterId};
pub use network::{DomainName, NetworkDomains, VniError, VniPool};
pub use node::{
    BootTimeouts, ConformanceFingerprint, DiscoveredCapabilities, Node, NodeCapabilities, NodeEvent, NodeSpec,
    NodeState, Owner, UnsetCapabilities, gpu_type_of,
};
pub use nodeset::NodeSet;
pub use policy::{Depth, Policy, VClusterConfig};
pub use preempt::{Command, PreemptReason, PreemptionConfig};
pub use profile::{Picks, Profile};
pub use quota::{HardQuota, ProjectQuota, QuotaScope, QuotaViolation, TenantQuota};
pub use refusal::ClaimRefusal;
pub use staging::{DataMount, STAGING_RETRIES, Tier};
pub use tenant::{Registry, Tenant, VCluster};
pub use time::{Clock, Duration, Time};
pub use weights::CostWeights;
pub use world::{
    AuditEvent, Decision, Durable, Fleet, Launch, PreemptHow, PreemptOrder, Quorum, Refusal, StopReason, Timer, World,
};
