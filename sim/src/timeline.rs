//! The run's timeline, kept for reports: every run of an allocation on its nodes (a preempted or
//! requeued allocation has several) and the point events a site review asks about — preemptions,
//! checkpoints, borrowing, node failures. Node sets are stored as ranges of consecutive node indices,
//! which keeps a 100k-allocation replay small (placements are mostly contiguous).

use lattice_engine::NodeId;

/// One run of an allocation: from its start on `nodes` until it ended, was suspended or lost its nodes
/// (`end_s` is `None` when it was still running when the replay stopped).
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpan {
    /// Index of the allocation in [`crate::SimResult::jobs`].
    pub job: u32,
    pub start_s: f64,
    pub end_s: Option<f64>,
    /// Inclusive ranges `(first, last)` of node indices (inventory order), ascending.
    pub nodes: Vec<(u32, u32)>,
}

/// What happened at a point in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimelineKind {
    /// A running allocation was told to make room (`priority`, `reclaim`, `sensitive`).
    Preemption(&'static str),
    /// A checkpoint finished in time (broker hint or preemption).
    CheckpointDone,
    /// A checkpoint could not be written in time (or at all): the allocation was killed or lost work.
    CheckpointFailed,
    /// An allocation started holding this many nodes borrowed from another vCluster.
    Borrow(u32),
    /// A node went down (hardware failure or heartbeat grace timeout).
    NodeDown,
}

impl TimelineKind {
    /// The event's series name in reports.
    pub fn label(self) -> &'static str {
        match self {
            TimelineKind::Preemption(_) => "preemptions",
            TimelineKind::CheckpointDone => "checkpoints completed",
            TimelineKind::CheckpointFailed => "checkpoints failed",
            TimelineKind::Borrow(_) => "starts on borrowed nodes",
            TimelineKind::NodeDown => "node failures",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimelineEvent {
    pub time_s: f64,
    pub kind: TimelineKind,
}

/// Runs and events, each in the order they happened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub runs: Vec<RunSpan>,
    pub events: Vec<TimelineEvent>,
}

/// Sorted node ids as inclusive ranges of consecutive indices.
pub fn node_ranges(nodes: &[NodeId]) -> Vec<(u32, u32)> {
    let mut ids: Vec<u32> = nodes.iter().map(|n| n.0).collect();
    ids.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some(r) if r.1 + 1 == id => r.1 = id,
            Some(r) if r.1 == id => {}
            _ => out.push((id, id)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_consecutive_ids_in_any_order() {
        let ids = [5, 1, 2, 3, 9, 10, 7].map(NodeId);
        assert_eq!(node_ranges(&ids), vec![(1, 3), (5, 5), (7, 7), (9, 10)]);
        assert_eq!(node_ranges(&[]), vec![]);
    }
}
