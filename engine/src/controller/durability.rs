//! Durability holds: a start waits until what it depends on is on a majority of the quorum
//! members' disks. The members keep each allocation's record (its submission, and how it ended)
//! beside the Raft log; a record only one member holds can be lost in a fail-over. A start whose
//! submission a fail-over could lose would run a job its owner was never told was queued; a
//! dependent that starts on a dependency's end a fail-over could lose would run beside the
//! dependency run again (both found by DST).
//!
//! The world says what is not yet durable ([`Input::NotDurable`]) and when it becomes so
//! ([`Input::Durable`]); with [`Controller::durable_ends`], every end counts as not durable until
//! the world says otherwise. A proposal that waits for something is refused before the quorum
//! ([`Refusal::NotDurable`]) and stays Pending, as after a rejection; an end it waits for is asked
//! of the world once ([`Decision::Persist`]).

use super::*;
use crate::world::{Durable, Refusal};

impl Controller {
    /// What `id`'s start waits for (empty: nothing; it may be proposed).
    pub fn awaiting(&self, id: AllocId) -> Vec<Durable> {
        let d = &self.durability;
        let mut out = Vec::new();
        if d.unacknowledged.contains(&id) {
            out.push(Durable::Submission(id));
        }
        if self.durable_ends
            && let Some(a) = self.engine.allocation(id)
        {
            out.extend(
                a.spec
                    .depends_on
                    .iter()
                    .filter(|dep| !d.settled.contains(&dep.on))
                    .map(|dep| Durable::End(dep.on)),
            );
        }
        if let Some(prior) = d.prior.get(&id) {
            out.extend(
                prior
                    .iter()
                    .filter(|n| !d.settled_prior.contains(n))
                    .map(|&n| Durable::PriorEnd(n)),
            );
        }
        out
    }

    /// A proposal whose start waits for records not yet durable: refused before the quorum (it
    /// stays Pending and is proposed again at the next pass); the ends it waits for are asked of
    /// the world, once each. `false`: it waits for nothing.
    pub(super) fn hold_for_durability(
        &mut self,
        now: Time,
        id: AllocId,
        world: &mut dyn World,
    ) -> Result<bool, ControlError> {
        let awaiting = self.awaiting(id);
        if awaiting.is_empty() {
            return Ok(false);
        }
        self.engine.handle_reject(now, id)?;
        self.stats.durability_holds += 1;
        for &r in &awaiting {
            if !matches!(r, Durable::Submission(_)) && self.durability.asked.insert(r) {
                self.emit(world, now, Decision::Persist(r));
            }
        }
        let why = Refusal::NotDurable { awaiting };
        self.emit(world, now, Decision::Refuse { alloc: id, why });
        Ok(true)
    }

    /// [`Input::NotDurable`], [`Input::Durable`] and [`Input::AwaitsPrior`].
    pub(super) fn apply_durability(&mut self, input: Input) {
        let d = &mut self.durability;
        match input {
            Input::NotDurable(Durable::Submission(a)) => {
                d.unacknowledged.insert(a);
            }
            Input::NotDurable(Durable::End(a)) => {
                d.settled.remove(&a);
            }
            Input::NotDurable(Durable::PriorEnd(n)) => {
                d.settled_prior.remove(&n);
            }
            Input::Durable(r) => {
                d.asked.remove(&r);
                match r {
                    Durable::Submission(a) => {
                        d.unacknowledged.remove(&a);
                    }
                    Durable::End(a) => {
                        d.settled.insert(a);
                    }
                    Durable::PriorEnd(n) => {
                        d.settled_prior.insert(n);
                    }
                }
            }
            Input::AwaitsPrior(a, n) => {
                d.prior.entry(a).or_default().insert(n);
            }
            _ => {}
        }
    }
}
