//! Tenants and vClusters: the registries that give the dense ids their names.

use crate::ids::{TenantId, VClusterId};
use serde::{Deserialize, Serialize};

/// An organisation with a contract (quotas and fair-share targets arrive with the multi-tenant issue).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
}

/// A scheduling domain: its queue is scheduled with its own policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VCluster {
    pub id: VClusterId,
    pub name: String,
}

/// Name ↔ id registry with stable (insertion-order) ids.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    names: Vec<String>,
    index: std::collections::BTreeMap<String, u32>,
}

impl Registry {
    /// Returns the id of `name`, registering it if new.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), id);
        id
    }

    /// The id of `name`, if registered.
    pub fn lookup(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }
    pub fn get(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(String::as_str)
    }
    pub fn names(&self) -> &[String] {
        &self.names
    }
    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}
