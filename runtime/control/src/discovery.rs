//! What agents discover fills what the inventory left unset (book: "Node Lifecycle" — the agent
//! reports its capabilities at registration): GPUs, cores and memory an inventory entry does not
//! name are taken from the node's agent, recorded at the quorum by the leader (so every member
//! schedules the node alike, a new leader too) and applied here. Capabilities the inventory sets
//! are never overridden: a disagreement there is a mismatch ([`Control::capability_mismatch`]).

use super::*;
use lattice_engine::{DiscoveredCapabilities, NodeCapabilities, NodeId, UnsetCapabilities};

impl Control {
    /// Nodes whose inventory entries leave capabilities to discover (at start and as nodes join).
    pub(crate) fn leave_to_discovery(&mut self, id: NodeId, unset: UnsetCapabilities) {
        if let (true, Some(n)) = (unset.any(), self.ctl.engine.node(id)) {
            self.fleet.unset.insert(id.0, (unset, n.spec.capabilities.clone()));
        }
    }

    /// What `node`'s agent discovered for the capabilities its inventory leaves unset, when that
    /// would change how the node is scheduled or differs from what is recorded (`None`: nothing is
    /// unset, the agent reported nothing, or it is recorded already).
    pub fn discovery_fill(&self, node: &str) -> Option<DiscoveredCapabilities> {
        let id = self.node_index(node)?;
        let (unset, inventory) = self.fleet.unset.get(&id.0)?;
        let found = self.fleet.agent_info.get(&id.0)?.1.as_ref()?;
        let count = |k: &str| found[k].as_u64().map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        let gib = found["memory_gib"]
            .as_f64()
            .filter(|g| g.is_finite() && *g > 0.0)
            .unwrap_or(0.0);
        let fill = unset.fill(
            count("gpu_count"),
            found["gpu_model"].as_str(),
            count("cpu_cores"),
            (gib * 1_073_741_824.0) as u64,
        );
        let changes = fill.filled(inventory) != *inventory;
        let recorded = self.fleet.discovered.get(&id.0);
        (recorded != Some(&fill) && (recorded.is_some() || changes)).then_some(fill)
    }

    /// The quorum's record of what `node`'s agent discovered: the node is scheduled with its
    /// inventory's capabilities so filled from now on — a node that is held, once it is released
    /// (what runs there was counted by what it had). Returns whether the scheduler has them now.
    pub fn apply_discovered(&mut self, node: &str, fill: DiscoveredCapabilities) -> Result<bool, FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("node", format!("no node {node} in the inventory")))?;
        let now = self.now();
        if self.fleet.discovered.get(&id.0) != Some(&fill) {
            // The trace capture records it, so a replay schedules the node alike.
            let ts = now.0 as f64 / 1000.0;
            self.capture_line(serde_json::json!({"ts": ts, "type": "node_capabilities", "node": node,
                                                 "capabilities": &fill}));
        }
        self.fleet.discovered.insert(id.0, fill);
        let caps = self.discovered_capabilities(node).expect("recorded");
        match self.ctl.set_capabilities(now, id, caps.clone()) {
            Ok(now_applied) => {
                tracing::info!(
                    "node {node}: scheduled with what its agent discovered{}: {} GPU(s) {}, {} cores, {} GB",
                    if now_applied { "" } else { " once it is free" },
                    caps.gpu_count,
                    caps.gpu_type.as_deref().unwrap_or("-"),
                    caps.cpu_cores,
                    caps.memory_gb
                );
                Ok(now_applied)
            }
            // Refused for good (a second node class under the pyss-compatible policy).
            Err(e) => Err(bad(
                "node",
                format!("node {node}: what its agent discovered cannot be applied: {e}"),
            )),
        }
    }

    /// The capabilities the quorum's records give `node` (`None`: none recorded).
    pub fn discovered_capabilities(&self, node: &str) -> Option<NodeCapabilities> {
        let id = self.node_index(node)?;
        let fill = self.fleet.discovered.get(&id.0)?;
        let inventory = self
            .fleet
            .unset
            .get(&id.0)
            .map(|u| u.1.clone())
            .or_else(|| self.ctl.engine.node(id).map(|n| n.spec.capabilities.clone()))?;
        Some(fill.filled(&inventory))
    }
}
