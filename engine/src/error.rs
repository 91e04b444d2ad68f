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
    #[error("node {0} is not free")]
    NodeNotFree(NodeId),
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
    #[error("node `{0}` is already in the inventory")]
    DuplicateNode(String),
    #[error(
        "node `{node}`: its home vCluster {vcluster} already schedules on the shared pool (a vCluster's first home \
         node must be in the inventory it starts with)"
    )]
    HomeAfterStart { node: String, vcluster: VClusterId },
}

/// How the binaries print an error a user caused (`error: <message>`, then each cause on a line of
/// its own), never a stack backtrace: backtraces are for panics only.
pub fn user_error_report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("error: {e}\n");
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!("  caused by: {c}\n"));
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod report_tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn user_errors_print_the_cause_chain_one_line_each() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(super::user_error_report(&e), "error: outer\n  caused by: inner\n");
    }
}
