//! Why a sensitive claim was refused (see [`crate::claim`]): what the engine hands the controller
//! and the worlds name for the claim's owner.

use crate::ids::{AllocId, NodeId};

/// Why a sensitive claim was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimRefusal {
    /// Its pool has not the nodes now (`OwnershipConflict`): it needs `needed`, `free` of its
    /// eligible nodes are free (fewer, or not `needed` of one conformance fingerprint); `held` are
    /// the eligible nodes allocations hold (each with its holder, in node order), `out` those out
    /// of service (down, draining, being wiped, quarantined, booting).
    OwnershipConflict {
        needed: u32,
        free: u32,
        held: Vec<(NodeId, AllocId)>,
        out: Vec<NodeId>,
    },
    /// It would break a hard quota (its tenant's or project's, or the site's
    /// `sensitive_pool_size`) or a budget.
    OverQuota,
}

impl ClaimRefusal {
    /// The nodes that stood in the claim's way (held ones first), in node order within each.
    pub fn nodes(&self) -> Vec<NodeId> {
        match self {
            ClaimRefusal::OwnershipConflict { held, out, .. } => {
                held.iter().map(|h| h.0).chain(out.iter().copied()).collect()
            }
            ClaimRefusal::OverQuota => Vec::new(),
        }
    }
}

impl std::fmt::Display for ClaimRefusal {
    /// The decision log's words (indices; each world names nodes and owners its own way).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimRefusal::OwnershipConflict {
                needed,
                free,
                held,
                out,
            } => {
                let held: Vec<String> = held.iter().map(|(n, a)| format!("{}:{}", n.0, a.0)).collect();
                let out: Vec<String> = out.iter().map(|n| n.0.to_string()).collect();
                write!(
                    f,
                    "ownership_conflict needs {needed} free {free} held [{}] out [{}]",
                    held.join(","),
                    out.join(",")
                )
            }
            ClaimRefusal::OverQuota => write!(f, "over_quota"),
        }
    }
}
