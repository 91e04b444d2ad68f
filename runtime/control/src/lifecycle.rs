//! What happens to an allocation after its start is proposed: the quorum's answer, ends,
//! suspensions, checkpoints, cancels, updates, DAGs, the durable record's ends and re-attachment
//! after a leadership change.

use super::*;
use lattice_engine::{AllocId, AllocState, Duration, EndReason, Input, Time};
use std::collections::BTreeMap;

impl Control {
    /// The quorum committed the proposal: the allocation runs (its launch is in the actions).
    pub fn committed(&mut self, id: AllocId) {
        if let Err(e) = self.input(Input::Committed(id)) {
            tracing::warn!("{}: commit not applied: {e}", self.name_of(id));
            return;
        }
        // A new run: earlier exit reports (of a requeued run) do not count.
        self.fleet.exits.remove(&id);
        self.stops.preempting.remove(&id);
        if let Some(m) = self.registry.meta.get_mut(id.index()) {
            m.last_rejection = None;
        }
    }

    /// How long a simulated agent runs the allocation from `resume_from` (its duration less the work a
    /// checkpoint kept).
    pub fn simulated_run(&self, id: AllocId, resume_from: Duration) -> std::time::Duration {
        let run = self
            .registry
            .meta
            .get(id.index())
            .map_or(std::time::Duration::ZERO, |m| m.run);
        run.saturating_sub(std::time::Duration::from_millis(resume_from.0))
    }

    /// The quorum rejected it: back to the queue, retried next cycle.
    pub fn rejected(&mut self, id: AllocId, why: String) {
        let _ = self.input(Input::Rejected(id));
        if let Some(m) = self.registry.meta.get_mut(id.index()) {
            m.last_rejection = Some(why);
        }
    }

    /// A run ended (success, failure, walltime, or killed while being preempted): returns whether the
    /// allocation was still running (its release and what follows are in the actions).
    pub fn completed(&mut self, id: AllocId, reason: EndReason) -> bool {
        let running = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| a.state == AllocState::Running);
        if !running {
            return false;
        }
        let now = self.now();
        // All the work it did, from the checkpoint its last run resumed from.
        let work = self.ctl.work_done(id, now);
        if let Err(e) = self.input(Input::Exited(id, reason)) {
            tracing::warn!("{}: end not applied: {e}", self.name_of(id));
            return false;
        }
        self.stops.preempting.remove(&id);
        let name = self
            .registry
            .meta
            .get(id.index())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        // Killed for a preemption: the replay's world decides that again (its run's natural length is
        // unknown). Killed at the walltime: it wanted more than it got.
        if reason != EndReason::PreemptionKilled {
            let extra = if reason == EndReason::WalltimeExceeded {
                0.001
            } else {
                0.0
            };
            self.capture_line(serde_json::json!({
                "ts": now.0 as f64 / 1000.0,
                "type": "complete",
                "alloc_id": name,
                "duration": work.as_secs_f64() + extra,
                "exit": if reason == EndReason::Success { 0 } else { 1 },
            }));
        }
        true
    }

    /// A preempted allocation stopped on its nodes (`checkpointed`: its checkpoint was written): it
    /// waits again, and resumes from the checkpoint when it runs. Returns whether it was being
    /// preempted.
    pub fn suspended(&mut self, id: AllocId, checkpointed: bool) -> bool {
        let Some(p) = self.stops.preempting.remove(&id) else {
            return false;
        };
        match self.input(Input::Suspended(id, checkpointed)) {
            Ok(()) => {
                // The victim is back in the queue; with its checkpoint, which took this long.
                self.tally.victim_requeues += 1;
                if checkpointed {
                    self.tally.checkpoints_ok += 1;
                    let s = self.now().0.saturating_sub(p.at.0) as f64 / 1000.0;
                    sample(&mut self.tally.preemption_checkpoint_s, s);
                }
                true
            }
            Err(e) => {
                tracing::warn!("{}: suspension not applied: {e}", self.name_of(id));
                false
            }
        }
    }

    /// A broker checkpoint was written (`ok`) or failed.
    pub fn checkpointed(&mut self, id: AllocId, ok: bool) {
        if ok {
            self.tally.checkpoints_ok += 1;
            if let Some(at) = self.stops.hinted_at.remove(&id) {
                let s = self.now().0.saturating_sub(at.0) as f64 / 1000.0;
                sample(&mut self.tally.checkpoint_s, s);
            }
        } else {
            self.tally.checkpoints_failed += 1;
            self.stops.hinted_at.remove(&id);
        }
        let _ = self.input(Input::Checkpointed(id, ok));
    }

    /// What happened since the last call (the metrics' events).
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// A heartbeat round trip an agent measured (seconds).
    pub fn heartbeat_rtt(&mut self, node: &str, secs: f64) {
        sample(&mut self.tally.heartbeat_rtt_s, (node.to_string(), secs));
    }

    /// The secure wipe of a released claim's nodes ended (`ok`: they return to the pool, else they
    /// are quarantined).
    pub fn wiped(&mut self, id: AllocId, ok: bool) {
        if !self.ctl.is_wiping(id) {
            return; // a late outcome: the wipe timed out (its nodes are quarantined)
        }
        if !ok {
            self.tally.wipe_failures += 1;
        }
        if let Err(e) = self.input(Input::WipeDone(id, ok)) {
            tracing::warn!("{}: wipe result not applied: {e}", self.name_of(id));
        }
    }

    /// Cancels; returns whether it held nodes (their release is in the actions). `None` = no such
    /// allocation.
    pub fn cancel(&mut self, name: &str) -> Option<bool> {
        let Some(&id) = self.registry.by_name.get(name) else {
            // Ended before this control plane took over: nothing to cancel.
            return self.registry.history.contains_key(name).then_some(false);
        };
        let held = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| matches!(a.state, AllocState::Running | AllocState::Staging));
        // (Its start at the quorum: the controller cancels it once the quorum answers.)
        if let Err(e) = self.input(Input::Cancel(id)) {
            tracing::warn!("{name}: cancel not applied: {e}");
        }
        self.stops.preempting.remove(&id);
        Some(held)
    }

    pub fn next_dag_id(&self) -> String {
        format!("dag-{:04}", self.registry.dags.len() + 1)
    }

    pub fn add_dag(&mut self, id: &str, members: Vec<(String, String)>) {
        self.registry.dags.insert(id.to_string(), members);
    }

    /// New ids start above `n` (ids are never reused, across fail-overs too).
    pub fn ids_above(&mut self, n: u64) {
        self.registry.next = self.registry.next.max(n + 1);
    }

    /// The ids of `names` whose allocations have ended (or are unknown here).
    pub fn ended_among<'a>(&self, names: impl Iterator<Item = &'a String>) -> Vec<String> {
        names
            .filter(|n| {
                self.registry
                    .by_name
                    .get(*n)
                    .and_then(|i| self.ctl.engine.allocation(*i))
                    .is_none_or(|a| a.state.is_terminal())
            })
            .cloned()
            .collect()
    }

    /// These ends are on a majority's copies (the controller's dependents may start on them).
    pub fn ends_settled(&mut self, ids: &[String]) {
        for id in ids {
            self.acks.settle_wanted.remove(id);
            let record = match self.registry.by_name.get(id) {
                Some(&a) => lattice_engine::Durable::End(a),
                None => match self.acks.prior_ends.get(id) {
                    Some(&n) => lattice_engine::Durable::PriorEnd(n),
                    None => continue,
                },
            };
            let _ = self.input(Input::Durable(record));
        }
    }

    /// The number the controller knows a prior end by (see [`Input::AwaitsPrior`]).
    pub(super) fn prior_end(&mut self, name: &str) -> u64 {
        let next = self.acks.prior_ends.len() as u64;
        *self.acks.prior_ends.entry(name.to_string()).or_insert(next)
    }

    /// The allocation a durable record is about, by name.
    pub(super) fn record_name(&self, record: lattice_engine::Durable) -> String {
        use lattice_engine::Durable;
        match record {
            Durable::Submission(a) | Durable::End(a) => self.name_of(a),
            Durable::PriorEnd(n) => self
                .acks
                .prior_ends
                .iter()
                .find(|&(_, &k)| k == n)
                .map(|(name, _)| name.clone())
                .unwrap_or_default(),
        }
    }

    /// The ends dependents wait for, to record on a majority.
    pub fn take_settle_wanted(&mut self) -> Vec<String> {
        self.acks.settle_wanted.iter().cloned().collect()
    }

    /// Forgets a DAG's record (an unacknowledged attempt's, superseded by its retry).
    pub fn remove_dag(&mut self, id: &str) {
        self.registry.dags.remove(id);
    }

    /// When `name` was submitted (ms since the epoch).
    pub fn submitted_ms(&self, name: &str) -> u64 {
        self.registry
            .by_name
            .get(name)
            .and_then(|&id| self.ctl.engine.allocation(id))
            .map_or(0, |a| a.submitted.0)
    }

    /// Recovery: `view` ended before this control plane took over (served as is; its id is taken).
    pub fn add_ended(&mut self, view: AllocationView) {
        self.registry.next = self.registry.next.max(id_number(&view.id).map_or(0, |k| k + 1));
        self.registry.history.insert(view.id.clone(), view);
    }

    /// Recovery: the queued `name` was first submitted at `submitted_ms`.
    pub fn resubmitted(&mut self, name: &str, submitted_ms: u64) {
        if let Some(&id) = self.registry.by_name.get(name) {
            let now = self.now();
            let _ = self.ctl.resubmitted(now, id, Time(submitted_ms));
        }
    }

    /// Recovery: the queued `name` still holds `nodes` at the quorum since `since_ms` — its agents
    /// kept running it. It runs there again from that start (with the exits its agents already
    /// reported), its agents are expected to report in (else its nodes time out as usual), and a
    /// simulated agent resumes it. Its network domain keeps `vni`, the VNI its start was recorded
    /// with.
    pub fn reattach(
        &mut self,
        name: &str,
        nodes: &[String],
        (since_ms, submitted_ms): (u64, u64),
        exits: &BTreeMap<String, i32>,
        vni: Option<u32>,
    ) -> Result<(), String> {
        let id = *self
            .registry
            .by_name
            .get(name)
            .ok_or_else(|| format!("{name}: not queued here"))?;
        let ids: Vec<lattice_engine::NodeId> = nodes
            .iter()
            .map(|n| {
                self.node_index(n)
                    .ok_or_else(|| format!("{name}: node {n} is not in the inventory"))
            })
            .collect::<Result<_, _>>()?;
        let now = self.now();
        let started = if since_ms == 0 { now } else { Time(since_ms) };
        self.ctl
            .adopt(now, id, &ids, (Time(submitted_ms.min(started.0)), started), vni)
            .map_err(|e| format!("{name}: {e}"))?;
        let reported: BTreeMap<u32, i32> = exits
            .iter()
            .filter_map(|(n, c)| self.node_index(n).map(|i| (i.0, *c)))
            .collect();
        let all = !ids.is_empty() && ids.iter().all(|n| reported.contains_key(&n.0));
        let failed = reported.values().any(|c| *c != 0);
        if !reported.is_empty() {
            self.fleet.exits.insert(id, reported);
        }
        for n in &ids {
            // Its silence times out from now; its sequence is unknown here, so its next heartbeat is
            // answered "has not registered" and the agent registers (its sequence restarts with this
            // control plane: an earlier heartbeat delivered again is never taken).
            let slot = &mut self.fleet.agents[n.index()];
            if slot.is_none() {
                *slot = Some((SEQ_UNKNOWN, now.0));
            }
        }
        if all || failed {
            // Every node had exited (or one failed) before the end was recorded: it ends now
            // (nobody would run it or report it again).
            self.fleet.exits.remove(&id);
            self.completed(
                id,
                if failed {
                    EndReason::ExitFailure
                } else {
                    EndReason::Success
                },
            );
            return Ok(());
        }
        self.resumed.push(id);
        Ok(())
    }

    /// With real agents: `name` may still run on `nodes` (held for it by the quorum, freed at a
    /// take-over); a next start of it waits until their agents show it stopped ([`Control::work`]).
    pub fn stopping_on_nodes(&mut self, name: &str, nodes: &[String]) {
        if !self.real_agents {
            return;
        }
        let Some(&id) = self.registry.by_name.get(name) else {
            return;
        };
        let ids: Vec<u32> = nodes.iter().filter_map(|n| self.node_index(n)).map(|n| n.0).collect();
        self.fleet.stopping_on.entry(id).or_default().extend(ids);
    }

    /// Re-attached allocations whose simulated agents should resume them (once).
    pub fn take_resumed(&mut self) -> Vec<(AllocId, std::time::Duration)> {
        std::mem::take(&mut self.resumed)
            .into_iter()
            .filter_map(|id| self.registry.meta.get(id.index()).map(|m| (id, m.run)))
            .collect()
    }

    /// An allocation by its id (`a-000123`), or the "no allocation" error naming the `id` field.
    pub(super) fn allocation_named(&self, name: &str) -> Result<(AllocId, &lattice_engine::Allocation), FieldError> {
        let id = self.id_of(name);
        id.and_then(|i| self.ctl.engine.allocation(i).map(|a| (i, a)))
            .ok_or_else(|| bad("id", format!("no allocation {name}")))
    }

    /// Applies a `PATCH`: walltime (through the engine, so reservations follow), tags, telemetry mode.
    /// Everything is validated before anything changes.
    pub fn update(&mut self, name: &str, req: &UpdateRequest) -> Result<(), FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if a.state.is_terminal() {
            return Err(bad("state", format!("{name} has ended ({})", a.state.as_str())));
        }
        let now = self.now();
        let walltime = match &req.walltime {
            None => None,
            Some(w) => {
                let d = lattice_traces::parse_walltime(w).map_err(|m| bad("walltime", m))?;
                if a.spec.lifecycle.walltime().is_none() {
                    return Err(bad("walltime", "only a bounded allocation has a walltime"));
                }
                if let Some(t) = a.started
                    && a.state == AllocState::Running
                    && now.since(t) > d
                {
                    return Err(bad(
                        "walltime",
                        format!(
                            "`{w}` is shorter than the {:.0} s already run",
                            now.since(t).as_secs_f64()
                        ),
                    ));
                }
                Some(d)
            }
        };
        if let Some(t) = &req.telemetry
            && !matches!(t.mode.as_str(), "prod" | "debug" | "audit")
        {
            return Err(bad(
                "telemetry.mode",
                format!("`{}`: expected prod, debug or audit", t.mode),
            ));
        }
        if let Some(d) = walltime {
            self.input(Input::Walltime(id, d))
                .map_err(|e| bad("walltime", e.to_string()))?;
        }
        let m = &mut self.registry.meta[id.index()];
        for (k, v) in &req.tags {
            if v.is_empty() {
                m.tags.remove(k);
            } else {
                m.tags.insert(k.clone(), v.clone());
            }
        }
        if let Some(t) = &req.telemetry {
            m.telemetry = t.mode.clone();
        }
        Ok(())
    }

    /// `POST .../checkpoint`: a running allocation's agents are asked to checkpoint (simulated agents
    /// take it at once). Returns the number of checkpoints taken so far.
    pub fn checkpoint(&mut self, name: &str) -> Result<u32, FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running {
            return Err(bad(
                "state",
                format!(
                    "{name} is {}: only a running allocation can checkpoint",
                    a.state.as_str()
                ),
            ));
        }
        let now = self.now();
        // Real agents deliver the hint (SIGUSR1 to the task's process group) at their next poll.
        let nodes: std::collections::BTreeSet<u32> = a.nodes.iter().map(|n| n.0).collect();
        self.stops.checkpoint_hints.insert(id, nodes);
        let m = &mut self.registry.meta[id.index()];
        m.checkpoints += 1;
        m.last_checkpoint_ms = Some(now.0);
        Ok(m.checkpoints)
    }
}
