//! Scheduling policies and the seams later issues plug into: queue order and node selection.

use crate::alloc::Allocation;
use crate::ids::{AllocId, NodeId};
use crate::nodeset::NodeSet;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How far backfilling looks ahead (DESIGN.md §3 "Backfill").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Depth {
    /// The top `d` blocked allocations get reservations; `0` = no backfill (first fit), `1` = EASY.
    Limited(u32),
    /// Every blocked allocation gets a reservation (conservative backfilling).
    Unlimited,
}

/// The scheduling policy of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// Strict queue order: start from the head while it fits; the first that does not fit blocks all.
    Fcfs,
    /// Backfilling with reservations for the top `depth` blocked allocations.
    Backfill { depth: Depth },
    /// EASY exactly as pyss implements it (DESIGN.md §3 "EASY, pyss-compatible").
    PyssEasy,
}

impl Policy {
    pub const EASY: Policy = Policy::Backfill {
        depth: Depth::Limited(1),
    };
    pub const CONSERVATIVE: Policy = Policy::Backfill {
        depth: Depth::Unlimited,
    };
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Fcfs => f.write_str("fcfs"),
            Policy::Backfill {
                depth: Depth::Limited(1),
            } => f.write_str("easy"),
            Policy::Backfill {
                depth: Depth::Unlimited,
            } => f.write_str("conservative"),
            Policy::Backfill {
                depth: Depth::Limited(d),
            } => write!(f, "backfill(depth={d})"),
            Policy::PyssEasy => f.write_str("easy(compat=pyss)"),
        }
    }
}

/// Orders the pending queue before a pass (priority order). The cost-function issue adds a score order.
pub trait QueueOrder: Send {
    fn name(&self) -> &'static str;
    /// Reorders `queue` (pending allocations) in place; must be deterministic.
    fn reorder(&self, now: Time, queue: &mut [AllocId], allocs: &[Allocation]);
}

/// Arrival order: allocation ids are dense in submission order, so this is a sort by id.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArrivalOrder;

impl QueueOrder for ArrivalOrder {
    fn name(&self) -> &'static str {
        "arrival"
    }
    fn reorder(&self, _now: Time, queue: &mut [AllocId], _allocs: &[Allocation]) {
        // Queues stay sorted (requeues are inserted in place); this is a linear check in that case.
        if !queue.is_sorted() {
            queue.sort_unstable();
        }
    }
}

/// Chooses which free nodes an allocation gets. The topology issue adds a group/conformance-aware one.
pub trait NodeSelector: Send {
    fn name(&self) -> &'static str;
    /// Chooses `k` nodes from `free`, taking at most `caps[c]` nodes of class `c` (`class_of[node]`); a
    /// class absent from `caps` is not eligible. Appends to `out`. The caller guarantees enough nodes.
    fn select(&self, free: &NodeSet, class_of: &[u16], caps: &mut [(u16, u32)], k: u32, out: &mut Vec<NodeId>);
}

/// Lowest node id first (deterministic; the placement rule of the foundation issue).
#[derive(Clone, Copy, Debug, Default)]
pub struct LowestIdFirst;

impl NodeSelector for LowestIdFirst {
    fn name(&self) -> &'static str {
        "lowest-id"
    }
    fn select(&self, free: &NodeSet, class_of: &[u16], caps: &mut [(u16, u32)], k: u32, out: &mut Vec<NodeId>) {
        let mut need = k;
        for n in free.iter() {
            if need == 0 {
                break;
            }
            let c = class_of[n.index()];
            if let Some(cap) = caps.iter_mut().find(|p| p.0 == c)
                && cap.1 > 0
            {
                cap.1 -= 1;
                need -= 1;
                out.push(n);
            }
        }
        debug_assert_eq!(need, 0, "selector was asked for more nodes than are free");
    }
}
