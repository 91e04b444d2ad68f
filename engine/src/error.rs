//! Typed errors of the engine's inputs.

use crate::alloc::AllocState;
use crate::ids::{AllocId, NodeId, TenantId, VClusterId};

/// An allocation request the engine refuses (nothing is created).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("allocation requests {0} nodes; at least 1 is required")]
    NoNodes(u32),
    #[error("node range min {min} is larger than max {max}")]
    BadRange { min: u32, max: u32 },
    #[error("unknown tenant id {0}")]
    UnknownTenant(TenantId),
    #[error("unknown vcluster id {0}")]
    UnknownVCluster(VClusterId),
    #[error(
        "unsatisfiable: requests {requested} nodes but only {eligible} nodes in the inventory match its constraints"
    )]
    Unsatisfiable { requested: u32, eligible: u32 },
    #[error("depends_on refers to unknown allocation {0}")]
    UnknownDependency(AllocId),
    #[error("the pyss-compatible policy schedules one homogeneous pool: constraints are not supported")]
    PyssConstraints,
}

/// An input that contradicts the engine's state (a driver bug or a stale message).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("unknown allocation {0}")]
    UnknownAlloc(AllocId),
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    #[error("unknown vcluster id {0}")]
    UnknownVCluster(VClusterId),
    #[error("allocation {id}: {from} -> {to} is not a valid transition")]
    InvalidTransition {
        id: AllocId,
        from: AllocState,
        to: AllocState,
    },
    #[error("allocation {0} has no outstanding proposal")]
    NotProposed(AllocId),
    #[error("allocation {0} is not being preempted")]
    NotPreempting(AllocId),
    #[error("allocation {0} has ended or is not bounded: its walltime cannot change")]
    WalltimeFixed(AllocId),
    #[error(transparent)]
    Node(#[from] crate::node::InvalidNodeTransition),
    #[error("the pyss-compatible policy needs a single homogeneous node pool; the inventory has {0} node classes")]
    PyssHeterogeneous(usize),
}
