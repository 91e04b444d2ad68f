//! Why a pending allocation is not running (book: `lattice diag`, "why is it pending"): what the last
//! pass of its pool found when it looked at it. Written by the pass where it keeps an allocation in the
//! queue, read by [`crate::engine::Engine::waiting`]; never an input to a decision.

use crate::ids::AllocId;
use crate::time::Time;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Waiting {
    /// Allocations it depends on have not ended as it needs.
    Dependencies { unresolved: u32 },
    /// Its input data is less than 80 % staged to the hot tier.
    Staging,
    /// Its task group is at its concurrency limit, or its mutex is held.
    GroupLimit,
    /// Just requeued: it sits out this cycle.
    Requeued,
    /// Kept for a cheaper energy window (f7).
    EnergyWindow,
    /// Its tenant's soft budget (GPU- or node-hours) is spent.
    Budget,
    /// Starting it would exceed a hard quota of its tenant or its project (nodes, concurrent
    /// allocations).
    Quota,
    /// Waiting for a placement in fewer dragonfly groups (f4, tight topology).
    Topology,
    /// Not enough eligible nodes are free; its nodes are reserved from `start` (backfill keeps them).
    Reserved { start: Time },
    /// Not enough eligible nodes are free (no reservation made for it this pass).
    Resources,
    /// Behind `head`, which blocks the queue (FCFS, or no free nodes left for anything behind it).
    BehindHead { head: AllocId },
}

impl Waiting {
    /// A line for people (`lattice status`'s REASON column, `lattice diag`).
    pub fn describe(&self, name: impl Fn(AllocId) -> String, now: Time) -> String {
        match self {
            Waiting::Dependencies { unresolved } => format!("waiting for {unresolved} dependencies"),
            Waiting::Staging => "input data being staged".into(),
            Waiting::GroupLimit => "task group at its concurrency limit".into(),
            Waiting::Requeued => "requeued, starts no earlier than the next cycle".into(),
            Waiting::EnergyWindow => "deferred to a cheaper energy window".into(),
            Waiting::Budget => "tenant budget exhausted".into(),
            Waiting::Quota => "waiting for quota headroom (tenant or project hard quota)".into(),
            Waiting::Topology => "waiting for a tighter placement (topology)".into(),
            Waiting::Reserved { start } => {
                let s = start.0.saturating_sub(now.0) / 1000;
                format!("not enough free nodes; its nodes are reserved in {}", human_secs(s))
            }
            Waiting::Resources => "not enough free nodes".into(),
            Waiting::BehindHead { head } => format!("behind {} at the head of the queue", name(*head)),
        }
    }
}

/// `95` → `1m35s`, `7260` → `2h01m`, `30` → `30s`.
fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_sentences() {
        let name = |a: AllocId| format!("a-{:06}", a.0);
        let now = Time(1_000_000);
        assert_eq!(
            Waiting::Reserved { start: Time(1_095_000) }.describe(name, now),
            "not enough free nodes; its nodes are reserved in 1m35s"
        );
        assert_eq!(
            Waiting::BehindHead { head: AllocId(7) }.describe(name, now),
            "behind a-000007 at the head of the queue"
        );
        assert_eq!(human_secs(7260), "2h01m");
        let v = serde_json::to_value(Waiting::Dependencies { unresolved: 2 }).unwrap();
        assert_eq!(v, serde_json::json!({"reason": "dependencies", "unresolved": 2}));
    }
}
