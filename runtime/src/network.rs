//! Network domains (book: "Network Domains"): named groups of a tenant's allocations that share L3
//! reachability, each mapped to a Slingshot VNI from the configured pool. A domain is created when its
//! first allocation starts (VNI allocated sequentially from the pool), joined by later ones, drained
//! for a grace period (default 5 minutes) when its last allocation ends, and released — its VNI back
//! in the pool — if nobody joined meanwhile. Names are scoped to the tenant; a sensitive allocation
//! always gets a domain of its own; a multi-node allocation without a domain gets one named after
//! itself; a single-node one needs none. Pure bookkeeping: the fabric manager calls (CXI services
//! granting the allocation's nodes the VNI, revoked at the end) are made by the server around it.

use lattice_adapters::fabric::{VniError, VniPool};
use std::collections::{BTreeMap, BTreeSet};

/// `network:` in the runtime config.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    #[serde(default = "start_default")]
    pub vni_pool_start: u32,
    #[serde(default = "end_default")]
    pub vni_pool_end: u32,
    /// How long an empty domain keeps its VNI (DAG stages with gaps rejoin it).
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

/// Which domain an allocation belongs to, if any.
pub fn domain_of(alloc: &str, requested: Option<&str>, nodes: u32, sensitive: bool) -> Option<String> {
    if sensitive {
        return Some(format!("sensitive-{alloc}"));
    }
    match requested {
        Some(d) => Some(d.to_string()),
        None if nodes > 1 => Some(alloc.to_string()),
        None => None,
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Domain {
    vni: u32,
    members: BTreeSet<String>,
    /// When its last member left (ms): released after the grace period.
    empty_since: Option<u64>,
}

/// The domains of every tenant and the VNI pool.
#[derive(Debug)]
pub struct NetworkDomains {
    pool: VniPool,
    grace_ms: u64,
    domains: BTreeMap<(String, String), Domain>,
    /// Allocation → its domain key.
    member_of: BTreeMap<String, (String, String)>,
}

/// A domain as the API shows it.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct DomainView {
    pub tenant: String,
    pub name: String,
    pub vni: u32,
    pub allocations: Vec<String>,
    pub draining: bool,
}

impl NetworkDomains {
    pub fn new(cfg: &NetworkConfig, grace_ms: u64) -> Result<NetworkDomains, VniError> {
        Ok(NetworkDomains {
            pool: VniPool::new(cfg.vni_pool_start, cfg.vni_pool_end)?,
            grace_ms,
            domains: BTreeMap::new(),
            member_of: BTreeMap::new(),
        })
    }

    /// Whether `tenant` has a domain `name` (joining it needs no new VNI).
    pub fn exists(&self, tenant: &str, name: &str) -> bool {
        self.domains.contains_key(&(tenant.to_string(), name.to_string()))
    }

    /// `alloc` joins `domain` of `tenant` (created with a new VNI if absent, or taken back from
    /// draining). Returns the VNI and whether the domain was created.
    pub fn join(&mut self, tenant: &str, domain: &str, alloc: &str) -> Result<(u32, bool), VniError> {
        let key = (tenant.to_string(), domain.to_string());
        let created = !self.domains.contains_key(&key);
        if created {
            let vni = self.pool.allocate()?;
            self.domains.insert(
                key.clone(),
                Domain {
                    vni,
                    members: BTreeSet::new(),
                    empty_since: None,
                },
            );
        }
        let d = self.domains.get_mut(&key).expect("present");
        d.members.insert(alloc.to_string());
        d.empty_since = None;
        self.member_of.insert(alloc.to_string(), key);
        Ok((d.vni, created))
    }

    /// `alloc` ended (or lost its nodes): its domain drains when it was the last member.
    pub fn leave(&mut self, alloc: &str, now_ms: u64) {
        let Some(key) = self.member_of.remove(alloc) else {
            return;
        };
        if let Some(d) = self.domains.get_mut(&key) {
            d.members.remove(alloc);
            if d.members.is_empty() {
                d.empty_since = Some(now_ms);
            }
        }
    }

    /// Releases the domains that stayed empty for the grace period: their (tenant, name, VNI).
    pub fn expire(&mut self, now_ms: u64) -> Vec<(String, String, u32)> {
        let gone: Vec<(String, String)> = self
            .domains
            .iter()
            .filter(|(_, d)| d.empty_since.is_some_and(|t| now_ms >= t + self.grace_ms))
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| {
                let d = self.domains.remove(&k)?;
                self.pool.release(d.vni);
                Some((k.0, k.1, d.vni))
            })
            .collect()
    }

    /// The VNI of `alloc`'s domain.
    pub fn vni_of(&self, alloc: &str) -> Option<u32> {
        self.domains.get(self.member_of.get(alloc)?).map(|d| d.vni)
    }

    /// (total, in use) of the pool.
    pub fn pool(&self) -> (usize, usize) {
        (self.pool.total(), self.pool.in_use())
    }

    pub fn views(&self) -> Vec<DomainView> {
        self.domains
            .iter()
            .map(|((t, n), d)| DomainView {
                tenant: t.clone(),
                name: n.clone(),
                vni: d.vni,
                allocations: d.members.iter().cloned().collect(),
                draining: d.empty_since.is_some(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains(start: u32, end: u32) -> NetworkDomains {
        let cfg = NetworkConfig {
            vni_pool_start: start,
            vni_pool_end: end,
            grace: "5m".into(),
        };
        NetworkDomains::new(&cfg, 300_000).unwrap()
    }

    #[test]
    fn which_allocations_need_a_domain() {
        assert_eq!(domain_of("a-1", Some("ml"), 1, false).as_deref(), Some("ml"));
        assert_eq!(domain_of("a-1", None, 4, false).as_deref(), Some("a-1"));
        assert_eq!(domain_of("a-1", None, 1, false), None);
        assert_eq!(domain_of("a-1", Some("ml"), 4, true).as_deref(), Some("sensitive-a-1"));
    }

    #[test]
    fn tenants_share_names_not_vnis_and_members_share_the_vni() {
        let mut n = domains(1000, 1009);
        assert_eq!(n.join("physics", "ml", "a-1").unwrap(), (1000, true));
        assert_eq!(n.join("physics", "ml", "a-2").unwrap(), (1000, false), "joins");
        assert_eq!(n.join("bio", "ml", "a-3").unwrap(), (1001, true), "another tenant's ml");
        assert_eq!(n.vni_of("a-2"), Some(1000));
        assert_eq!(n.pool(), (10, 2));
        let v = n.views();
        assert_eq!(v[1].allocations, ["a-1", "a-2"]);
    }

    #[test]
    fn an_empty_domain_drains_for_the_grace_period_then_frees_its_vni() {
        let mut n = domains(1000, 1009);
        n.join("physics", "dag", "s1").unwrap();
        n.leave("s1", 1_000);
        assert!(n.views()[0].draining);
        assert!(n.expire(1_000 + 299_999).is_empty(), "still in grace");
        // The next DAG stage within the grace period rejoins: same VNI, no churn.
        assert_eq!(n.join("physics", "dag", "s2").unwrap(), (1000, false));
        n.leave("s2", 500_000);
        assert_eq!(n.expire(800_000), [("physics".into(), "dag".into(), 1000)]);
        assert_eq!(n.pool().1, 0, "back in the pool");
        assert_eq!(n.vni_of("s2"), None);
    }

    #[test]
    fn exhaustion_blocks_new_domains_only() {
        let mut n = domains(1000, 1001);
        n.join("physics", "a", "a-1").unwrap();
        n.join("physics", "b", "a-2").unwrap();
        assert_eq!(n.pool(), (2, 2));
        let e = n.join("physics", "c", "a-3").unwrap_err();
        assert!(e.to_string().contains("VNI pool exhausted (2/2 in use)"), "{e}");
        assert_eq!(
            n.join("physics", "a", "a-4").unwrap(),
            (1000, false),
            "joining an existing domain is fine"
        );
        assert!(n.exists("physics", "a") && !n.exists("bio", "a"));
        n.leave("a-1", 0);
        n.leave("a-4", 0);
        assert_eq!(n.expire(300_000).len(), 1);
        assert_eq!(
            n.join("physics", "c", "a-3").unwrap(),
            (1000, true),
            "its VNI was freed"
        );
    }
}
