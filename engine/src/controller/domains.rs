//! Network domains around proposals and launches (the bookkeeping is [`crate::network`]).

use super::*;

impl Controller {
    /// The network domain an allocation placed on `nodes` nodes belongs to (`None`: none, or
    /// domains are not modelled).
    pub(super) fn domain_key(&self, id: AllocId, nodes: usize) -> Option<crate::network::DomainKey> {
        self.network.as_ref()?;
        let a = self.engine.allocation(id)?;
        let name = crate::network::domain_of(id, a.spec.network_domain.as_deref(), nodes, a.spec.sensitive_claim)?;
        Some((a.spec.tenant, name))
    }

    /// The started allocation joins its network domain (the one its proposal reserved).
    /// `recorded`: the VNI the quorum holds for an adopted run (its domain keeps it when the pool
    /// has it free).
    pub(super) fn join_domain(&mut self, id: AllocId, recorded: Option<u32>) {
        let nodes = self.engine.allocation(id).map_or(0, |a| a.nodes.len());
        let key = self.domain_key(id, nodes);
        if let Some(n) = self.network.as_mut() {
            n.join_with(id, key, recorded);
        }
    }

    /// The VNI a proposal at the quorum carries (its domain's, existing or to be created by it):
    /// the start is recorded with it, so a new leader keeps a running allocation's VNI.
    pub fn proposal_domain(&self, id: AllocId) -> Option<(&crate::network::DomainName, u32)> {
        self.network.as_ref()?.reserved(id).map(|((_, name), vni)| (name, vni))
    }

    /// The VNI of the allocation's network domain, once it joined one.
    pub fn vni_of(&self, id: AllocId) -> Option<u32> {
        self.network.as_ref()?.vni_of(id)
    }

    /// A proposal's network domain: reserved (its VNI held while the quorum decides), or refused
    /// when it would need a VNI the pool has not.
    pub(super) fn reserve_domain(&mut self, id: AllocId, nodes: usize) -> Result<(), crate::world::Refusal> {
        let Some(key) = self.domain_key(id, nodes) else {
            return Ok(());
        };
        match self.network.as_mut() {
            Some(n) => n
                .reserve(id, key)
                .map(|_| ())
                .map_err(|e| crate::world::Refusal::VniPoolExhausted {
                    domain: e.domain,
                    used: e.used,
                    total: e.total,
                }),
            None => Ok(()),
        }
    }
}
