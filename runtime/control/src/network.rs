//! Network domains (book: "Network Domains"): named groups of a tenant's allocations that share L3
//! reachability, each mapped to a Slingshot VNI from the configured pool. A domain is created when its
//! first allocation starts (VNI allocated sequentially from the pool), joined by later ones, drained
//! for a grace period (default 5 minutes) when its last allocation ends, and released — its VNI back
//! in the pool — if nobody joined meanwhile. Names are scoped to the tenant; a sensitive allocation
//! always gets a domain of its own; a multi-node allocation without a domain gets one named after
//! itself; a single-node one needs none.
//!
//! The bookkeeping and the refusal of starts the pool cannot serve are the controller's
//! ([`lattice_engine::network`]), so `rm-replay` refuses the same starts; here are the runtime's
//! config, the names the API shows for the controller's domains, and their views. The fabric
//! manager calls (CXI services granting the allocation's nodes the VNI, revoked at the end) are made
//! by the server around it.

use lattice_engine::{DomainName, NetworkDomains, VniError, VniPool};

/// `network:` in the runtime config.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    #[serde(default = "start_default")]
    pub vni_pool_start: u32,
    #[serde(default = "end_default")]
    pub vni_pool_end: u32,
    /// How long an empty domain keeps its VNI (DAG stages with gaps rejoin it). It seeds the
    /// quorum's `network.grace` setting; a named domain's own is `network.grace_by_domain.T/NAME`.
    #[serde(default = "grace_default")]
    pub grace: String,
}

fn start_default() -> u32 {
    1000
}
fn end_default() -> u32 {
    4095
}
fn grace_default() -> String {
    "5m".into()
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            vni_pool_start: start_default(),
            vni_pool_end: end_default(),
            grace: grace_default(),
        }
    }
}

/// The domains as the API names them: a named domain by its name, an allocation's own by the
/// allocation's name (`sensitive-<name>` for a sensitive claim's).
pub fn domain_name(name: &DomainName, alloc_name: impl Fn(lattice_engine::AllocId) -> String) -> String {
    match name {
        DomainName::Named(n) => n.clone(),
        DomainName::Own(a) => alloc_name(*a),
        DomainName::Sensitive(a) => format!("sensitive-{}", alloc_name(*a)),
    }
}

impl NetworkConfig {
    /// The controller's domains over this pool, a drained domain keeping its VNI for `grace`.
    pub fn domains(&self) -> Result<NetworkDomains, VniError> {
        let grace = lattice_traces::parse_duration(&self.grace).unwrap_or(lattice_engine::Duration::from_mins(5));
        Ok(NetworkDomains::new(
            VniPool::new(self.vni_pool_start, self.vni_pool_end)?,
            grace,
        ))
    }
}

/// A domain as the API shows it.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct DomainView {
    pub tenant: String,
    pub name: String,
    pub vni: u32,
    pub allocations: Vec<String>,
    pub draining: bool,
    /// How long it keeps its VNI once empty, in seconds: its own (`lattice admin network set-grace`)
    /// or the site's default.
    pub grace_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_engine::AllocId;

    #[test]
    fn the_api_names_domains_by_their_allocations() {
        let name = |a: AllocId| format!("a-{}", a.0);
        assert_eq!(domain_name(&DomainName::Named("ml".into()), name), "ml");
        assert_eq!(domain_name(&DomainName::Own(AllocId(1)), name), "a-1");
        assert_eq!(domain_name(&DomainName::Sensitive(AllocId(1)), name), "sensitive-a-1");
    }

    #[test]
    fn the_default_pool_is_the_books() {
        let d = NetworkConfig::default().domains().unwrap();
        assert_eq!(d.pool(), (3096, 0));
        let bad = NetworkConfig {
            vni_pool_start: 2,
            ..NetworkConfig::default()
        };
        assert!(bad.domains().is_err(), "VNIs below 1000 are reserved");
    }
}
