//! Network domains (VNIs, CXI services) and VAST prefetch around the engine's staging.

use super::*;
use lattice_engine::{AllocId, AllocState, Input};

impl Control {
    /// A refusal as its owner reads it (the allocation's `last_rejection`).
    pub(super) fn refusal_message(&self, why: &lattice_engine::Refusal) -> String {
        match why {
            lattice_engine::Refusal::VniPoolExhausted { domain, used, total } => {
                let d = crate::network::domain_name(domain, |a| self.name_of(a));
                format!(
                    "vni_pool_exhausted: cannot create network domain {d} — VNI pool exhausted ({used}/{total} in use)"
                )
            }
            lattice_engine::Refusal::NotDurable { awaiting } => {
                use lattice_engine::Durable;
                let own = awaiting.iter().any(|r| matches!(r, Durable::Submission(_)));
                let ends: Vec<String> = awaiting
                    .iter()
                    .filter(|r| !matches!(r, Durable::Submission(_)))
                    .map(|&r| self.record_name(r))
                    .collect();
                if ends.is_empty() || own {
                    "waiting until it is on a majority of the members' disks".to_string()
                } else {
                    format!(
                        "waiting until the end of {} is on a majority of the members' disks",
                        ends.join(", ")
                    )
                }
            }
            lattice_engine::Refusal::Claim(why) => self.claim_refusal_message(why),
        }
    }

    /// A refused claim's message (book: an `OwnershipConflict` "identifying which nodes are already
    /// claimed and by which user"): the nodes other claims hold, by claim and user, then those
    /// other allocations hold and those out of service.
    fn claim_refusal_message(&self, why: &lattice_engine::ClaimRefusal) -> String {
        use lattice_engine::ClaimRefusal;
        let ClaimRefusal::OwnershipConflict {
            needed,
            free,
            held,
            out,
        } = why
        else {
            return "claim refused: it would exceed a hard quota (its tenant's or project's max_nodes or \
                    max_concurrent_allocations, or the site's sensitive_pool_size) or a budget"
                .to_string();
        };
        let node = |n: lattice_engine::NodeId| self.registry.node_names[n.index()].clone();
        // Holders in the order their first node comes, each with its nodes.
        let mut holders: Vec<(AllocId, Vec<String>)> = Vec::new();
        for &(n, a) in held {
            match holders.iter_mut().find(|h| h.0 == a) {
                Some(h) => h.1.push(node(n)),
                None => holders.push((a, vec![node(n)])),
            }
        }
        let mut parts = Vec::new();
        for (a, nodes) in &holders {
            let user = self
                .registry
                .meta
                .get(a.index())
                .and_then(|m| m.user.clone())
                .unwrap_or_else(|| "unknown".into());
            let verb = if self.ctl.engine.is_sensitive(*a) {
                "claimed"
            } else {
                "held"
            };
            parts.push(format!(
                "{} {verb} by user {user} ({})",
                nodes.join(","),
                self.name_of(*a)
            ));
        }
        if !out.is_empty() {
            let nodes: Vec<String> = out.iter().map(|&n| node(n)).collect();
            parts.push(format!(
                "{} out of service (down, draining, being wiped or booting)",
                nodes.join(",")
            ));
        }
        let free = if *free >= *needed {
            format!("{free} are free but not {needed} of one conformance fingerprint")
        } else {
            format!("{free} free")
        };
        let mut msg = format!("OwnershipConflict: the claim needs {needed} nodes now and its pool has {free}");
        if !parts.is_empty() {
            msg.push_str("; ");
            msg.push_str(&parts.join("; "));
        }
        msg.push_str(" — claims do not queue: choose fewer nodes or claim again once they are released");
        msg
    }

    /// The network domains (the controller's) as the API shows them, and the pool's (total, in use).
    pub fn network_views(&self) -> (Vec<crate::network::DomainView>, (usize, usize)) {
        let Some(n) = self.ctl.network.as_ref() else {
            return (Vec::new(), (0, 0));
        };
        let views = n
            .domains()
            .map(|(key, d)| crate::network::DomainView {
                tenant: self.tenant_name(key.0),
                name: crate::network::domain_name(&key.1, |a| self.name_of(a)),
                vni: d.vni,
                allocations: d.members.iter().map(|a| self.name_of(*a)).collect(),
                draining: d.empty_since.is_some(),
                grace_s: n.grace_of(key).0 as f64 / 1000.0,
            })
            .collect();
        (views, n.pool())
    }

    /// The allocation no longer runs (the controller took it out of its network domain when it
    /// released its nodes): the CXI service to revoke, if one was created.
    pub fn left_network(&mut self, name: &str) -> Option<String> {
        let taken_over = self.services.cxi_taken_over.remove(name).map(|(s, _)| s);
        self.services
            .cxi
            .remove(name)
            .map(|(service, _)| service)
            .or(taken_over)
    }

    /// Recovery: the quorum records `service` as the running `name`'s CXI service. This control
    /// plane keeps it (and revokes it at the end) rather than creating another.
    pub fn cxi_recorded(&mut self, name: &str, service: &str) {
        self.services
            .cxi_taken_over
            .insert(name.to_string(), (service.to_string(), false));
    }

    /// CXI services taken over whose auth key is to be read from the fabric manager: (name,
    /// service), each returned once.
    pub fn cxi_to_read(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (n, (s, asked)) in self.services.cxi_taken_over.iter_mut().filter(|(_, (_, a))| !*a) {
            *asked = true;
            out.push((n.clone(), s.clone()));
        }
        out
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
        self.services.prefetched.retain(|id, _| staging.contains(id));
        for id in staging {
            let entry = self.services.prefetched.entry(id).or_insert((false, 0));
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
        let e = self.services.prefetched.entry(id).or_insert((true, 0));
        e.1 += 1;
        // Asked again next cycle, unless the retries are spent (the engine raised its alert).
        e.0 = e.1 > lattice_engine::STAGING_RETRIES;
        !e.0
    }

    /// The fabric manager created `name`'s CXI service (its launch may go out now).
    pub fn cxi_ready(&mut self, name: &str, service: String, auth_key: String) {
        self.services.cxi_taken_over.remove(name);
        self.services.cxi.insert(name.to_string(), (service, auth_key));
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
