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
//! Main types: [`Engine`], [`Policy`] (`fcfs`, backfill with depth `d` — `easy` is `d = 1`,
//! `conservative` is unlimited — and the pyss-compatible EASY), [`Profile`] (availability over time per
//! node class), [`Allocation`]/[`AllocSpec`] with the allocation state machine, [`Node`] with the node
//! state machine, and the seams [`QueueOrder`] and [`NodeSelector`].
//!
//! Deliberately not here (yet): ordering the queue by the cost function (its f1..f9 formulas are in
//! [`cost`]) and topology-aware selection (the next issue plugs them into the two seams), fair share, quotas, preemption, DAG conditions beyond success/failure/any.

pub mod alloc;
pub mod cost;
pub mod engine;
pub mod error;
pub mod ids;
pub mod node;
pub mod nodeset;
pub mod policy;
pub mod profile;
pub mod tenant;
pub mod time;
pub mod weights;

pub use alloc::{
    AllocSpec, AllocState, Allocation, CheckpointKind, CheckpointSpec, Constraints, Dependency, DependencyCondition,
    EndReason, Lifecycle, NodeRange, PreemptionClass, TaskGroupRef,
};
pub use engine::{Engine, EngineConfig, PassStats, Proposal, Reservation};
pub use error::{EngineError, SubmitError};
pub use ids::{AllocId, GroupId, NodeId, ProjectId, TenantId, VClusterId};
pub use node::{ConformanceFingerprint, Node, NodeCapabilities, NodeEvent, NodeSpec, NodeState, Owner};
pub use nodeset::NodeSet;
pub use policy::{ArrivalOrder, Depth, LowestIdFirst, NodeSelector, Policy, QueueOrder};
pub use profile::{Picks, Profile};
pub use tenant::{Registry, Tenant, VCluster};
pub use time::{Clock, Duration, Time};
pub use weights::CostWeights;
