//! Node classes and the placement picker.
//!
//! A *class* is a set of interchangeable nodes: same scheduling pool, capabilities, dragonfly group and
//! conformance fingerprint. Availability (free now, or over a reservation window) is counted per class,
//! so a reservation holds concrete nodes in concrete groups of a concrete conformance group, while a
//! homogeneous machine (every SWF replay) is a single class and keeps EASY's count semantics exactly.
//!
//! [`pick`] turns per-class availability into a placement — how many nodes of each class — following the
//! solver of the scheduling-algorithm seed (step 2a): fewest dragonfly groups (a single group when one
//! suffices, best fit; adjacent groups for large jobs when that costs no extra group), then the largest
//! conformance group, then a power cap. `conformance_hard` (the sensitive policy) requires every node to
//! share one fingerprint.

use crate::ids::GroupId;
use crate::node::{ConformanceFingerprint, NodeCapabilities};
use std::collections::BTreeMap;

/// What every node of a class shares.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClassKey {
    pub pool: u32,
    pub capabilities: NodeCapabilities,
    pub group: GroupId,
    pub conformance: ConformanceFingerprint,
}

/// Per-class facts the picker needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassInfo {
    pub group: GroupId,
    pub conformance: ConformanceFingerprint,
    pub power_w: u32,
    pub gpus: u32,
}

/// Placement preferences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PickRules {
    /// All nodes must share one conformance fingerprint.
    pub conformance_hard: bool,
    /// At most this many watts for the whole placement.
    pub power_cap_w: Option<u64>,
}

/// The outcome of a pick: nodes per class, plus the shape of the placement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub picks: Vec<(u16, u32)>,
    pub groups: u32,
    /// Nodes in the placement's largest conformance group.
    pub largest_conformance: u32,
    pub power_w: u64,
}

/// Chooses `k` nodes among `avail` (`(class, available count)`, eligible classes only).
pub fn pick(info: &[ClassInfo], avail: &[(u16, u32)], k: u32, rules: PickRules) -> Option<Placement> {
    let mut out = Placement::default();
    pick_into(info, avail, k, rules, &mut out).then_some(out)
}

/// [`pick`] writing into `out` (reusing its buffer: the hot path of every pass).
pub fn pick_into(info: &[ClassInfo], avail: &[(u16, u32)], k: u32, rules: PickRules, out: &mut Placement) -> bool {
    out.picks.clear();
    if k == 0 {
        *out = Placement::default();
        return true;
    }
    // Fast path: one class (every homogeneous machine).
    if avail.len() == 1 {
        let (c, n) = avail[0];
        let power_w = k as u64 * info[c as usize].power_w as u64;
        if n < k || rules.power_cap_w.is_some_and(|cap| power_w > cap) {
            return false;
        }
        out.picks.push((c, k));
        out.groups = 1;
        out.largest_conformance = k;
        out.power_w = power_w;
        return true;
    }
    match pick_multi(info, avail, k, rules) {
        Some(p) => {
            *out = p;
            true
        }
        None => false,
    }
}

fn pick_multi(info: &[ClassInfo], avail: &[(u16, u32)], k: u32, rules: PickRules) -> Option<Placement> {
    let total: u64 = avail.iter().map(|a| a.1 as u64).sum();
    if total < k as u64 {
        return None;
    }
    let best = if rules.conformance_hard {
        let mut fps: Vec<ConformanceFingerprint> = avail.iter().map(|a| info[a.0 as usize].conformance).collect();
        fps.sort();
        fps.dedup();
        fps.into_iter()
            .filter_map(|fp| {
                let sub: Vec<(u16, u32)> = avail
                    .iter()
                    .copied()
                    .filter(|a| info[a.0 as usize].conformance == fp)
                    .collect();
                pick_groups(info, &sub, k)
            })
            // Fewest groups, then the most power-frugal, then the lowest fingerprint (deterministic).
            .min_by_key(|p| (p.groups, p.power_w))
    } else {
        pick_groups(info, avail, k)
    }?;
    rules.power_cap_w.is_none_or(|cap| best.power_w <= cap).then_some(best)
}

/// Fewest groups first, then the largest conformance group inside the chosen groups.
fn pick_groups(info: &[ClassInfo], avail: &[(u16, u32)], k: u32) -> Option<Placement> {
    let mut by_group: BTreeMap<GroupId, u64> = BTreeMap::new();
    for &(c, n) in avail {
        if n > 0 {
            *by_group.entry(info[c as usize].group).or_default() += n as u64;
        }
    }
    let total: u64 = by_group.values().sum();
    if total < k as u64 {
        return None;
    }
    let k64 = k as u64;
    // One group suffices: best fit (the smallest sufficient group; ties → lowest id). This also packs.
    let chosen: Vec<GroupId> = if let Some((&g, _)) = by_group
        .iter()
        .filter(|(_, n)| **n >= k64)
        .min_by_key(|(g, n)| (**n, **g))
    {
        vec![g]
    } else {
        // Minimal group count m: the largest groups first.
        let mut sizes: Vec<(GroupId, u64)> = by_group.iter().map(|(g, n)| (*g, *n)).collect();
        sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut acc = 0;
        let mut greedy = Vec::new();
        for (g, n) in &sizes {
            greedy.push(*g);
            acc += n;
            if acc >= k64 {
                break;
            }
        }
        let m = greedy.len();
        // Prefer m adjacent groups (consecutive ids) when such a window holds enough nodes.
        adjacent_window(&by_group, m, k64).unwrap_or(greedy)
    };
    // Inside the chosen groups: fill from the largest conformance group first.
    let in_chosen: Vec<(u16, u32)> = avail
        .iter()
        .copied()
        .filter(|a| a.1 > 0 && chosen.contains(&info[a.0 as usize].group))
        .collect();
    let mut by_fp: BTreeMap<ConformanceFingerprint, u64> = BTreeMap::new();
    for &(c, n) in &in_chosen {
        *by_fp.entry(info[c as usize].conformance).or_default() += n as u64;
    }
    let mut fp_order: Vec<(ConformanceFingerprint, u64)> = by_fp.into_iter().collect();
    fp_order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut need = k;
    let mut picks: Vec<(u16, u32)> = Vec::new();
    let mut largest = 0;
    for (fp, _) in &fp_order {
        let mut from_fp = 0;
        for &(c, n) in in_chosen.iter().filter(|a| info[a.0 as usize].conformance == *fp) {
            if need == 0 {
                break;
            }
            let take = n.min(need);
            picks.push((c, take));
            need -= take;
            from_fp += take;
        }
        largest = largest.max(from_fp);
        if need == 0 {
            break;
        }
    }
    debug_assert_eq!(need, 0);
    let mut groups: Vec<GroupId> = picks.iter().map(|p| info[p.0 as usize].group).collect();
    groups.sort();
    groups.dedup();
    let power_w = picks
        .iter()
        .map(|&(c, n)| n as u64 * info[c as usize].power_w as u64)
        .sum();
    Some(Placement {
        picks,
        groups: groups.len() as u32,
        largest_conformance: largest,
        power_w,
    })
}

/// The best-fitting window of `m` consecutive group ids holding at least `k` nodes.
fn adjacent_window(by_group: &BTreeMap<GroupId, u64>, m: usize, k: u64) -> Option<Vec<GroupId>> {
    if m <= 1 {
        return None;
    }
    let ids: Vec<GroupId> = by_group.keys().copied().collect();
    let mut best: Option<(u64, usize)> = None;
    for start in 0..ids.len().saturating_sub(m - 1) {
        let window = &ids[start..start + m];
        // Consecutive ids only.
        if window.windows(2).any(|w| w[1].0 != w[0].0 + 1) {
            continue;
        }
        let sum: u64 = window.iter().map(|g| by_group[g]).sum();
        if sum >= k && best.is_none_or(|(s, _)| sum < s) {
            best = Some((sum, start));
        }
    }
    best.map(|(_, s)| ids[s..s + m].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(groups: &[(u32, u64)]) -> Vec<ClassInfo> {
        groups
            .iter()
            .map(|&(g, fp)| ClassInfo {
                group: GroupId(g),
                conformance: ConformanceFingerprint(fp),
                power_w: 500,
                gpus: 4,
            })
            .collect()
    }

    #[test]
    fn single_group_best_fit() {
        // classes 0..3 in groups 0..3 with 8, 5, 6, 3 free.
        let i = info(&[(0, 1), (1, 1), (2, 1), (3, 1)]);
        let p = pick(&i, &[(0, 8), (1, 5), (2, 6), (3, 3)], 5, PickRules::default()).unwrap();
        assert_eq!(p.picks, vec![(1, 5)]);
        assert_eq!((p.groups, p.largest_conformance, p.power_w), (1, 5, 2500));
    }

    #[test]
    fn fewest_groups_then_adjacent() {
        // Groups 0..4 with 4, 3, 3, 4, 1 free; 7 nodes need two groups. Largest-first greedy would take
        // groups 0 and 3; the adjacent windows (0,1) = 7 and (2,3) = 7 also need two: prefer adjacency.
        let i = info(&[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]);
        let p = pick(&i, &[(0, 4), (1, 3), (2, 3), (3, 4), (4, 1)], 7, PickRules::default()).unwrap();
        assert_eq!(p.groups, 2);
        let mut gs: Vec<u32> = p.picks.iter().map(|x| i[x.0 as usize].group.0).collect();
        gs.sort();
        assert_eq!(gs, vec![0, 1]);
        // 11 nodes: no adjacent pair suffices, minimal is 3 groups.
        let p = pick(&i, &[(0, 4), (1, 3), (2, 3), (3, 4), (4, 1)], 11, PickRules::default()).unwrap();
        assert_eq!(p.groups, 3);
    }

    #[test]
    fn prefers_the_largest_conformance_group() {
        // One group, two fingerprints: 3 nodes of fp 1, 5 of fp 2. A 4-node job takes fp 2 only.
        let i = info(&[(0, 1), (0, 2)]);
        let p = pick(&i, &[(0, 3), (1, 5)], 4, PickRules::default()).unwrap();
        assert_eq!(p.picks, vec![(1, 4)]);
        assert_eq!(p.largest_conformance, 4);
        // 7 nodes must mix: 5 + 2.
        let p = pick(&i, &[(0, 3), (1, 5)], 7, PickRules::default()).unwrap();
        assert_eq!(p.largest_conformance, 5);
    }

    #[test]
    fn hard_conformance_and_power_cap() {
        let i = info(&[(0, 1), (0, 2), (1, 1)]);
        let hard = PickRules {
            conformance_hard: true,
            ..Default::default()
        };
        // fp 1 has 3 + 2 = 5 across two groups, fp 2 has 4: a 5-node job must use fp 1 (two groups).
        let p = pick(&i, &[(0, 3), (1, 4), (2, 2)], 5, hard).unwrap();
        assert!(
            p.picks
                .iter()
                .all(|x| i[x.0 as usize].conformance == ConformanceFingerprint(1))
        );
        assert_eq!(p.largest_conformance, 5);
        assert!(pick(&i, &[(0, 3), (1, 4), (2, 2)], 6, hard).is_none());
        let capped = PickRules {
            power_cap_w: Some(1999),
            ..Default::default()
        };
        assert!(
            pick(&i, &[(0, 3), (1, 4), (2, 2)], 4, capped).is_none(),
            "4 × 500 W > 1999 W"
        );
        assert!(pick(&i, &[(0, 3), (1, 4), (2, 2)], 3, capped).is_some());
    }

    use proptest::prelude::*;

    fn minimal_groups(info: &[ClassInfo], avail: &[(u16, u32)], k: u32) -> u32 {
        let mut by: BTreeMap<GroupId, u64> = BTreeMap::new();
        for &(c, n) in avail {
            *by.entry(info[c as usize].group).or_default() += n as u64;
        }
        let mut v: Vec<u64> = by.into_values().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let mut acc = 0;
        for (i, n) in v.iter().enumerate() {
            acc += n;
            if acc >= k as u64 {
                return i as u32 + 1;
            }
        }
        u32::MAX
    }

    proptest! {
        /// Every placement takes exactly k nodes, never more than a class has, only offered classes,
        /// spans the minimal number of groups, uses the largest conformance group available in its
        /// groups, respects the power cap, and under hard conformance uses one fingerprint.
        #[test]
        fn placements_are_valid(
            classes in prop::collection::vec((0u32..6, 0u64..3, 0u32..8, 100u32..900), 1..10),
            k in 1u32..20, hard in any::<bool>(), cap in proptest::option::of(500u64..20_000),
        ) {
            let info: Vec<ClassInfo> = classes.iter().map(|&(g, fp, _, w)| ClassInfo {
                group: GroupId(g), conformance: ConformanceFingerprint(fp), power_w: w, gpus: 4,
            }).collect();
            let avail: Vec<(u16, u32)> = classes.iter().enumerate().map(|(i, c)| (i as u16, c.2)).collect();
            let rules = PickRules { conformance_hard: hard, power_cap_w: cap };
            let total: u32 = avail.iter().map(|a| a.1).sum();
            match pick(&info, &avail, k, rules) {
                None => {
                    // Refused only when it cannot be done without breaking a rule.
                    let soft = pick(&info, &avail, k, PickRules::default());
                    prop_assert!(total < k || hard || cap.is_some(), "refused although {total} >= {k}");
                    if !hard && cap.is_none() { prop_assert!(soft.is_none()); }
                }
                Some(p) => {
                    prop_assert_eq!(p.picks.iter().map(|x| x.1).sum::<u32>(), k);
                    for &(c, n) in &p.picks {
                        prop_assert!(n <= avail[c as usize].1);
                    }
                    if !hard {
                        prop_assert_eq!(p.groups, minimal_groups(&info, &avail, k));
                        // Largest conformance group within the chosen groups.
                        let chosen: Vec<GroupId> = p.picks.iter().map(|x| info[x.0 as usize].group).collect();
                        let mut best = 0u64;
                        for fp in 0..3u64 {
                            let n: u64 = avail.iter()
                                .filter(|a| chosen.contains(&info[a.0 as usize].group) && info[a.0 as usize].conformance.0 == fp)
                                .map(|a| a.1 as u64).sum();
                            best = best.max(n);
                        }
                        prop_assert_eq!(p.largest_conformance as u64, best.min(k as u64));
                    } else {
                        let fp = info[p.picks[0].0 as usize].conformance;
                        prop_assert!(p.picks.iter().all(|x| info[x.0 as usize].conformance == fp));
                    }
                    if let Some(cap) = cap { prop_assert!(p.power_w <= cap); }
                    let pw: u64 = p.picks.iter().map(|&(c, n)| n as u64 * info[c as usize].power_w as u64).sum();
                    prop_assert_eq!(pw, p.power_w);
                }
            }
        }
    }
}
