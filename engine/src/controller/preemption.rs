//! Preemption orders (how a victim leaves its nodes) and reports that never came.

use super::*;

impl Controller {
    /// The victims taken as stopped without a checkpoint because their preemption was not reported
    /// in time, since the last call, with their orders' modes.
    pub fn take_unreported(&mut self) -> Vec<(AllocId, PreemptHow)> {
        std::mem::take(&mut self.unreported)
    }

    /// Victims whose preemption was not reported within the order's limit and the report grace:
    /// taken to have stopped without a checkpoint (a checkpoint order or a kill fails the victim, a
    /// stop suspends it), so the preemptor does not wait for their nodes forever. Whether any were.
    pub(super) fn expire_preemptions(&mut self, now: Time, world: &mut dyn World) -> Result<bool, ControlError> {
        let due: Vec<(AllocId, PreemptHow)> = self
            .preempting
            .iter()
            .filter(|(_, p)| p.1 <= now)
            .map(|(id, p)| (*id, p.0))
            .collect();
        for (id, how) in &due {
            self.preempting.remove(id);
            let victim = self
                .engine
                .allocation(*id)
                .is_some_and(|a| a.state == AllocState::Running)
                && self.runs.get(id.index()).is_some_and(|r| r.pending.is_some());
            if !victim {
                continue;
            }
            self.stats.preemption_report_timeouts += 1;
            self.unreported.push((*id, *how));
            self.emit(
                world,
                now,
                Decision::Stop {
                    alloc: *id,
                    why: StopReason::Unreported,
                },
            );
            let input = match how {
                PreemptHow::Stop { .. } => Input::Suspended(*id, false),
                PreemptHow::CheckpointThenStop { .. } | PreemptHow::Kill { .. } => {
                    Input::Exited(*id, EndReason::PreemptionKilled)
                }
            };
            self.apply(now, input, world)?;
        }
        Ok(!due.is_empty())
    }

    /// How a victim leaves its nodes (book: "Preemption Sequence").
    pub(super) fn preempt_order(
        &mut self,
        now: Time,
        alloc: AllocId,
        for_alloc: AllocId,
        reason: PreemptReason,
    ) -> Result<PreemptOrder, ControlError> {
        let (victim, preemptor) = (self.engine.allocation(alloc), self.engine.allocation(for_alloc));
        let Some(v) = victim else {
            return Err(EngineError::UnknownAlloc(alloc).into());
        };
        if self.check_preemptions {
            let vc = v.spec.preemption_class.get();
            let pc = preemptor.map_or(0, |a| a.spec.preemption_class.get());
            let moves_up = reason == PreemptReason::Priority && vc >= pc;
            if moves_up || self.engine.is_sensitive(alloc) {
                return Err(ControlError::Invariant(format!(
                    "preemption of {alloc} (class {vc}) for {for_alloc} (class {pc}) moves up or hits a sensitive allocation"
                )));
            }
        }
        let (at, how) = self.engine.preemption_how(alloc, reason, now);
        let r = self.run(alloc);
        r.pending = Some(r.progress(at));
        Ok(PreemptOrder {
            alloc,
            for_alloc,
            reason,
            at,
            how,
        })
    }
}
