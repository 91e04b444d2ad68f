//! Sensitive nodes: hardened boots, secure wipes, their outcomes, retries, timeouts and quarantine.

use super::*;
use lattice_engine::{AllocId, AuditEvent, Input};

impl Control {
    /// The wipe of `alloc` is carried out (the actions before it — the release's audit entry — are
    /// done): its nodes' agents are told at their next poll.
    pub fn wipe_orders_out(&mut self, alloc: AllocId) {
        if let Some(w) = self.wipes.wiping.get_mut(&alloc) {
            let pending = std::mem::take(&mut w.pending);
            w.to_tell.extend(pending);
        }
    }

    /// OpenCHAMI's wipe of `node` for the released claim `name` ended (`reason`: why it failed).
    /// Returns whether that outcome was still awaited.
    pub fn node_wiped(&mut self, name: &str, node: &str, ok: bool, reason: Option<String>) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.wipe_outcome(id, nid, ok, reason)
    }

    /// One node of claim `name` booted the hardened image (`ok`) or failed to: the controller
    /// launches the claim once every node booted, or fails it (the node Down). Whether it was
    /// awaited.
    pub fn node_booted(&mut self, name: &str, node: &str, ok: bool) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.booted(id, nid, ok)
    }

    /// [`Control::node_booted`] by ids (a replay's fake world reports so).
    pub fn booted(&mut self, id: AllocId, node: lattice_engine::NodeId, ok: bool) -> bool {
        if !self.boot_awaited_id(id, node) {
            return false;
        }
        if !ok {
            tracing::warn!(
                "{}: {} failed to boot the hardened image; the node is out (Failed) and the claim fails",
                self.name_of(id),
                self.registry.node_names[node.index()]
            );
        }
        if let Err(e) = self.input(Input::Booted(id, node, ok)) {
            tracing::warn!("{}: boot result not applied: {e}", self.name_of(id));
        }
        if !ok {
            self.tally.boot_failures += 1;
        }
        true
    }

    /// Is `node`'s hardened boot for claim `name` still awaited (not reported, not timed out, the
    /// claim not ended)?
    pub fn boot_awaited(&self, name: &str, node: &str) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.boot_awaited_id(id, nid)
    }

    pub(super) fn boot_awaited_id(&self, id: AllocId, node: lattice_engine::NodeId) -> bool {
        self.ctl.is_booting(id)
            && self
                .ctl
                .engine
                .allocation(id)
                .is_some_and(|a| a.nodes.contains(&node) && !self.ctl.is_hardened(node))
    }

    /// Is `node`'s wipe for claim `name` still awaited?
    pub fn wipe_awaited(&self, name: &str, node: &str) -> bool {
        let (Some(id), Some(nid)) = (self.id_of(name), self.node_index(node)) else {
            return false;
        };
        self.ctl.wipe_awaited(id, nid)
    }

    /// One node's wipe outcome: the controller returns it to the pool or quarantines it (audited,
    /// with when the wipe started and why it failed).
    pub(super) fn wipe_outcome(
        &mut self,
        id: AllocId,
        nid: lattice_engine::NodeId,
        ok: bool,
        reason: Option<String>,
    ) -> bool {
        if !self.ctl.wipe_awaited(id, nid) {
            return false; // not this node's wipe, already reported, or timed out
        }
        let started_ms = self.wipes.wiping.get(&id).map_or(0, |w| w.started_ms);
        if !ok {
            self.tally.wipe_failures += 1;
        }
        let mut note = format!("{} started_ms={started_ms}", self.registry.node_names[nid.index()]);
        if let Some(r) = &reason {
            note.push_str(&format!(" reason={r}"));
        }
        self.wipes.wipe_notes.insert((id, nid.0), note);
        if let Err(e) = self.input(Input::NodeWiped(id, nid, ok)) {
            tracing::warn!(
                "{}: wipe result of {} not applied: {e}",
                self.name_of(id),
                self.registry.node_names[nid.index()]
            );
        }
        true
    }

    /// An operator retries a quarantined node's wipe (book: "Wipe Failure Handling": `lattice admin
    /// node wipe NODE --force`), audited with who asked; the claim whose wipe failed, or why not.
    pub fn retry_wipe(&mut self, node: &str, by: &str) -> Result<String, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let quarantined = self.ctl.quarantined().contains(&nid);
        if !quarantined {
            let state = self.node_state_of(node).unwrap_or_default();
            return Err(bad(
                "id",
                format!("node {node} is not quarantined after a failed wipe (it is {state}): nothing to retry"),
            ));
        }
        self.wipes
            .wipe_notes
            .insert((self.quarantine_claim(nid), nid.0), format!("{node} retried by {by}"));
        self.input(Input::RetryWipe(nid))
            .map_err(|e| bad("id", format!("node {node}: {e}")))?;
        Ok(self.name_of(self.quarantine_claim(nid)))
    }

    /// The claim whose wipe of `node` failed (the last audit of it names it).
    pub(super) fn quarantine_claim(&self, node: lattice_engine::NodeId) -> AllocId {
        self.ctl.quarantined_by(node).unwrap_or(AllocId(u64::MAX))
    }

    /// A simulated agent's wipe of `nodes` of claim `id` succeeded: the whole claim's at once, or
    /// node by node (an operator's retry of one).
    pub fn simulated_wiped(&mut self, id: AllocId, nodes: &[String]) {
        let whole = self
            .ctl
            .engine
            .allocation(id)
            .is_some_and(|a| a.nodes.len() == nodes.len());
        if whole {
            self.wiped(id, true);
        } else {
            let name = self.name_of(id);
            for n in nodes {
                self.node_wiped(&name, n, true, None);
            }
        }
    }

    /// An audit entry's note: for a wipe or quarantine, each node's wipe start and why it failed —
    /// a node whose outcome never came failed for the controller's wipe timeout. A wipe all of whose
    /// outcomes are in is forgotten here too.
    /// What a sensitive allocation runs, for its `start` entry: the entrypoint, its software
    /// (`uenv=NAME[@view]`, `tools_uenv=…`, `image=…`, `signed` when `sign_required`) and the data
    /// paths it mounts.
    fn start_note(&self, alloc: AllocId) -> String {
        let Some(m) = self.registry.meta.get(alloc.index()) else {
            return String::new();
        };
        let mut parts = Vec::new();
        if let Some(e) = &m.environment {
            if let Some(u) = &e.uenv {
                parts.push(match &e.view {
                    Some(v) => format!("uenv={u}@{v}"),
                    None => format!("uenv={u}"),
                });
            }
            if let Some(t) = &e.tools_uenv {
                parts.push(format!("tools_uenv={t}"));
            }
            if let Some(i) = &e.image {
                parts.push(format!("image={i}"));
            }
            if e.sign_required {
                parts.push("signed".into());
            }
        }
        if let Some(d) = &m.data {
            let sources: Vec<&str> = d.mounts.iter().map(|x| x.source.as_str()).collect();
            if !sources.is_empty() {
                parts.push(format!("data={}", sources.join(",")));
            }
        }
        if let Some(e) = m.entrypoint.as_deref().filter(|e| !e.is_empty()) {
            let short: String = e.chars().take(200).collect();
            parts.push(format!("entrypoint={short:?}"));
        }
        parts.join(" ")
    }

    /// Why `name`'s prologue failed on `node` (the agent's last line of stderr), for the audit
    /// entry of a sensitive allocation's prologue failure.
    pub fn note_prologue_failure(&mut self, name: &str, node: &str, why: &str) {
        if let (Some(id), Some(n)) = (self.id_of(name), self.node_index(node)) {
            self.wipes.wipe_notes.insert((id, n.0), why.to_string());
        }
    }

    pub(super) fn audit_note(&mut self, alloc: AllocId, event: AuditEvent, nodes: &[lattice_engine::NodeId]) -> String {
        if event == AuditEvent::Start {
            return self.start_note(alloc);
        }
        let started_ms = self.wipes.wiping.get(&alloc).map_or(0, |w| w.started_ms);
        let timeout_s = self.ctl.wipe_timeout.map_or(0, |t| t.0 / 1000);
        let note = nodes
            .iter()
            .filter_map(|n| match self.wipes.wipe_notes.remove(&(alloc, n.0)) {
                Some(note) if event == AuditEvent::PrologueFailure => {
                    Some(format!("{} reason={note}", self.registry.node_names[n.index()]))
                }
                Some(note) => Some(note),
                None if event == AuditEvent::Quarantine => {
                    self.tally.wipe_failures += 1;
                    Some(format!(
                        "{} started_ms={started_ms} reason=no wipe confirmation within {timeout_s} s",
                        self.registry.node_names[n.index()]
                    ))
                }
                None => None,
            })
            .collect::<Vec<_>>()
            .join("; ");
        if matches!(event, AuditEvent::Wipe | AuditEvent::Quarantine) && !self.ctl.is_wiping(alloc) {
            self.wipes.wiping.remove(&alloc);
        }
        note
    }
}
