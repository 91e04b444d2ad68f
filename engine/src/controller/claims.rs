//! Sensitive claims after their commit: hardened boots, releases, secure wipes with their timeouts and
//! retries, and quarantine.

use super::*;

impl Controller {
    /// The claim whose failed wipe quarantined `node` (also while it is wiped again).
    pub fn quarantined_by(&self, node: NodeId) -> Option<AllocId> {
        self.quarantined.get(&node).map(|q| q.0)
    }

    /// Nodes quarantined after a failed wipe (and not being wiped again), in node order.
    pub fn quarantined(&self) -> Vec<NodeId> {
        self.quarantined.iter().filter(|(_, q)| !q.1).map(|(n, _)| *n).collect()
    }

    /// Whether the node runs the hardened image (as far as the controller knows).
    pub fn is_hardened(&self, node: NodeId) -> bool {
        self.hardened.contains(&node)
    }

    /// Whether the claim's nodes are still booting the hardened image (committed, not launched).
    pub fn is_booting(&self, id: AllocId) -> bool {
        self.booting.contains_key(&id)
    }

    /// Is any outcome of claim `id`'s wipe still awaited?
    pub fn is_wiping(&self, id: AllocId) -> bool {
        self.wiping.contains_key(&id)
    }

    /// Is the node being wiped (its outcome awaited)? It returns to the pool only on that outcome.
    pub fn under_wipe(&self, node: NodeId) -> bool {
        self.wiping.values().any(|w| w.0.contains(&node))
    }

    /// Is the outcome of `node`'s wipe for claim `id` still awaited (not reported, not timed out)?
    pub fn wipe_awaited(&self, id: AllocId, node: NodeId) -> bool {
        self.wiping.get(&id).is_some_and(|w| w.0.contains(&node))
    }

    /// Wipes the nodes a claim released (or one an operator retries): their outcomes are awaited
    /// until the wipe timeout, if any.
    pub(super) fn wipe(&mut self, now: Time, id: AllocId, nodes: Vec<NodeId>, world: &mut dyn World) {
        let deadline = self.wipe_timeout.map(|t| now + t);
        let w = self.wiping.entry(id).or_insert_with(|| (Default::default(), deadline));
        w.0.extend(nodes.iter().copied());
        w.1 = match (w.1, deadline) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.emit(world, now, Decision::Wipe { alloc: id, nodes });
    }

    /// `nodes` of claim `id` in the order the claim holds them (the audit log's order).
    pub(super) fn in_claim_order(&self, id: AllocId, nodes: &std::collections::BTreeSet<NodeId>) -> Vec<NodeId> {
        let held = self.engine.allocation(id).map_or(&[][..], |a| &a.nodes[..]);
        held.iter().copied().filter(|n| nodes.contains(n)).collect()
    }

    /// Wipes whose outcome did not come within the wipe timeout: their nodes are quarantined, as
    /// for a failed wipe (book: "Wipe Failure Handling"). Whether any were.
    pub(super) fn expire_wipes(&mut self, now: Time, world: &mut dyn World) -> bool {
        let due: Vec<AllocId> = self
            .wiping
            .iter()
            .filter(|(_, w)| w.1.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            if let Some((nodes, _)) = self.wiping.remove(id) {
                self.stats.wipe_timeouts += nodes.len() as u64;
                let nodes = self.in_claim_order(*id, &nodes);
                self.wiped(now, *id, nodes, false, world);
            }
        }
        !due.is_empty()
    }

    /// A node of a booting claim reported: booted, it runs the hardened image (once every node
    /// has, the claim's boot is audited and it launches); failed, the node goes Down (Booting →
    /// Failed) and the claim fails — a sensitive claim is never requeued — its nodes released and
    /// wiped. A late report (the claim ended, or the boot already timed out) changes nothing.
    pub(super) fn booted(
        &mut self,
        now: Time,
        id: AllocId,
        node: NodeId,
        ok: bool,
        world: &mut dyn World,
    ) -> Result<(), ControlError> {
        let Some(b) = self.booting.get_mut(&id) else {
            return Ok(());
        };
        if !b.waiting.remove(&node) {
            return Ok(());
        }
        if !ok {
            return self.boot_failed(now, id, vec![node], world);
        }
        self.hardened.insert(node);
        self.stats.hardened_boots += 1;
        if !b.waiting.is_empty() {
            return Ok(());
        }
        let staging_remaining_s = b.staging_remaining_s;
        self.booting.remove(&id);
        let nodes = self.engine.allocation(id).map(|a| a.nodes.clone()).unwrap_or_default();
        self.emit(
            world,
            now,
            Decision::Audit {
                alloc: id,
                event: AuditEvent::Boot,
                nodes: nodes.clone(),
            },
        );
        self.launch(now, id, nodes, staging_remaining_s, world);
        Ok(())
    }

    /// Hardened boots that failed (or ran out of time): each node Down; the first ends the claim.
    pub(super) fn boot_failed(
        &mut self,
        now: Time,
        id: AllocId,
        nodes: Vec<NodeId>,
        world: &mut dyn World,
    ) -> Result<(), ControlError> {
        self.booting.remove(&id);
        for n in nodes {
            self.stats.boot_failures += 1;
            self.take_down(now, n, world)?;
        }
        Ok(())
    }

    /// Claims whose hardened boot ran out of time: the nodes still booting fail. Whether any did.
    pub(super) fn expire_boots(&mut self, now: Time, world: &mut dyn World) -> Result<bool, ControlError> {
        let due: Vec<AllocId> = self
            .booting
            .iter()
            .filter(|(_, b)| b.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            let nodes = self
                .booting
                .get(id)
                .map(|b| b.waiting.iter().copied().collect())
                .unwrap_or_default();
            self.boot_failed(now, *id, nodes, world)?;
        }
        Ok(!due.is_empty())
    }

    /// A wipe of `nodes` of claim `id` ended: they return to the pool, or are quarantined (Down);
    /// audited either way.
    pub(super) fn wiped(&mut self, now: Time, id: AllocId, nodes: Vec<NodeId>, ok: bool, world: &mut dyn World) {
        for n in &nodes {
            // A quarantined node wiped on an operator's retry is enabled (Down → Ready).
            match (ok, self.quarantined.contains_key(n)) {
                (true, true) => {
                    let _ = self.engine.handle_node_event(now, *n, NodeEvent::Enable);
                }
                (true, false) => {
                    let _ = self.engine.handle_node_event(now, *n, NodeEvent::Undrain);
                }
                // Quarantined: out as after a hardware failure — whatever runs there (nothing
                // should) is lost, stopped and released like any lost run.
                (false, _) => {
                    let _ = self.node_event(now, *n, NodeEvent::HardwareFailure, world);
                }
            }
            if ok {
                self.quarantined.remove(n);
            } else {
                self.quarantined.insert(*n, (id, false));
            }
        }
        if ok {
            self.stats.wipes += 1;
        } else {
            self.stats.quarantined_nodes += nodes.len() as u64;
        }
        let event = if ok { AuditEvent::Wipe } else { AuditEvent::Quarantine };
        self.emit(
            world,
            now,
            Decision::Audit {
                alloc: id,
                event,
                nodes,
            },
        );
    }

    /// A sensitive claim's end: the release is audited and its nodes leave the pool for a wipe.
    pub(super) fn after_end(&mut self, now: Time, id: AllocId, world: &mut dyn World) {
        let Some(a) = self.engine.allocation(id) else { return };
        if !a.spec.sensitive_claim {
            return;
        }
        // Ended while its nodes booted (cancelled, or a boot failed): later reports are stale.
        self.booting.remove(&id);
        let nodes = a.nodes.clone();
        self.emit(
            world,
            now,
            Decision::Audit {
                alloc: id,
                event: AuditEvent::Release,
                nodes: nodes.clone(),
            },
        );
        for n in &nodes {
            let _ = self.engine.handle_node_event(now, *n, NodeEvent::Drain);
        }
        self.wipe(now, id, nodes, world);
    }
}
