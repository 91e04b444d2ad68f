//! Nodes: operators' standing orders, conformance drift and its remediation deadline, the heartbeat
//! grace, and node events with the runs they lose.

use super::*;

impl Controller {
    /// The standing order for `node` (the default when there is none).
    pub fn order(&self, node: NodeId) -> NodeOrder {
        self.orders.get(&node).copied().unwrap_or_default()
    }

    /// Holds the nodes to their standing orders: a disabled node that is not out goes Down (as a
    /// hardware failure would: its work requeued or failed), a drained node that is up drains.
    pub(super) fn enforce_orders(&mut self, now: Time, world: &mut dyn World) -> Result<(), ControlError> {
        use crate::node::NodeState as S;
        if self.orders.is_empty() {
            return Ok(());
        }
        let orders: Vec<(NodeId, NodeOrder)> = self.orders.iter().map(|(n, o)| (*n, *o)).collect();
        for (node, order) in orders {
            let Some(state) = self.engine.node(node).map(|x| x.state) else {
                continue;
            };
            if order.disabled && !matches!(state, S::Down | S::Failed) {
                self.node_event(now, node, NodeEvent::HardwareFailure, world)?;
            } else if order.drained && matches!(state, S::Ready | S::Degraded) {
                self.node_event(now, node, NodeEvent::Drain, world)?;
            }
        }
        Ok(())
    }

    /// Is the node drifted from its conformance baseline (and drained for it)?
    pub fn is_drifted(&self, node: NodeId) -> bool {
        self.drifted.contains_key(&node)
    }

    /// When a drifted node's remediation time runs out (`None`: not drifted, or already out).
    pub fn drift_deadline(&self, node: NodeId) -> Option<Time> {
        if self.drift_expired.contains(&node) {
            return None;
        }
        let since = *self.drifted.get(&node)?;
        let limit = if self.engine.is_sensitive_node(node) {
            self.drift_timeout.sensitive
        } else {
            self.drift_timeout.standard
        };
        Some(since + limit)
    }

    /// Drifted nodes whose remediation time ran out go Down (their work is stopped and requeued or
    /// failed, as for a lost node); they stay out until an operator brings them back. Whether any did.
    pub(super) fn expire_drifts(&mut self, now: Time, world: &mut dyn World) -> Result<bool, ControlError> {
        let due: Vec<NodeId> = self
            .drifted
            .keys()
            .copied()
            .filter(|n| self.drift_deadline(*n).is_some_and(|t| t <= now))
            .collect();
        let any = !due.is_empty();
        for n in due {
            self.drift_expired.insert(n);
            self.stats.drift_timeouts += 1;
            self.take_down(now, n, world)?;
        }
        Ok(any)
    }

    /// Takes a node out of service (Down) as a hardware failure would, unless it is out already:
    /// its work is stopped and requeued (a sensitive claim failed).
    pub(super) fn take_down(&mut self, now: Time, node: NodeId, world: &mut dyn World) -> Result<(), ControlError> {
        let down = self
            .engine
            .node(node)
            .is_some_and(|x| matches!(x.state, crate::node::NodeState::Down | crate::node::NodeState::Failed));
        if !down {
            self.node_event(now, node, NodeEvent::HardwareFailure, world)?;
        }
        Ok(())
    }

    /// The book's drift response: running work goes on; the node takes no new work (it drains) and
    /// the infrastructure is told to remediate it; a sensitive node's drift is audited. When the
    /// node conforms again a standard node is back in the pool at once; a sensitive one stays
    /// drained until an operator undrains it (re-verified conformance and an administrator's
    /// approval).
    pub(super) fn conformance(
        &mut self,
        now: Time,
        node: NodeId,
        drifted: bool,
        world: &mut dyn World,
    ) -> Result<(), ControlError> {
        if self.engine.node(node).is_none() {
            return Err(EngineError::UnknownNode(node).into());
        }
        if drifted == self.drifted.contains_key(&node) {
            return Ok(());
        }
        let sensitive = self.engine.is_sensitive_node(node);
        let state = self.engine.node(node).map(|n| n.state);
        use crate::node::NodeState as S;
        if drifted {
            self.drifted.insert(node, now);
            self.stats.drifts += 1;
            if matches!(state, Some(S::Ready | S::Degraded)) {
                self.engine.handle_node_event(now, node, NodeEvent::Drain)?;
            }
        } else {
            self.drifted.remove(&node);
            self.drift_expired.remove(&node);
            // (A node whose wipe is under way returns only on the wipe's outcome.)
            if !sensitive && matches!(state, Some(S::Draining | S::Drained)) && !self.under_wipe(node) {
                self.engine.handle_node_event(now, node, NodeEvent::Undrain)?;
            }
        }
        self.emit(
            world,
            now,
            Decision::Drift {
                node,
                drifted,
                sensitive,
            },
        );
        Ok(())
    }

    /// The grace a node that stops heartbeating gets before it is Down and its allocation is
    /// requeued, by what it runs now: sensitive claims the longest, borrowed nodes the shortest.
    pub fn node_grace(&self, node: NodeId) -> Duration {
        match self.engine.node(node).and_then(|n| n.owner).map(|o| o.alloc) {
            Some(a) if self.engine.is_sensitive(a) => self.grace.sensitive,
            Some(a) if self.engine.borrowed_nodes(a) > 0 => self.grace.borrowed,
            _ => self.grace.default,
        }
    }

    /// Keeps `node`'s boot deadline: set when it is Booting (from the first time it is seen so),
    /// dropped otherwise.
    pub(super) fn track_boot(&mut self, now: Time, node: NodeId) {
        if self.node_boot.is_empty() {
            return;
        }
        let Some(n) = self.engine.node(node) else { return };
        match (
            n.state == crate::NodeState::Booting,
            self.node_boot.of(&n.spec.capabilities),
        ) {
            (true, Some(t)) => {
                self.node_boot_due.entry(node).or_insert(now + t);
            }
            _ => {
                self.node_boot_due.remove(&node);
            }
        }
    }

    /// Nodes still Booting at their deadline fail (book: "Booting → Failed: boot timeout"); whether
    /// any did.
    pub(super) fn expire_node_boots(&mut self, now: Time, world: &mut dyn World) -> Result<bool, ControlError> {
        let due: Vec<NodeId> = self
            .node_boot_due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(n, _)| *n)
            .collect();
        let mut failed = false;
        for node in due {
            self.node_boot_due.remove(&node);
            if self
                .engine
                .node(node)
                .is_some_and(|n| n.state == crate::NodeState::Booting)
            {
                self.node_event(now, node, NodeEvent::BootFail, world)?;
                self.stats.boot_timeouts += 1;
                failed = true;
            }
        }
        Ok(failed)
    }

    pub(super) fn node_event(
        &mut self,
        now: Time,
        node: NodeId,
        event: NodeEvent,
        world: &mut dyn World,
    ) -> Result<(), ControlError> {
        // A node whose wipe is under way returns to the pool only on the wipe's outcome: an
        // operator's undrain (or a lifted drain order) meanwhile changes nothing — it would run
        // work on a node being wiped.
        if event == NodeEvent::Undrain && self.under_wipe(node) {
            return Ok(());
        }
        let owner = self.engine.node(node).and_then(|n| n.owner).map(|o| o.alloc);
        let before = owner.and_then(|a| {
            let running = self.engine.allocation(a).filter(|x| x.state == AllocState::Running)?;
            let r = self.runs.get(a.index()).copied().unwrap_or_default();
            // Work done since the last completed checkpoint is what a lost run loses.
            let unsaved = r.progress(now).0.saturating_sub(r.saved.0);
            Some((a, Duration(unsaved), running.nodes.clone()))
        });
        let grace = self.node_grace(node);
        let affected = self.engine.handle_node_event(now, node, event)?;
        self.track_boot(now, node);
        if event == NodeEvent::HeartbeatMiss {
            self.emit(world, now, Decision::Watch { node, grace });
        }
        for id in affected {
            let (nodes, lost) = match &before {
                Some((a, unsaved, nodes)) if *a == id => (nodes.clone(), nodes.len() as f64 * unsaved.as_secs_f64()),
                _ => (Vec::new(), 0.0),
            };
            self.run_lost(now, id, node, nodes, lost, world);
        }
        Ok(())
    }

    /// A run the engine took from its nodes because `node` went out (`lost_s` node-seconds of work
    /// lost): stopped and its `nodes` released; a sensitive claim is never requeued (book: "Down →
    /// requeue: operator intervention") — it failed, and its nodes are released and wiped like any
    /// ended claim's.
    pub(super) fn run_lost(
        &mut self,
        now: Time,
        id: AllocId,
        node: NodeId,
        nodes: Vec<NodeId>,
        lost_s: f64,
        world: &mut dyn World,
    ) {
        self.emit(
            world,
            now,
            Decision::Stop {
                alloc: id,
                why: StopReason::NodeLost(node),
            },
        );
        self.emit(world, now, Decision::Release { alloc: id, nodes });
        self.stats.lost_node_s += lost_s;
        self.lost_run(id);
        if self.engine.allocation(id).is_some_and(|a| a.state.is_terminal()) {
            self.after_end(now, id, world);
        }
    }
}
