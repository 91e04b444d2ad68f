//! The control plane on a replay's virtual clock: [`ReplayHost`] puts the runtime's [`Control`] —
//! its input handling, its translation of decisions into named [`Action`]s — into `rm-replay`'s
//! event loop ([`lattice_sim::simulate_with`]), and carries each action out on the simulator's fake
//! world through the controller's ports. The same trace then goes through both worlds' code down to
//! the same fake world; the parity test compares their decision logs and `jobs.csv`.

use lattice_control::Control;
use lattice_control::world::Action;
use lattice_engine::{
    AllocId, AllocSpec, ControlError, Controller, Decision, Input, NodeId, PassStats, Proposal, SubmitError, Time,
    World,
};
use lattice_sim::{Host, SiteNames};
use lattice_traces::TraceJob;
use std::sync::Arc;

/// The runtime's control plane as the replay's host. `log` holds every action it carried out, as
/// decision-log lines (`"<ms> <decision>"`).
pub struct ReplayHost {
    pub control: Control,
    pub log: Vec<String>,
    /// The last wake-up asked of the world (it is not asked twice).
    last_wake: Option<Time>,
}

impl ReplayHost {
    /// The control plane around the replay's controller, with the replay's names.
    pub fn new(ctl: Controller, names: &SiteNames) -> anyhow::Result<ReplayHost> {
        let vclusters = names.vclusters.iter().cloned().collect();
        let default = names.vclusters.first().map(|v| v.0.clone()).unwrap_or_default();
        let mut control = Control::with_controller(ctl, names.nodes.clone(), vclusters, default)?;
        control.known_tenants(&names.tenants);
        control.known_projects(&names.projects);
        Ok(ReplayHost {
            control,
            log: Vec::new(),
            last_wake: None,
        })
    }

    /// Carries out what the control plane decided, in order, on `world`. A world's immediate
    /// answer (a commit, a rejection, a failed checkpoint) goes back to the control plane at once,
    /// and what that causes is carried out before the next action (as the controller does).
    fn carry_out(&mut self, now: Time, world: &mut dyn World) {
        for a in self.control.take_actions() {
            let d = self.decision(&a);
            self.log.push(format!("{} {d}", now.0));
            let answer = d.dispatch(world, &self.control.ctl.engine, now);
            match (a, answer) {
                (Action::Propose(p), Some(true)) => {
                    self.control.committed(p.alloc);
                    self.carry_out(now, world);
                }
                (Action::Propose(p), Some(false)) => {
                    self.control.rejected(p.alloc, "rejected by the quorum".into());
                    self.carry_out(now, world);
                }
                (Action::Checkpoint { alloc, .. }, Some(ok)) => {
                    self.control.checkpointed(alloc, ok);
                    self.carry_out(now, world);
                }
                _ => {}
            }
        }
    }

    fn node(&self, name: &str) -> NodeId {
        self.control.node_index(name).expect("actions name inventory nodes")
    }

    fn nodes(&self, names: &[String]) -> Vec<NodeId> {
        names.iter().map(|n| self.node(n)).collect()
    }

    /// The decision an action carries out, rebuilt from what the action names (ids, node names).
    fn decision(&self, a: &Action) -> Decision {
        match a {
            Action::Propose(p) => Decision::Propose(Proposal {
                alloc: p.alloc,
                nodes: self.nodes(&p.nodes),
                backfilled: p.backfilled,
            }),
            Action::Refuse { alloc, why, .. } => Decision::Refuse {
                alloc: *alloc,
                why: why.clone(),
            },
            Action::Persist { record, .. } => Decision::Persist(*record),
            Action::Release { alloc, nodes, .. } => Decision::Release {
                alloc: *alloc,
                nodes: self.nodes(nodes),
            },
            Action::Scale { alloc, node, added, .. } => Decision::Scale {
                alloc: *alloc,
                node: self.node(node),
                added: *added,
            },
            Action::Audit {
                alloc, event, nodes, ..
            } => Decision::Audit {
                alloc: *alloc,
                event: *event,
                nodes: self.nodes(nodes),
            },
            Action::Launch {
                alloc,
                nodes,
                resume_from,
                staging_remaining_s,
                vni,
                ..
            } => Decision::Launch {
                alloc: *alloc,
                nodes: self.nodes(nodes),
                resume_from: *resume_from,
                staging_remaining_s: *staging_remaining_s,
                vni: *vni,
            },
            Action::Stop { alloc, why, .. } => Decision::Stop {
                alloc: *alloc,
                why: *why,
            },
            Action::Preempt { order, .. } => Decision::Preempt(*order),
            Action::Checkpoint { alloc, .. } => Decision::Checkpoint { alloc: *alloc },
            Action::Wipe { alloc, nodes, .. } => Decision::Wipe {
                alloc: *alloc,
                nodes: self.nodes(nodes),
            },
            Action::Boot { alloc, nodes, .. } => Decision::Boot {
                alloc: *alloc,
                nodes: self.nodes(nodes),
            },
            Action::Watch { node, grace } => Decision::Watch {
                node: *node,
                grace: *grace,
            },
            Action::Drift {
                node,
                drifted,
                sensitive,
                ..
            } => Decision::Drift {
                node: *node,
                drifted: *drifted,
                sensitive: *sensitive,
            },
        }
    }
}

impl Host for ReplayHost {
    fn controller(&self) -> &Controller {
        &self.control.ctl
    }

    fn controller_mut(&mut self) -> &mut Controller {
        &mut self.control.ctl
    }

    fn submit(&mut self, now: Time, job: &TraceJob, spec: Arc<AllocSpec>) -> Result<AllocId, SubmitError> {
        self.control.set_clock(now);
        let run = job
            .runtime
            .map_or(std::time::Duration::ZERO, |r| std::time::Duration::from_millis(r.0));
        self.control
            .submit_spec(Arc::unwrap_or_clone(spec), &job.id, job.user().map(str::to_string), run)
    }

    /// Through the entry point SMD's new nodes take ([`Control::add_nodes`]), which also captures it.
    fn add_node(&mut self, now: Time, node: &lattice_traces::JoiningNode) -> Result<NodeId, String> {
        self.control.set_clock(now);
        let added = self.control.add_nodes(&node.entry, None, true)?;
        Ok(self.node(&added[0]))
    }

    /// As a leader applies what the quorum holds ([`Control::apply_settings`], which captures them).
    fn settings(&mut self, now: Time, settings: &lattice_engine::controller::settings::Settings) {
        self.control.set_clock(now);
        self.control.apply_settings(settings);
    }

    /// As the quorum's record reaches the leader ([`Control::apply_discovered`]).
    fn set_capabilities(
        &mut self,
        now: Time,
        node: NodeId,
        found: &lattice_engine::DiscoveredCapabilities,
    ) -> Result<(), String> {
        self.control.set_clock(now);
        let name = self.control.node_names()[node.index()].clone();
        self.control
            .apply_discovered(&name, found.clone())
            .map(|_| ())
            .map_err(|e| e.message)
    }

    /// Each input through the control plane's own entry point for it (what an agent report, a
    /// quorum answer or an API call invokes in production).
    fn apply(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError> {
        self.control.set_clock(now);
        match input {
            Input::Committed(id) => self.control.committed(id),
            Input::Rejected(id) => self.control.rejected(id, "rejected by the quorum".into()),
            Input::Exited(id, reason) => {
                self.control.completed(id, reason);
            }
            Input::Suspended(id, checkpointed) => {
                self.control.suspended(id, checkpointed);
            }
            Input::Checkpointed(id, ok) => self.control.checkpointed(id, ok),
            Input::WipeDone(id, ok) => self.control.wiped(id, ok),
            Input::Booted(id, node, ok) => {
                self.control.booted(id, node, ok);
            }
            Input::Cancel(id) => {
                let name = self.control.name_of(id);
                self.control.cancel(&name);
            }
            Input::Order(node, o) => {
                let name = self.control.node_names()[node.index()].clone();
                self.control.set_admin(&name, o.drained, o.disabled);
            }
            // The mirrors' answers: as a submission's request or the loop's `settle_ends` gives them.
            Input::NotDurable(lattice_engine::Durable::Submission(id)) => {
                let name = self.control.name_of(id);
                self.control.unacked(&name, true);
            }
            Input::Durable(lattice_engine::Durable::Submission(id)) => {
                let name = self.control.name_of(id);
                self.control.acked(&name);
            }
            Input::Durable(lattice_engine::Durable::End(id)) => {
                let name = self.control.name_of(id);
                self.control.ends_settled(&[name]);
            }
            Input::Weights(vc, weights) => {
                let name = self.control.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default();
                if let Err(e) = self.control.set_weights(&name, weights) {
                    return Err(ControlError::Invariant(format!("{}: {}", e.field, e.message)));
                }
            }
            Input::VCluster(vc, config) => {
                let name = self.control.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default();
                if let Err(e) = self.control.put_vcluster(&name, config) {
                    return Err(ControlError::Invariant(format!("{}: {}", e.field, e.message)));
                }
            }
            Input::CheckpointBandwidth(gbps) => {
                self.control.checkpoint_bandwidth(gbps);
            }
            other => self.control.input(other)?,
        }
        self.carry_out(now, world);
        Ok(())
    }

    fn schedule(&mut self, now: Time) -> PassStats {
        self.control.set_clock(now);
        self.control.schedule().0
    }

    /// What the pass decided, then — as the scheduling loop does — when to wake next (asked once
    /// the quorum's answers are in).
    fn dispatch(&mut self, now: Time, world: &mut dyn World) -> Result<(), ControlError> {
        self.carry_out(now, world);
        if let Some(t) = self.control.next_wakeup()
            && self.last_wake != Some(t)
        {
            self.last_wake = Some(t);
            let d = Decision::WakeAt(t);
            self.log.push(format!("{} {d}", now.0));
            d.dispatch(world, &self.control.ctl.engine, now);
        }
        Ok(())
    }
}
