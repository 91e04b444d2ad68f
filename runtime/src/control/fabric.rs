//! Network domains (VNIs, CXI services) and VAST prefetch around the engine's staging.

use super::*;
use lattice_engine::{AllocId, AllocState, Input};

impl Control {
    /// The network domain an allocation placed on `nodes` nodes belongs to, if any.
    pub(super) fn domain_of(&self, id: AllocId, nodes: u32) -> Option<String> {
        let a = self.ctl.engine.allocation(id)?;
        let m = self.meta.get(id.index())?;
        crate::network::domain_of(&m.name, m.network_domain.as_deref(), nodes, a.spec.sensitive_claim)
    }

    /// Joins the started allocation's network domain (if it has one): its VNI.
    pub(super) fn join_network(&mut self, id: AllocId) -> Option<u32> {
        let a = self.ctl.engine.allocation(id)?;
        let d = self.domain_of(id, a.nodes.len() as u32)?;
        let tenant = self.tenant_name(a.spec.tenant);
        let name = self.name_of(id);
        match self.network.join(&tenant, &d, &name) {
            Ok((vni, _)) => Some(vni),
            Err(e) => {
                tracing::warn!("{name}: network domain {d}: {e}");
                None
            }
        }
    }

    /// The allocation no longer runs: it leaves its network domain (which drains when empty); the
    /// CXI service to revoke, if one was created.
    pub fn left_network(&mut self, name: &str) -> Option<String> {
        let now = self.now().0;
        self.network.leave(name, now);
        self.cxi.remove(name).map(|(service, _)| service)
    }

    /// Releases the domains whose grace period ran out: (tenant, domain, VNI).
    pub fn expire_network(&mut self) -> Vec<(String, String, u32)> {
        let now = self.now().0;
        self.network.expire(now)
    }

    /// Staging allocations whose prefetch is still to be asked of VAST: (name, sources to bring to the
    /// hot tier). Each is returned once (again after [`Control::prefetch_failed`]).
    pub fn to_prefetch(&mut self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        let staging: Vec<AllocId> = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.state == AllocState::Staging)
            .map(|a| a.id)
            .collect();
        self.prefetched.retain(|id, _| staging.contains(id));
        for id in staging {
            let entry = self.prefetched.entry(id).or_insert((false, 0));
            if entry.0 {
                continue;
            }
            entry.0 = true;
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            let sources: Vec<String> = a
                .spec
                .data
                .iter()
                .filter(|m| m.tier_hint == lattice_engine::Tier::Hot && m.tier != lattice_engine::Tier::Hot)
                .map(|m| m.source.clone())
                .collect();
            if !sources.is_empty() {
                out.push((self.name_of(id), sources));
            }
        }
        out
    }

    /// VAST refused or failed `name`'s prefetch: a staging failure (its progress restarts). It is
    /// asked again up to the engine's retry limit; returns whether it will be.
    pub fn prefetch_failed(&mut self, name: &str) -> bool {
        let Some(id) = self.id_of(name) else { return false };
        let _ = self.input(Input::StagingFailed(id));
        let e = self.prefetched.entry(id).or_insert((true, 0));
        e.1 += 1;
        // Asked again next cycle, unless the retries are spent (the engine raised its alert).
        e.0 = e.1 > lattice_engine::STAGING_RETRIES;
        !e.0
    }

    /// The fabric manager created `name`'s CXI service (its launch may go out now).
    pub fn cxi_ready(&mut self, name: &str, service: String, auth_key: String) {
        self.cxi.insert(name.to_string(), (service, auth_key));
    }

    /// The fabric manager could not set `name` up: a prologue failure (retried on other nodes first,
    /// up to the engine's limit); its release is in the actions.
    pub fn cxi_failed(&mut self, name: &str) {
        let Ok((id, a)) = self.allocation_named(name) else {
            return;
        };
        let Some(&node) = a.nodes.first() else { return };
        if let Err(e) = self.input(Input::PrologueFailed(id, node)) {
            tracing::warn!("{name}: prologue failure not applied: {e}");
        }
    }
}
