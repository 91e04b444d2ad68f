//! The fake quorum: commits the engine's proposals after a configurable latency, validating node ownership
//! the way the Raft state machine does (a node can have one owner; a proposal for an owned or
//! unschedulable node is rejected).

use lattice_engine::{AllocId, Engine, NodeId, Proposal};

#[derive(Debug)]
pub struct FakeQuorum {
    owner: Vec<Option<AllocId>>,
    pending: Vec<(AllocId, Vec<NodeId>)>,
    pub commits: u64,
    pub rejections: u64,
}

impl FakeQuorum {
    pub fn new(nodes: usize) -> FakeQuorum {
        FakeQuorum {
            owner: vec![None; nodes],
            pending: Vec::new(),
            commits: 0,
            rejections: 0,
        }
    }

    /// Records a proposal to be decided at commit time.
    pub fn propose(&mut self, p: Proposal) {
        self.pending.push((p.alloc, p.nodes));
    }

    /// Decides the proposal of `alloc`: `true` = committed (ownership recorded).
    pub fn decide(&mut self, engine: &Engine, alloc: AllocId) -> bool {
        let Some(i) = self.pending.iter().position(|p| p.0 == alloc) else {
            return false;
        };
        let (_, nodes) = self.pending.swap_remove(i);
        let ok = nodes
            .iter()
            .all(|n| self.owner[n.index()].is_none() && engine.node(*n).is_some_and(|x| x.state.runs_allocations()));
        if ok {
            for n in &nodes {
                self.owner[n.index()] = Some(alloc);
            }
            self.commits += 1;
        } else {
            self.rejections += 1;
        }
        ok
    }

    /// The allocation ended: its nodes are released.
    pub fn release(&mut self, engine: &Engine, alloc: AllocId) {
        if let Some(a) = engine.allocation(alloc) {
            for n in &a.nodes {
                if self.owner[n.index()] == Some(alloc) {
                    self.owner[n.index()] = None;
                }
            }
        }
    }
}
