//! Per-allocation bookkeeping of the engine ([`Meta`]), kept only while an allocation can still be
//! scheduled or holds nodes: [`MetaTable`] frees an ended allocation's entry, so a year's replay keeps
//! bookkeeping for the allocations that are live, not for every one ever submitted.

use crate::ids::{AllocId, NodeId};
use crate::profile::Picks;
use crate::time::Time;

#[derive(Clone, Debug, Default)]
pub(crate) struct Meta {
    /// Node classes whose capabilities satisfy the constraints (in the allocation's pool).
    pub eligible: Vec<u16>,
    /// Nodes held per class while proposed or running.
    pub held: Picks,
    pub holding: bool,
    pub proposed_at: Option<Time>,
    pub unresolved_deps: u32,
    /// Node-seconds (GPU-seconds on GPU pools) per second while running, for fair-share accounting.
    pub usage_rate: f64,
    /// Requested GPU-hours (node-hours on CPU-only pools).
    pub requested_gpu_hours: f64,
    /// Being preempted (checkpointing); excluded from further victim sets.
    pub preempting: bool,
    /// The allocation this one is being preempted for.
    pub preempt_for: Option<AllocId>,
    /// Being preempted: when it is surely off its nodes (its stop order's start plus its limit).
    pub released_by: Option<Time>,
    /// Victims still releasing nodes for this pending allocation.
    pub awaiting_victims: u32,
    /// Victims were preempted for it: it is first in its pool's queue until it starts.
    pub preemptor: bool,
    /// Classes of *other* pools whose capabilities satisfy the constraints (borrowable nodes).
    pub borrow_eligible: Vec<u16>,
    /// A broker checkpoint is in flight.
    pub checkpointing: bool,
    /// When its last checkpoint completed.
    pub last_checkpoint: Option<Time>,
    /// When it was last requeued (it sits out that cycle).
    pub requeued_at: Option<Time>,
    /// Nodes its prologue failed on: placed last (other nodes first) when it starts again.
    pub avoid: Vec<NodeId>,
    pub prologue_failures: u32,
    /// Why its pool's last pass kept it waiting (cleared when it starts).
    pub waiting: Option<crate::waiting::Waiting>,
}

impl Meta {
    /// What an allocation's bookkeeping reads as once it has ended (and was released).
    const EMPTY: Meta = Meta {
        eligible: Vec::new(),
        held: Vec::new(),
        holding: false,
        proposed_at: None,
        unresolved_deps: 0,
        usage_rate: 0.0,
        requested_gpu_hours: 0.0,
        preempting: false,
        preempt_for: None,
        released_by: None,
        awaiting_victims: 0,
        preemptor: false,
        borrow_eligible: Vec::new(),
        checkpointing: false,
        last_checkpoint: None,
        requeued_at: None,
        avoid: Vec::new(),
        prologue_failures: 0,
        waiting: None,
    };
}

static EMPTY: Meta = Meta::EMPTY;

/// No entry: the allocation ended and its bookkeeping was released.
const RELEASED: u32 = u32::MAX;

/// Bookkeeping by allocation index: an index table into the live entries, whose slots are reused
/// once an allocation's entry is released. A released entry reads as [`Meta::EMPTY`]; writing one
/// gives it a fresh entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct MetaTable {
    slot: Vec<u32>,
    entries: Vec<Meta>,
    free: Vec<u32>,
}

impl MetaTable {
    /// The entry of the next allocation (index `len()`).
    pub fn push(&mut self, m: Meta) {
        let s = self.place(m);
        self.slot.push(s);
    }

    fn place(&mut self, m: Meta) -> u32 {
        match self.free.pop() {
            Some(s) => {
                self.entries[s as usize] = m;
                s
            }
            None => {
                self.entries.push(m);
                (self.entries.len() - 1) as u32
            }
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&Meta> {
        self.slot.get(i).map(|&s| self.entry(s))
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut Meta> {
        (i < self.slot.len()).then(|| &mut self[i])
    }

    /// A fresh entry for released allocation `i` (something writes its bookkeeping again).
    #[cold]
    fn renew(&mut self, i: usize) -> u32 {
        let s = self.place(Meta::EMPTY);
        self.slot[i] = s;
        s
    }

    #[inline]
    fn entry(&self, s: u32) -> &Meta {
        if s == RELEASED {
            &EMPTY
        } else {
            &self.entries[s as usize]
        }
    }

    /// Frees the entry of allocation `i` (it ended); its memory goes to the next allocation.
    pub fn release(&mut self, i: usize) {
        let Some(s) = self.slot.get_mut(i) else { return };
        if *s != RELEASED {
            self.entries[*s as usize] = Meta::EMPTY;
            self.free.push(*s);
            *s = RELEASED;
        }
    }
}

impl std::ops::Index<usize> for MetaTable {
    type Output = Meta;
    #[inline]
    fn index(&self, i: usize) -> &Meta {
        self.entry(self.slot[i])
    }
}

impl std::ops::IndexMut<usize> for MetaTable {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Meta {
        let mut s = self.slot[i];
        if s == RELEASED {
            s = self.renew(i);
        }
        &mut self.entries[s as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_entry_reads_empty_and_its_slot_is_reused() {
        let mut t = MetaTable::default();
        for i in 0..3 {
            t.push(Meta {
                unresolved_deps: i,
                ..Meta::default()
            });
        }
        t.release(1);
        t.release(1);
        assert_eq!(t[1].unresolved_deps, 0);
        assert_eq!((t[0].unresolved_deps, t[2].unresolved_deps), (0, 2));
        t.push(Meta {
            unresolved_deps: 7,
            ..Meta::default()
        });
        assert_eq!(t.entries.len(), 3, "the released slot is reused");
        assert_eq!((t.slot.len(), t[3].unresolved_deps, t[2].unresolved_deps), (4, 7, 2));
        t[1].unresolved_deps = 5;
        assert_eq!(t[1].unresolved_deps, 5);
        assert_eq!(t.get(4).map(|m| m.unresolved_deps), None);
    }
}
