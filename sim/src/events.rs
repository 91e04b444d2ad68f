//! The event queue: a min-heap ordered by (time, rank, sequence). `rank` encodes which kinds of event go
//! first at equal times; `sequence` (insertion order) breaks the remaining ties, so the order is total and
//! deterministic.

use lattice_engine::{AllocId, EndReason, Time};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The trace job at this index arrives.
    Arrival(usize),
    /// The fake quorum commits an outstanding proposal.
    Commit(AllocId),
    /// A fake node reports the allocation ended (the run it belongs to: stale runs are ignored).
    Completion(AllocId, EndReason, u32),
    /// A preempted allocation finished its checkpoint (or grace period) and stops.
    Suspend(AllocId, u32, bool),
    /// The engine asked to be woken (a cycle tick, an energy window).
    Wakeup,
    /// The secure wipe of a released claim's nodes ended (`true`: they return to the pool).
    WipeDone(AllocId, bool),
    /// One node's wipe ended (an operator's retry wipes a node alone).
    NodeWiped(AllocId, lattice_engine::NodeId, bool),
    /// A claim's node booted the hardened image (`true`) or failed to.
    Booted(AllocId, lattice_engine::NodeId, bool),
    /// A broker checkpoint of the run `u32` finished.
    CheckpointDone(AllocId, u32),
    /// Checkpoint storage went down (`false`) or came back (`true`).
    Storage(bool),
    /// The trace's cluster event at this index of `Workload::events`.
    Trace(usize),
    /// A node's heartbeat grace period ends (Down unless it recovered).
    Grace(u32),
    /// The failure injector fails (`true`) or repairs (`false`) a node.
    Inject(u32, bool),
    /// The node agent reports the allocation's prologue failed on a node (run epoch `u32`).
    PrologueFail(AllocId, u32, u32),
    /// A record reached a majority of the quorum members' disks.
    Durable(lattice_engine::Durable),
    /// Sample `u32` of the synthetic load curve at this index of `Workload::events`.
    LoadSample(usize, u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub time: Time,
    pub kind: EventKind,
}

/// Payloads sit in slots that are reused once their event is popped, so the queue holds what is pending,
/// not every event of the replay.
#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(Time, u8, u64, u32)>>,
    payload: Vec<Option<EventKind>>,
    free: Vec<u32>,
    seq: u64,
}

impl EventQueue {
    pub fn push(&mut self, time: Time, rank: u8, kind: EventKind) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.payload[s as usize] = Some(kind);
                s
            }
            None => {
                self.payload.push(Some(kind));
                (self.payload.len() - 1) as u32
            }
        };
        // The sequence number is unique, so the slot never decides the order.
        self.heap.push(Reverse((time, rank, self.seq, slot)));
        self.seq += 1;
    }

    pub fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|r| r.0.0)
    }

    pub fn pop(&mut self) -> Option<Event> {
        let Reverse((time, _, _, slot)) = self.heap.pop()?;
        let kind = self.payload[slot as usize].take().expect("each event is popped once");
        self.free.push(slot);
        Some(Event { time, kind })
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

// Event ranks at equal times.
pub const RANK_END: u8 = 0;
pub const RANK_ARRIVAL: u8 = 2;
pub const PYSS_RANK_ARRIVAL: u8 = 0;
pub const PYSS_RANK_END: u8 = 1;
pub const RANK_WAKEUP: u8 = 3;
/// Node changes come after completions and before arrivals (DESIGN.md §3 "Event order").
pub const RANK_NODE: u8 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_rank_then_insertion() {
        let mut q = EventQueue::default();
        q.push(Time(5), 2, EventKind::Arrival(0));
        q.push(Time(5), 0, EventKind::Commit(AllocId(1)));
        q.push(Time(1), 2, EventKind::Arrival(1));
        q.push(Time(5), 2, EventKind::Arrival(2));
        let order: Vec<EventKind> = std::iter::from_fn(|| q.pop()).map(|e| e.kind).collect();
        assert_eq!(
            order,
            vec![
                EventKind::Arrival(1),
                EventKind::Commit(AllocId(1)),
                EventKind::Arrival(0),
                EventKind::Arrival(2)
            ]
        );
    }

    #[test]
    fn slots_are_reused_and_order_is_kept() {
        let mut q = EventQueue::default();
        let mut popped = Vec::new();
        for i in 0..1000u64 {
            q.push(Time(i), 2, EventKind::Arrival(i as usize));
            q.push(Time(i), 0, EventKind::Wakeup);
            popped.push(q.pop().expect("pending").kind);
            popped.push(q.pop().expect("pending").kind);
        }
        while let Some(e) = q.pop() {
            popped.push(e.kind);
        }
        // Never more than two pending at once: two slots, however many events passed through.
        assert_eq!(q.payload.len(), 2);
        let arrivals: Vec<usize> = popped
            .iter()
            .filter_map(|k| match k {
                EventKind::Arrival(i) => Some(*i),
                _ => None,
            })
            .collect();
        assert_eq!(arrivals, (0..1000).collect::<Vec<_>>());
        assert_eq!(popped.len(), 2000);
        // Equal times: the lower rank first, though it was pushed second.
        assert_eq!(popped[0], EventKind::Wakeup);
    }
}
