//! The nodes' image caches as the control plane sees them (book: "Node-Local Image Cache", cache
//! warming; `lattice cache warm|list|evict`): operators' orders to pull (warm, optionally sticky) or
//! evict an image on chosen nodes, handed to each node's agent once with its next poll, the outcomes
//! they report, and each node's cache contents as its agent last reported them. Leader state, like
//! the agents' other reports.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v1/cache/warm` and `/v1/cache/evict`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheRequest {
    /// A uenv, `name/version:tag`.
    pub image: String,
    /// These nodes (default: every node, or the group's).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The nodes of this dragonfly group.
    #[serde(default)]
    pub group: Option<u32>,
    /// Warm: never evict it afterwards (an administrator's base image).
    #[serde(default)]
    pub sticky: bool,
}

/// An order for one node's agent, its outcome, and one cached image as the agent reports it (wire
/// types, declared once with the agent: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{CacheOrder, CacheOutcome, CachedImage};

/// A node's cache as clients see it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NodeCache {
    pub images: Vec<CachedImage>,
    /// Orders not yet handed to its agent.
    pub pending: Vec<CacheOrder>,
    /// The newest outcomes (at most [`KEEP_OUTCOMES`]).
    pub outcomes: Vec<CacheOutcome>,
}

pub const KEEP_OUTCOMES: usize = 32;

/// Every node's cache, by node name.
#[derive(Clone, Debug, Default)]
pub struct Caches {
    nodes: BTreeMap<String, NodeCache>,
}

impl Caches {
    /// Queues `order` for each of `nodes`.
    pub fn order(&mut self, nodes: &[String], order: CacheOrder) {
        for n in nodes {
            let c = self.nodes.entry(n.clone()).or_default();
            c.pending.retain(|o| o.image != order.image);
            c.pending.push(order.clone());
        }
    }

    /// `node`'s agent polls: the orders to carry out now (handed once).
    pub fn take(&mut self, node: &str) -> Vec<CacheOrder> {
        self.nodes
            .get_mut(node)
            .map(|c| std::mem::take(&mut c.pending))
            .unwrap_or_default()
    }

    /// `node`'s agent reports outcomes and, when it changed, its cache's contents.
    pub fn reported(&mut self, node: &str, outcomes: &[CacheOutcome], images: Option<&[CachedImage]>) {
        if outcomes.is_empty() && images.is_none() {
            return;
        }
        let c = self.nodes.entry(node.to_string()).or_default();
        c.outcomes.extend(outcomes.iter().cloned());
        let over = c.outcomes.len().saturating_sub(KEEP_OUTCOMES);
        c.outcomes.drain(..over);
        if let Some(i) = images {
            c.images = i.to_vec();
        }
    }

    pub fn view(&self, node: Option<&str>) -> BTreeMap<String, NodeCache> {
        self.nodes
            .iter()
            .filter(|(n, _)| node.is_none_or(|x| x == n.as_str()))
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_handed_once_and_outcomes_kept() {
        let mut c = Caches::default();
        let warm = CacheOrder {
            op: "warm".into(),
            image: "a/1:v1".into(),
            sticky: true,
        };
        c.order(&["n0".into(), "n1".into()], warm.clone());
        // The same image ordered again replaces the order not yet handed out.
        c.order(&["n0".into()], warm.clone());
        assert_eq!(c.view(Some("n0"))["n0"].pending.len(), 1);
        assert_eq!(c.take("n0"), vec![warm.clone()]);
        assert!(c.take("n0").is_empty());
        let done = CacheOutcome {
            op: "warm".into(),
            image: "a/1:v1".into(),
            ok: true,
            detail: String::new(),
        };
        let img = CachedImage {
            file: "a_1_v1.squashfs".into(),
            size: 4096,
            last_used_ms: 9,
            sticky: true,
        };
        c.reported("n0", std::slice::from_ref(&done), Some(std::slice::from_ref(&img)));
        for _ in 0..40 {
            c.reported("n0", std::slice::from_ref(&done), None);
        }
        let v = c.view(None);
        assert_eq!(v["n0"].images, vec![img]);
        assert_eq!(v["n0"].outcomes.len(), KEEP_OUTCOMES);
        assert_eq!(v["n1"].pending, vec![warm]);
    }
}
