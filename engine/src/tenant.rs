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
}

impl Registry {
    /// Returns the id of `name`, registering it if new. Linear search: registries hold tens of names.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return i as u32;
        }
        self.names.push(name.to_string());
        (self.names.len() - 1) as u32
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
