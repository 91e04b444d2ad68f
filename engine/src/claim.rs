//! Sensitive claims are immediate or refused (book: "Concurrent Sensitive Claims": "There is no
//! queueing or waitlist for sensitive node claims — they are immediate or rejected"). A claim that
//! its pool's pass neither starts nor frees nodes for (by preempting non-sensitive occupants) ends
//! in that pass, refused, with what stood in its way: the nodes other allocations hold (the world
//! names their owners: "which nodes are already claimed and by which user") and those out of
//! service. Two claims on the same nodes are ordered by the pass: the first takes them, the second
//! is refused — whichever world runs the controller.

use crate::alloc::{AllocState, EndReason};
use crate::engine::Engine;
use crate::ids::AllocId;
use crate::time::Time;
use crate::waiting::Waiting;

pub use crate::refusal::ClaimRefusal;

impl Engine {
    /// After a pool's pass: every claim in `rest` (still queued) that is not waiting for victims it
    /// ordered preempted, nor for its own data staging or task-group limit, is refused and leaves
    /// the queue. Returns how many were.
    pub(crate) fn refuse_unplaced_claims(&mut self, now: Time, rest: &mut Vec<AllocId>) -> u32 {
        let mut refused = 0;
        let mut i = 0;
        while i < rest.len() {
            let id = rest[i];
            let a = &self.allocs[id.index()];
            let m = &self.meta[id.index()];
            let own_wait = matches!(
                m.waiting,
                Some(Waiting::Staging | Waiting::GroupLimit | Waiting::Requeued)
            );
            if !a.spec.sensitive_claim
                || a.state != AllocState::Pending
                || m.proposed_at.is_some()
                || m.awaiting_victims > 0
                || own_wait
            {
                i += 1;
                continue;
            }
            let why = if matches!(m.waiting, Some(Waiting::Quota | Waiting::Budget)) {
                ClaimRefusal::OverQuota
            } else {
                self.claim_conflict(id)
            };
            rest.remove(i);
            // Pending → Cancelled is always a valid transition.
            let _ = self.transition(id, AllocState::Cancelled);
            self.finish(now, id, EndReason::ClaimRefused);
            self.claim_refusals.push((id, why));
            refused += 1;
        }
        refused
    }

    /// What stands in claim `id`'s way: its eligible nodes, free, held (and by which allocation) or
    /// out of service.
    fn claim_conflict(&self, id: AllocId) -> ClaimRefusal {
        let eligible = &self.meta[id.index()].eligible;
        let (mut free, mut held, mut out) = (0, Vec::new(), Vec::new());
        for n in &self.nodes {
            if !eligible.contains(&self.class_of(n.id)) {
                continue;
            }
            match n.owner {
                Some(o) => held.push((n.id, o.alloc)),
                None if self.free.contains(n.id) => free += 1,
                None => out.push(n.id),
            }
        }
        ClaimRefusal::OwnershipConflict {
            needed: self.allocs[id.index()].spec.nodes.min,
            free,
            held,
            out,
        }
    }

    /// The claims refused since the last call, in the order they were, with why.
    pub fn take_claim_refusals(&mut self) -> Vec<(AllocId, ClaimRefusal)> {
        std::mem::take(&mut self.claim_refusals)
    }
    /// Whether claim `id` has its nodes coming: proposed at the quorum, or waiting for the victims
    /// it ordered preempted to leave them.
    pub fn claim_in_hand(&self, id: AllocId) -> bool {
        self.is_proposed(id) || self.meta.get(id.index()).is_some_and(|m| m.awaiting_victims > 0)
    }
}
