//! Network domains (book: "Network Domains"): named groups of a tenant's allocations that share L3
//! reachability, each mapped to a Slingshot VNI from the configured pool. A domain is created when its
//! first allocation starts (VNI allocated sequentially from the pool), joined by later ones, drained
//! for a grace period (default 5 minutes) when its last allocation ends, and released — its VNI back
//! in the pool — if nobody joined meanwhile. Names are scoped to the tenant; a sensitive allocation
//! always gets a domain of its own; a multi-node allocation without a domain gets one of its own; a
//! single-node one needs none.
//!
//! The [`Controller`](crate::controller::Controller) owns this bookkeeping, so both worlds refuse the
//! same starts: a proposal whose domain would need a VNI the pool cannot give is refused before it
//! reaches the quorum (the allocation stays Pending, retried next cycle). A proposal at the quorum
//! holds its domain's VNI ([`NetworkDomains::reserve`]) until the quorum answers; a committed start
//! joins the domain. Pure bookkeeping: the fabric manager's CXI services are the runtime's.

use crate::ids::{AllocId, TenantId};
use crate::time::{Duration, Time};
use std::collections::{BTreeMap, BTreeSet};

/// VNIs for network domains.
#[derive(Clone, Debug)]
pub struct VniPool {
    start: u32,
    end: u32,
    next: u32,
    used: BTreeSet<u32>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VniError {
    #[error("cannot create network domain — VNI pool exhausted ({used}/{total} in use)")]
    Exhausted { used: usize, total: usize },
    #[error("VNI pool {start}-{end}: VNIs below 1000 are reserved (1 management, 2 telemetry)")]
    Reserved { start: u32, end: u32 },
}

impl VniPool {
    /// The book's default is 1000..=4095.
    pub fn new(start: u32, end: u32) -> Result<VniPool, VniError> {
        if start < 1000 || end < start {
            return Err(VniError::Reserved { start, end });
        }
        Ok(VniPool {
            start,
            end,
            next: start,
            used: BTreeSet::new(),
        })
    }

    pub fn total(&self) -> usize {
        (self.end - self.start + 1) as usize
    }

    pub fn in_use(&self) -> usize {
        self.used.len()
    }

    /// The next free VNI after the last one handed out (sequential, wrapping).
    pub fn allocate(&mut self) -> Result<u32, VniError> {
        if self.used.len() == self.total() {
            return Err(VniError::Exhausted {
                used: self.used.len(),
                total: self.total(),
            });
        }
        loop {
            let v = self.next;
            self.next = if v == self.end { self.start } else { v + 1 };
            if self.used.insert(v) {
                return Ok(v);
            }
        }
    }

    pub fn release(&mut self, vni: u32) -> bool {
        self.used.remove(&vni)
    }

    /// Takes `vni` itself (a recovery: a running allocation keeps the VNI the quorum recorded for
    /// it); `false` when it is outside the pool or in use.
    pub fn take(&mut self, vni: u32) -> bool {
        (self.start..=self.end).contains(&vni) && self.used.insert(vni)
    }
}

/// A domain's name within its tenant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DomainName {
    /// Requested by name (`connectivity.network_domain`): shared by the tenant's allocations that
    /// name it.
    Named(String),
    /// A multi-node allocation that names none: a domain of its own.
    Own(AllocId),
    /// A sensitive claim: always a domain of its own.
    Sensitive(AllocId),
}

impl std::fmt::Display for DomainName {
    /// The decision log's name (allocation indices; a world names its allocations itself).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DomainName::Named(n) => write!(f, "{n}"),
            DomainName::Own(a) => write!(f, "own:{a}"),
            DomainName::Sensitive(a) => write!(f, "sensitive:{a}"),
        }
    }
}

/// Which domain an allocation of `nodes` nodes belongs to, if any.
pub fn domain_of(alloc: AllocId, requested: Option<&str>, nodes: usize, sensitive: bool) -> Option<DomainName> {
    if sensitive {
        return Some(DomainName::Sensitive(alloc));
    }
    match requested {
        Some(d) => Some(DomainName::Named(d.to_string())),
        None if nodes > 1 => Some(DomainName::Own(alloc)),
        None => None,
    }
}

/// A domain's key: its tenant and name.
pub type DomainKey = (TenantId, DomainName);

#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    pub vni: u32,
    pub members: BTreeSet<AllocId>,
    /// When its last member left: released after the grace period.
    pub empty_since: Option<Time>,
}

/// A new network domain the VNI pool has no VNI left for.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolExhausted {
    pub domain: DomainName,
    pub used: usize,
    pub total: usize,
}

/// The domains of every tenant and the VNI pool.
#[derive(Clone, Debug)]
pub struct NetworkDomains {
    pool: VniPool,
    grace: Duration,
    /// Named domains' own grace periods (`lattice admin network set-grace`): DAGs whose stages have
    /// longer gaps keep their domain across them. Kept for a name whether or not its domain exists.
    grace_by: BTreeMap<DomainKey, Duration>,
    domains: BTreeMap<DomainKey, Domain>,
    /// Allocation → its domain's key (members).
    member_of: BTreeMap<AllocId, DomainKey>,
    /// Proposals at the quorum → the domain they will join.
    reserved: BTreeMap<AllocId, DomainKey>,
    /// The VNIs of domains proposals at the quorum will create, taken from the pool when the first
    /// of them was proposed: the proposal carries it, so the quorum records it with the start.
    creating: BTreeMap<DomainKey, u32>,
}

impl NetworkDomains {
    pub fn new(pool: VniPool, grace: Duration) -> NetworkDomains {
        NetworkDomains {
            pool,
            grace,
            grace_by: BTreeMap::new(),
            domains: BTreeMap::new(),
            member_of: BTreeMap::new(),
            reserved: BTreeMap::new(),
            creating: BTreeMap::new(),
        }
    }

    /// The grace period of domains without one of their own.
    pub fn default_grace(&self) -> Duration {
        self.grace
    }

    pub fn set_default_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The domains with a grace period of their own.
    pub fn domain_graces(&self) -> &BTreeMap<DomainKey, Duration> {
        &self.grace_by
    }

    /// Replaces the domains' own grace periods as a whole (the others drain for the default). A
    /// draining domain's release moves with its grace: it counts from when its last member left.
    pub fn set_domain_graces(&mut self, by: BTreeMap<DomainKey, Duration>) {
        self.grace_by = by;
    }

    /// How long `key` keeps its VNI once empty.
    pub fn grace_of(&self, key: &DomainKey) -> Duration {
        self.grace_by.get(key).copied().unwrap_or(self.grace)
    }

    /// (total, in use) of the pool: VNIs of existing domains and of domains proposals will create.
    pub fn pool(&self) -> (usize, usize) {
        (self.pool.total(), self.pool.in_use())
    }

    /// A proposal of `alloc` will join `key`: held until the quorum answers; its VNI (a new domain's
    /// is taken from the pool now). Refused when the domain does not exist (and no other proposal
    /// creates it) and the pool has no VNI left.
    pub fn reserve(&mut self, alloc: AllocId, key: DomainKey) -> Result<u32, PoolExhausted> {
        let vni = match self.domains.get(&key) {
            Some(d) => d.vni,
            None => match self.creating.get(&key) {
                Some(&v) => v,
                None => {
                    let (total, used) = self.pool();
                    let v = self.pool.allocate().map_err(|_| PoolExhausted {
                        domain: key.1.clone(),
                        used,
                        total,
                    })?;
                    self.creating.insert(key.clone(), v);
                    v
                }
            },
        };
        self.drop_reservation(alloc);
        self.reserved.insert(alloc, key);
        Ok(vni)
    }

    /// The domain and VNI `alloc`'s proposal carries (`None`: it joins no domain, or is not at the
    /// quorum).
    pub fn reserved(&self, alloc: AllocId) -> Option<(&DomainKey, u32)> {
        let key = self.reserved.get(&alloc)?;
        let vni = self
            .domains
            .get(key)
            .map(|d| d.vni)
            .or_else(|| self.creating.get(key).copied())?;
        Some((key, vni))
    }

    /// `alloc`'s hold ends; a VNI taken for a domain no proposal creates any more goes back.
    fn drop_reservation(&mut self, alloc: AllocId) {
        let Some(key) = self.reserved.remove(&alloc) else {
            return;
        };
        if !self.reserved.values().any(|k| *k == key)
            && let Some(vni) = self.creating.remove(&key)
        {
            self.pool.release(vni);
        }
    }

    /// The quorum rejected `alloc`'s proposal: its hold goes.
    pub fn unreserve(&mut self, alloc: AllocId) {
        self.drop_reservation(alloc);
    }

    /// `alloc` started (its proposal committed, or a run adopted): it joins its reserved domain, or
    /// `key` (created with a new VNI if absent, or taken back from draining). Its VNI, or `None` when
    /// the pool had none left (an adopted run beyond the pool).
    pub fn join(&mut self, alloc: AllocId, key: Option<DomainKey>) -> Option<u32> {
        self.join_with(alloc, key, None)
    }

    /// As [`NetworkDomains::join`]; a domain it creates takes `recorded` (the VNI the quorum holds
    /// for a run adopted after a fail-over) when the pool has it free.
    pub fn join_with(&mut self, alloc: AllocId, key: Option<DomainKey>, recorded: Option<u32>) -> Option<u32> {
        let reserved = self.reserved.get(&alloc).cloned();
        let key = reserved.or(key)?;
        if !self.domains.contains_key(&key) {
            let vni = match self.creating.remove(&key) {
                Some(v) => v,
                None => match recorded.filter(|v| self.pool.take(*v)) {
                    Some(v) => v,
                    None => self.pool.allocate().ok()?,
                },
            };
            self.domains.insert(
                key.clone(),
                Domain {
                    vni,
                    members: BTreeSet::new(),
                    empty_since: None,
                },
            );
        }
        self.reserved.remove(&alloc);
        let d = self.domains.get_mut(&key)?;
        d.members.insert(alloc);
        d.empty_since = None;
        let vni = d.vni;
        self.member_of.insert(alloc, key);
        Some(vni)
    }

    /// `alloc` ended (or lost its nodes): its domain drains when it was the last member.
    pub fn leave(&mut self, alloc: AllocId, now: Time) {
        self.drop_reservation(alloc);
        let Some(key) = self.member_of.remove(&alloc) else {
            return;
        };
        if let Some(d) = self.domains.get_mut(&key) {
            d.members.remove(&alloc);
            if d.members.is_empty() {
                d.empty_since = Some(now);
            }
        }
    }

    /// Releases the domains that stayed empty for the grace period (and that no proposal at the
    /// quorum is to join): their keys and VNIs.
    pub fn expire(&mut self, now: Time) -> Vec<(DomainKey, u32)> {
        let held: BTreeSet<&DomainKey> = self.reserved.values().collect();
        let gone: Vec<DomainKey> = self
            .domains
            .iter()
            .filter(|(k, d)| !held.contains(k) && d.empty_since.is_some_and(|t| now >= t + self.grace_of(k)))
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| {
                let d = self.domains.remove(&k)?;
                self.pool.release(d.vni);
                Some((k, d.vni))
            })
            .collect()
    }

    /// When the next drained domain gives its VNI back (a start refused for want of one may go then).
    pub fn next_expiry(&self) -> Option<Time> {
        self.domains
            .iter()
            .filter_map(|(k, d)| Some(d.empty_since? + self.grace_of(k)))
            .min()
    }

    /// The VNI of `alloc`'s domain.
    pub fn vni_of(&self, alloc: AllocId) -> Option<u32> {
        self.domains.get(self.member_of.get(&alloc)?).map(|d| d.vni)
    }

    /// Every domain, in key order.
    pub fn domains(&self) -> impl Iterator<Item = (&DomainKey, &Domain)> {
        self.domains.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains(start: u32, end: u32) -> NetworkDomains {
        NetworkDomains::new(VniPool::new(start, end).unwrap(), Duration::from_mins(5))
    }

    fn named(t: u32, n: &str) -> DomainKey {
        (TenantId(t), DomainName::Named(n.into()))
    }

    #[test]
    fn which_allocations_need_a_domain() {
        let a = AllocId(1);
        assert_eq!(domain_of(a, Some("ml"), 1, false), Some(DomainName::Named("ml".into())));
        assert_eq!(domain_of(a, None, 4, false), Some(DomainName::Own(a)));
        assert_eq!(domain_of(a, None, 1, false), None);
        assert_eq!(domain_of(a, Some("ml"), 4, true), Some(DomainName::Sensitive(a)));
    }

    #[test]
    fn tenants_share_names_not_vnis_and_members_share_the_vni() {
        let mut n = domains(1000, 1009);
        assert_eq!(n.join(AllocId(1), Some(named(0, "ml"))), Some(1000));
        assert_eq!(n.join(AllocId(2), Some(named(0, "ml"))), Some(1000), "joins");
        assert_eq!(
            n.join(AllocId(3), Some(named(1, "ml"))),
            Some(1001),
            "another tenant's ml"
        );
        assert_eq!(n.vni_of(AllocId(2)), Some(1000));
        assert_eq!(n.pool(), (10, 2));
        let members: Vec<_> = n.domains().next().unwrap().1.members.iter().copied().collect();
        assert_eq!(members, [AllocId(1), AllocId(2)]);
    }

    #[test]
    fn an_empty_domain_drains_for_the_grace_period_then_frees_its_vni() {
        let mut n = domains(1000, 1009);
        n.join(AllocId(1), Some(named(0, "dag")));
        n.leave(AllocId(1), Time(1_000));
        assert!(n.domains().next().unwrap().1.empty_since.is_some());
        assert!(n.expire(Time(1_000 + 299_999)).is_empty(), "still in grace");
        // The next DAG stage within the grace period rejoins: same VNI, no churn.
        assert_eq!(n.join(AllocId(2), Some(named(0, "dag"))), Some(1000));
        n.leave(AllocId(2), Time(500_000));
        assert_eq!(n.expire(Time(800_000)), [(named(0, "dag"), 1000)]);
        assert_eq!(n.pool().1, 0, "back in the pool");
        assert_eq!(n.vni_of(AllocId(2)), None);
    }

    /// A domain's own grace (set-grace) holds its VNI longer than the default, counted from when its
    /// last member left, and only for that tenant's domain of that name; the timer restarts when a
    /// stage joins.
    #[test]
    fn a_domain_of_its_own_grace_drains_for_it() {
        let mut n = domains(1000, 1009);
        n.set_domain_graces(BTreeMap::from([(named(0, "dag"), Duration::from_mins(15))]));
        n.join(AllocId(1), Some(named(0, "dag")));
        n.join(AllocId(2), Some(named(1, "dag")));
        n.leave(AllocId(1), Time(0));
        n.leave(AllocId(2), Time(0));
        assert_eq!(
            n.next_expiry(),
            Some(Time(300_000)),
            "the other tenant's dag: the default"
        );
        assert_eq!(n.expire(Time(300_000)), [(named(1, "dag"), 1001)]);
        assert_eq!(n.next_expiry(), Some(Time(900_000)));
        // A stage joins at 14 min and leaves at 20: the 15 minutes count from then.
        n.join(AllocId(3), Some(named(0, "dag")));
        n.leave(AllocId(3), Time(1_200_000));
        assert!(n.expire(Time(1_200_000 + 899_999)).is_empty(), "still in its grace");
        // Back to the default (a reset): it expires 5 minutes after it emptied.
        n.set_domain_graces(BTreeMap::new());
        assert_eq!(n.grace_of(&named(0, "dag")), Duration::from_mins(5));
        assert_eq!(n.expire(Time(1_500_000)), [(named(0, "dag"), 1000)]);
    }

    /// Proposals at the quorum hold the VNIs their new domains need: a third new domain is refused
    /// while two proposals hold the pool's two VNIs, joining a reserved domain is not, and a
    /// rejected proposal gives its VNI back.
    #[test]
    fn exhaustion_refuses_new_domains_only_counting_proposals_at_the_quorum() {
        let mut n = domains(1000, 1001);
        n.reserve(AllocId(1), named(0, "a")).unwrap();
        n.reserve(AllocId(2), named(0, "b")).unwrap();
        assert_eq!(n.pool(), (2, 2));
        let e = n.reserve(AllocId(3), named(0, "c")).unwrap_err();
        assert_eq!(
            e,
            PoolExhausted {
                domain: DomainName::Named("c".into()),
                used: 2,
                total: 2
            }
        );
        n.reserve(AllocId(4), named(0, "a"))
            .expect("joining a domain a proposal creates");
        assert_eq!(n.join(AllocId(1), None), Some(1000));
        assert_eq!(n.join(AllocId(4), None), Some(1000));
        n.unreserve(AllocId(2));
        assert_eq!(n.pool(), (2, 1));
        n.reserve(AllocId(3), named(0, "c"))
            .expect("the rejected proposal's VNI is free");
        // A draining domain a proposal will rejoin is not released under it.
        n.leave(AllocId(1), Time(0));
        n.leave(AllocId(4), Time(0));
        n.reserve(AllocId(5), named(0, "a")).unwrap();
        assert!(n.expire(Time(10_000_000)).is_empty());
        assert_eq!(n.join(AllocId(5), None), Some(1000));
    }

    /// A proposal carries the VNI it will have (the quorum records it with the start); an adopted
    /// run takes back the VNI recorded for it, not the pool's next one.
    #[test]
    fn proposals_carry_their_vni_and_an_adopted_run_keeps_the_recorded_one() {
        let mut n = domains(1000, 1009);
        assert_eq!(n.reserve(AllocId(1), named(0, "a")), Ok(1000));
        assert_eq!(n.reserve(AllocId(2), named(0, "a")), Ok(1000), "same new domain");
        assert_eq!(n.reserved(AllocId(2)), Some((&named(0, "a"), 1000)));
        assert_eq!(n.join(AllocId(1), None), Some(1000));
        assert_eq!(n.join(AllocId(2), None), Some(1000));
        // A new leader's fresh bookkeeping: the run keeps 1007, and the next domain does not get it.
        let mut fresh = domains(1000, 1009);
        assert_eq!(fresh.join_with(AllocId(9), Some(named(0, "a")), Some(1007)), Some(1007));
        assert_eq!(
            fresh.join_with(AllocId(8), Some(named(0, "a")), Some(1003)),
            Some(1007),
            "joins"
        );
        assert_eq!(
            fresh.join_with(AllocId(7), Some(named(0, "b")), Some(1007)),
            Some(1000),
            "in use"
        );
        assert_eq!(
            fresh.join_with(AllocId(6), Some(named(0, "c")), Some(99)),
            Some(1001),
            "outside"
        );
        assert_eq!(fresh.pool(), (10, 3));
    }

    #[test]
    fn pool_hands_out_vnis_in_order_and_wraps() {
        let mut p = VniPool::new(1000, 1002).unwrap();
        assert_eq!(
            (p.allocate(), p.allocate(), p.allocate()),
            (Ok(1000), Ok(1001), Ok(1002))
        );
        assert_eq!(p.allocate(), Err(VniError::Exhausted { used: 3, total: 3 }));
        assert!(p.release(1001));
        assert_eq!(p.allocate(), Ok(1001));
        assert!(matches!(VniPool::new(2, 10), Err(VniError::Reserved { .. })));
    }
}
