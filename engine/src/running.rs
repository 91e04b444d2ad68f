//! The running set: allocations that hold nodes and have a walltime, by (estimated end, id).
//!
//! Every entry is also filed under its own pool and under each pool whose nodes it holds (a borrower
//! holds a lender's nodes), so a pass walks only the entries of its pool — the availability profile,
//! the reclaim victim search, the backlog and lending sums — instead of every allocation that runs on
//! the site. A filtered walk of a sub-index visits the same entries in the same order as a filtered walk
//! of the whole set, so decisions and floating-point sums are unchanged.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::AllocId;
use crate::time::Time;

type Entry = (Time, AllocId);

#[derive(Clone, Debug)]
struct Filing {
    at: Time,
    own: u32,
    holds: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct RunningSet {
    /// One pool on the site: every entry is its own and holds its nodes; nothing is filed.
    single_pool: bool,
    all: BTreeSet<Entry>,
    /// Entries by a pool whose nodes they hold.
    holding: BTreeMap<u32, BTreeSet<Entry>>,
    /// Entries by their own (home) pool.
    own: BTreeMap<u32, BTreeSet<Entry>>,
    filed: BTreeMap<AllocId, Filing>,
}

static EMPTY: BTreeSet<Entry> = BTreeSet::new();

impl RunningSet {
    /// An empty set; with `single_pool` the per-pool walks are walks of the whole set.
    pub fn new(single_pool: bool) -> RunningSet {
        RunningSet {
            single_pool,
            ..RunningSet::default()
        }
    }

    pub fn single_pool(&self) -> bool {
        self.single_pool
    }

    /// Adds `(at, id)`, filed under its own pool and the pools in `holds` (deduplicated here). An id
    /// already present is moved to the new entry.
    pub fn insert(&mut self, at: Time, id: AllocId, own: u32, mut holds: Vec<u32>) {
        if self.single_pool {
            self.all.insert((at, id));
            return;
        }
        if let Some(f) = self.filed.get(&id) {
            let at = f.at;
            self.remove(&(at, id));
        }
        holds.sort_unstable();
        holds.dedup();
        self.all.insert((at, id));
        self.own.entry(own).or_default().insert((at, id));
        for &p in &holds {
            self.holding.entry(p).or_default().insert((at, id));
        }
        self.filed.insert(id, Filing { at, own, holds });
    }

    /// Removes `(at, id)`; false (nothing changes) when that exact entry is not present.
    pub fn remove(&mut self, entry: &Entry) -> bool {
        if self.single_pool {
            return self.all.remove(entry);
        }
        let (at, id) = *entry;
        match self.filed.get(&id) {
            Some(f) if f.at == at => {}
            _ => return false,
        }
        let f = self.filed.remove(&id).expect("filed above");
        self.all.remove(entry);
        if let Some(s) = self.own.get_mut(&f.own) {
            s.remove(entry);
        }
        for p in &f.holds {
            if let Some(s) = self.holding.get_mut(p) {
                s.remove(entry);
            }
        }
        true
    }

    /// Re-files `id` (when the pools whose nodes it holds changed); no-op when it is not present.
    pub fn refile(&mut self, id: AllocId, holds: Vec<u32>) {
        if self.single_pool {
            return;
        }
        if let Some(f) = self.filed.get(&id) {
            let (at, own) = (f.at, f.own);
            self.insert(at, id, own, holds);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.all.iter()
    }

    pub fn first(&self) -> Option<&Entry> {
        self.all.first()
    }

    pub fn pop_first(&mut self) -> Option<Entry> {
        let e = *self.all.first()?;
        self.remove(&e);
        Some(e)
    }

    /// Entries holding nodes of pool `key`, earliest end first.
    pub fn holding_in(&self, key: u32) -> impl Iterator<Item = &Entry> + '_ {
        if self.single_pool {
            return self.all.iter();
        }
        self.holding.get(&key).unwrap_or(&EMPTY).iter()
    }

    /// Entries whose own pool is `key`, earliest end first.
    pub fn owned_by(&self, key: u32) -> impl Iterator<Item = &Entry> + '_ {
        if self.single_pool {
            return self.all.iter();
        }
        self.own.get(&key).unwrap_or(&EMPTY).iter()
    }
}

impl<'a> IntoIterator for &'a RunningSet {
    type Item = &'a Entry;
    type IntoIter = std::collections::btree_set::Iter<'a, Entry>;

    fn into_iter(self) -> Self::IntoIter {
        self.all.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Time {
        Time(ms)
    }

    #[test]
    fn one_pool_files_nothing_and_walks_everything() {
        let mut r = RunningSet::new(true);
        r.insert(t(30), AllocId(1), 0, vec![0]);
        r.insert(t(10), AllocId(2), 0, vec![0]);
        assert!(r.filed.is_empty() && r.own.is_empty() && r.holding.is_empty());
        assert_eq!(
            r.holding_in(0).map(|e| e.1).collect::<Vec<_>>(),
            vec![AllocId(2), AllocId(1)]
        );
        assert_eq!(r.owned_by(0).count(), 2);
        assert!(!r.remove(&(t(11), AllocId(2))));
        assert!(r.remove(&(t(10), AllocId(2))));
        assert_eq!(r.pop_first(), Some((t(30), AllocId(1))));
    }

    #[test]
    fn sub_indexes_follow_inserts_removes_and_refiles() {
        let mut r = RunningSet::default();
        r.insert(t(30), AllocId(1), 1, vec![1]);
        r.insert(t(10), AllocId(2), 2, vec![1, 2, 1]);
        r.insert(t(20), AllocId(3), 1, vec![1]);
        let ids = |it: &mut dyn Iterator<Item = &Entry>| it.map(|e| e.1.0).collect::<Vec<_>>();
        assert_eq!(ids(&mut r.iter()), vec![2, 3, 1]);
        assert_eq!(ids(&mut r.holding_in(1)), vec![2, 3, 1]);
        assert_eq!(ids(&mut r.holding_in(2)), vec![2]);
        assert_eq!(ids(&mut r.owned_by(1)), vec![3, 1]);
        assert_eq!(ids(&mut r.holding_in(9)), Vec::<u64>::new());
        // A wrong end removes nothing.
        assert!(!r.remove(&(t(11), AllocId(2))));
        assert!(r.remove(&(t(10), AllocId(2))));
        assert_eq!(ids(&mut r.holding_in(2)), Vec::<u64>::new());
        assert_eq!(ids(&mut r.holding_in(1)), vec![3, 1]);
        // A new end moves the entry in every index.
        r.insert(t(5), AllocId(1), 1, vec![1]);
        assert_eq!(ids(&mut r.iter()), vec![1, 3]);
        assert_eq!(ids(&mut r.owned_by(1)), vec![1, 3]);
        r.refile(AllocId(3), vec![1, 4]);
        assert_eq!(ids(&mut r.holding_in(4)), vec![3]);
        assert_eq!(r.pop_first(), Some((t(5), AllocId(1))));
        assert_eq!(ids(&mut r.owned_by(1)), vec![3]);
        assert_eq!(ids(&mut r.holding_in(1)), vec![3]);
    }
}

#[cfg(test)]
mod engine_tests {
    use crate::AllocSpec;
    use crate::engine::{Engine, EngineConfig};
    use crate::ids::VClusterId;
    use crate::node::NodeSpec;
    use crate::policy::Policy;
    use crate::time::{Duration, Time};

    /// Every node is home to vCluster 0 (one pool); a vCluster without home nodes added while an
    /// allocation runs opens the shared pool: the running entry is then filed under its pools.
    #[test]
    fn a_second_pool_files_what_already_runs() {
        let nodes: Vec<NodeSpec> = (0..4)
            .map(|i| {
                let mut n = NodeSpec::plain(format!("n{i}"));
                n.home_vcluster = Some(VClusterId(0));
                n
            })
            .collect();
        let mut e = Engine::new(EngineConfig::new(Policy::EASY), nodes).unwrap();
        let t = e.add_tenant("physics");
        let v = e.add_vcluster("home");
        assert!(e.running.single_pool());
        let id = e
            .handle_submit(Time::ZERO, AllocSpec::simple(t, v, 2, Duration::from_secs(60)))
            .unwrap();
        e.schedule(Time::ZERO);
        let p = e.poll_proposal().expect("the allocation starts");
        e.handle_commit(Time::ZERO, p.alloc).unwrap();
        let home = e.pool_key_of(id);
        e.add_vcluster("homeless");
        assert!(!e.running.single_pool());
        let ids = |it: &mut dyn Iterator<Item = &(Time, crate::ids::AllocId)>| it.map(|x| x.1).collect::<Vec<_>>();
        assert_eq!(ids(&mut e.running.owned_by(home)), vec![id]);
        assert_eq!(ids(&mut e.running.holding_in(home)), vec![id]);
        assert_eq!(ids(&mut e.running.owned_by(0)), vec![]);
        assert_eq!(ids(&mut e.running.holding_in(0)), vec![]);
    }
}
