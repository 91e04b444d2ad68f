//! The availability profile: how many nodes of each node class are free over future time.
//!
//! A step function over breakpoints `times[0] = now < times[1] < ...`; segment `i` covers
//! `[times[i], times[i+1])` and the last segment extends forever. Running allocations add their nodes back
//! at their estimated end (start + requested walltime); reservations and backfilled starts subtract.
//! Counting per *class* (nodes with identical capabilities) keeps EASY's count semantics exact on
//! homogeneous machines while honouring constraints on heterogeneous ones.

use crate::classes::{ClassInfo, PickRules, Placement, pick_into};
use crate::time::{Duration, Time};

/// Nodes taken per class: `(class, count)`.
pub type Picks = Vec<(u16, u32)>;

#[derive(Clone, Debug)]
pub struct Profile {
    classes: usize,
    times: Vec<Time>,
    /// Row-major: `free[i * classes + c]`.
    free: Vec<i64>,
}

impl Profile {
    /// A profile starting at `now` with `free_now[c]` nodes of class `c` free.
    pub fn new(now: Time, free_now: &[u32]) -> Profile {
        Profile {
            classes: free_now.len(),
            times: vec![now],
            free: free_now.iter().map(|&x| x as i64).collect(),
        }
    }

    pub fn now(&self) -> Time {
        self.times[0]
    }

    pub fn segments(&self) -> usize {
        self.times.len()
    }

    pub fn time_of(&self, seg: usize) -> Time {
        self.times[seg]
    }

    pub fn free_at_segment(&self, seg: usize, class: u16) -> i64 {
        self.free[seg * self.classes + class as usize]
    }

    /// Free nodes of every class right now.
    pub fn free_total_now(&self) -> i64 {
        self.free[..self.classes].iter().sum()
    }

    /// Nodes come back at `t` (a running allocation's estimated end). `t` is clamped to after `now`:
    /// nodes that are busy now cannot be free now.
    pub fn add_release(&mut self, t: Time, counts: &[(u16, u32)]) {
        let t = t.max(Time(self.times[0].0 + 1));
        let last = *self.times.last().expect("profile has a first segment");
        let from = if t > last {
            let start = (self.times.len() - 1) * self.classes;
            self.times.push(t);
            self.free.extend_from_within(start..start + self.classes);
            self.times.len() - 1
        } else {
            self.breakpoint(t)
        };
        for i in from..self.times.len() {
            for &(c, n) in counts {
                self.free[i * self.classes + c as usize] += n as i64;
            }
        }
    }

    fn row(&self, i: usize) -> &[i64] {
        &self.free[i * self.classes..(i + 1) * self.classes]
    }

    /// Index of the segment that starts at `t`, splitting the segment containing `t` if needed.
    fn breakpoint(&mut self, t: Time) -> usize {
        match self.times.binary_search(&t) {
            Ok(i) => i,
            Err(i) => {
                debug_assert!(i > 0, "breakpoint before the profile start");
                let row = self.row(i - 1).to_vec();
                self.times.insert(i, t);
                let at = i * self.classes;
                self.free.splice(at..at, row);
                i
            }
        }
    }

    /// Can `k` nodes from the `eligible` classes be held from segment `seg`'s start for `walltime`
    /// (`None` = forever)? On success `out` holds the placement chosen by [`pick`] over each class's
    /// minimum availability in the window. On failure returns the first segment worth trying next.
    #[allow(clippy::too_many_arguments)]
    pub fn fit(
        &self,
        seg: usize,
        walltime: Option<Duration>,
        eligible: &[u16],
        k: u32,
        info: &[ClassInfo],
        rules: PickRules,
        out: &mut Placement,
    ) -> Result<(), usize> {
        let start = self.times[seg];
        let end = walltime.map_or(Time::MAX, |w| start + w);
        if let [c] = eligible {
            // One eligible class: no buffers.
            let mut min = i64::MAX;
            let mut i = seg;
            while i < self.times.len() && (i == seg || self.times[i] < end) {
                let f = self.free[i * self.classes + *c as usize];
                if f < k as i64 {
                    return Err(i + 1);
                }
                min = min.min(f);
                i += 1;
            }
            return if pick_into(info, &[(*c, min.max(0) as u32)], k, rules, out) {
                Ok(())
            } else {
                Err(seg + 1)
            };
        }
        let mut mins: Picks = eligible.iter().map(|&c| (c, u32::MAX)).collect();
        let mut i = seg;
        while i < self.times.len() && (i == seg || self.times[i] < end) {
            let row = self.row(i);
            let mut total = 0i64;
            for p in mins.iter_mut() {
                let f = row[p.0 as usize].max(0);
                total += f;
                p.1 = p.1.min(f as u32);
            }
            if total < k as i64 {
                // Every window containing segment i fails.
                return Err(i + 1);
            }
            i += 1;
        }
        if pick_into(info, &mins, k, rules, out) {
            Ok(())
        } else {
            Err(seg + 1)
        }
    }

    /// The earliest breakpoint at which `k` eligible nodes are free for `walltime`, with the placement.
    pub fn earliest(
        &self,
        walltime: Option<Duration>,
        eligible: &[u16],
        k: u32,
        info: &[ClassInfo],
        rules: PickRules,
        out: &mut Placement,
    ) -> Option<Time> {
        let mut seg = 0;
        while seg < self.times.len() {
            match self.fit(seg, walltime, eligible, k, info, rules, out) {
                Ok(()) => return Some(self.times[seg]),
                Err(next) => seg = next,
            }
        }
        None
    }

    /// Takes `picks` out of the profile over `[start, start + walltime)`. A zero walltime still holds its
    /// nodes at the instant it starts (its completion comes before the next pass), so it takes 1 ms.
    pub fn reserve(&mut self, start: Time, walltime: Option<Duration>, picks: &[(u16, u32)]) {
        let from = self.breakpoint(start);
        let to = match walltime {
            Some(w) => self.breakpoint(start + w.max(Duration(1))),
            None => self.times.len(),
        };
        for i in from..to {
            for &(c, n) in picks {
                let f = &mut self.free[i * self.classes + c as usize];
                *f -= n as i64;
                debug_assert!(*f >= 0, "profile overcommitted");
            }
        }
    }
}

/// Windows already known not to fit now during one pass, per eligible class set and conformance rule.
///
/// Within a pass the profile only loses capacity (starts and reservations subtract), and without a power
/// cap a fit that fails for `k` nodes over `w` also fails for more nodes or a longer window from the same
/// start. So a job whose request dominates a known failure is refused without walking the profile.
/// (Under a power cap the picker may choose differently for more nodes, so failures are not kept then.)
#[derive(Debug, Default)]
pub struct FitMemo {
    sets: Vec<(Vec<u16>, bool, Frontier)>,
}

/// Failed `(nodes, window ms)` requests, none implied by another.
type Frontier = Vec<(u32, u64)>;

impl FitMemo {
    fn key(walltime: Option<Duration>) -> u64 {
        walltime.map_or(u64::MAX, |w| w.as_millis())
    }

    /// Is a fit of `k` nodes for `walltime` now on `eligible` known to fail?
    pub fn known_to_fail(&self, eligible: &[u16], rules: PickRules, k: u32, walltime: Option<Duration>) -> bool {
        if rules.power_cap_w.is_some() {
            return false;
        }
        let w = Self::key(walltime);
        self.sets
            .iter()
            .find(|s| s.1 == rules.conformance_hard && s.0 == eligible)
            .is_some_and(|s| s.2.iter().any(|&(fk, fw)| fk <= k && fw <= w))
    }

    /// Records that `k` nodes for `walltime` did not fit now on `eligible`.
    pub fn record_failure(&mut self, eligible: &[u16], rules: PickRules, k: u32, walltime: Option<Duration>) {
        if rules.power_cap_w.is_some() {
            return;
        }
        let w = Self::key(walltime);
        let i = match self
            .sets
            .iter()
            .position(|s| s.1 == rules.conformance_hard && s.0 == eligible)
        {
            Some(i) => i,
            None => {
                self.sets.push((eligible.to_vec(), rules.conformance_hard, Vec::new()));
                self.sets.len() - 1
            }
        };
        let frontier = &mut self.sets[i].2;
        // Keep only the failures this one does not imply.
        frontier.retain(|&(fk, fw)| !(fk >= k && fw >= w));
        frontier.push((k, w));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::GroupId;
    use crate::node::ConformanceFingerprint;

    fn d(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    fn info(n: usize) -> Vec<ClassInfo> {
        (0..n)
            .map(|g| ClassInfo {
                group: GroupId(g as u32),
                conformance: ConformanceFingerprint(0),
                power_w: 0,
                gpus: 0,
            })
            .collect()
    }

    fn earliest(p: &Profile, w: Option<Duration>, eligible: &[u16], k: u32, out: &mut Placement) -> Option<Time> {
        p.earliest(w, eligible, k, &info(4), PickRules::default(), out)
    }

    fn fits(p: &Profile, w: Option<Duration>, eligible: &[u16], k: u32, out: &mut Placement) -> bool {
        p.fit(0, w, eligible, k, &info(4), PickRules::default(), out).is_ok()
    }

    #[test]
    fn earliest_start_waits_for_releases() {
        // 10 nodes: 2 free now, 3 back at t=10s, 5 back at t=20s.
        let mut p = Profile::new(Time::ZERO, &[2]);
        p.add_release(Time::from_secs(10), &[(0, 3)]);
        p.add_release(Time::from_secs(20), &[(0, 5)]);
        let mut out = Placement::default();
        assert_eq!(earliest(&p, d(100), &[0], 2, &mut out), Some(Time::ZERO));
        assert_eq!(earliest(&p, d(100), &[0], 5, &mut out), Some(Time::from_secs(10)));
        assert_eq!(earliest(&p, d(100), &[0], 10, &mut out), Some(Time::from_secs(20)));
        assert_eq!(out.picks, vec![(0, 10)]);
        assert_eq!(earliest(&p, d(100), &[0], 11, &mut out), None);
    }

    #[test]
    fn reservation_blocks_overlapping_windows_only() {
        let mut p = Profile::new(Time::ZERO, &[4]);
        let mut out = Placement::default();
        // Reserve all 4 nodes over [10, 20).
        p.reserve(Time::from_secs(10), d(10), &[(0, 4)]);
        // A 1-node job of 10 s fits now (ends exactly at the reservation), one of 11 s does not.
        assert!(fits(&p, d(10), &[0], 1, &mut out));
        assert!(!fits(&p, d(11), &[0], 1, &mut out));
        assert_eq!(earliest(&p, d(11), &[0], 1, &mut out), Some(Time::from_secs(20)));
        // An unbounded job can never start before the reservation ends.
        assert_eq!(earliest(&p, None, &[0], 1, &mut out), Some(Time::from_secs(20)));
    }

    #[test]
    fn zero_length_windows_still_take_their_instant() {
        let mut p = Profile::new(Time::ZERO, &[1]);
        let mut out = Placement::default();
        assert!(fits(&p, d(0), &[0], 1, &mut out));
        p.reserve(Time::ZERO, d(0), &out.picks);
        assert!(!fits(&p, d(5), &[0], 1, &mut out));
        assert_eq!(earliest(&p, d(5), &[0], 1, &mut out), Some(Time(1)));
    }

    #[test]
    fn classes_are_counted_separately_and_groups_are_concrete() {
        // class 0 (group 0): 2 free, class 1 (group 1): 3 free.
        let p = Profile::new(Time::ZERO, &[2, 3]);
        let mut out = Placement::default();
        assert!(fits(&p, d(5), &[1], 3, &mut out));
        assert_eq!(out.picks, vec![(1, 3)]);
        assert!(!fits(&p, d(5), &[0], 3, &mut out));
        assert!(fits(&p, d(5), &[0, 1], 4, &mut out));
        assert_eq!(out.groups, 2);
        // 2 nodes fit in one group: best fit takes group 0 (2 free) and leaves group 1 whole.
        assert!(fits(&p, d(5), &[0, 1], 2, &mut out));
        assert_eq!(out.picks, vec![(0, 2)]);
    }

    #[test]
    fn release_before_last_breakpoint_is_inserted() {
        let mut p = Profile::new(Time::ZERO, &[0]);
        p.add_release(Time::from_secs(20), &[(0, 1)]);
        p.add_release(Time::from_secs(10), &[(0, 1)]);
        assert_eq!(p.segments(), 3);
        assert_eq!(p.free_at_segment(1, 0), 1);
        assert_eq!(p.free_at_segment(2, 0), 2);
    }

    #[test]
    fn fit_memo_refuses_only_dominating_requests() {
        let mut m = FitMemo::default();
        let r = PickRules::default();
        m.record_failure(&[0, 1], r, 4, d(100));
        assert!(m.known_to_fail(&[0, 1], r, 4, d(100)));
        assert!(m.known_to_fail(&[0, 1], r, 5, d(200)));
        assert!(m.known_to_fail(&[0, 1], r, 4, None));
        assert!(!m.known_to_fail(&[0, 1], r, 3, d(100)));
        assert!(!m.known_to_fail(&[0, 1], r, 8, d(50)));
        assert!(!m.known_to_fail(&[1], r, 8, d(500)));
        let hard = PickRules {
            conformance_hard: true,
            ..r
        };
        assert!(!m.known_to_fail(&[0, 1], hard, 8, d(500)));
        // A smaller failure replaces the ones it implies.
        m.record_failure(&[0, 1], r, 2, d(50));
        assert!(m.known_to_fail(&[0, 1], r, 3, d(60)));
        assert_eq!(m.sets[0].2, vec![(2, 50_000)]);
        // Under a power cap nothing is known or kept.
        let capped = PickRules {
            power_cap_w: Some(1000),
            ..r
        };
        assert!(!m.known_to_fail(&[0, 1], capped, 8, d(500)));
        m.record_failure(&[7], capped, 1, d(1));
        assert_eq!(m.sets.len(), 1);
    }

    /// The earliest start tried at every breakpoint in turn, each window's availability its
    /// per-class minimum — no skipping: what [`Profile::earliest`]'s skips must reproduce.
    fn earliest_by_trying_every_start(
        p: &Profile,
        w: Option<Duration>,
        eligible: &[u16],
        k: u32,
        info: &[ClassInfo],
        rules: PickRules,
    ) -> Option<(Time, Picks)> {
        (0..p.segments()).find_map(|seg| {
            let start = p.time_of(seg);
            let end = w.map_or(Time::MAX, |w| start + w);
            let window: Vec<usize> = (seg..p.segments())
                .filter(|&i| i == seg || p.time_of(i) < end)
                .collect();
            let mins: Picks = eligible
                .iter()
                .map(|&c| {
                    let m = window
                        .iter()
                        .map(|&i| p.free_at_segment(i, c).max(0))
                        .min()
                        .unwrap_or(0);
                    (c, m as u32)
                })
                .collect();
            let mut out = Placement::default();
            pick_into(info, &mins, k, rules, &mut out).then_some((start, out.picks))
        })
    }

    proptest::proptest! {
        /// On generated profiles of up to 6 classes in 3 groups and 2 fingerprints, with releases and
        /// reservations at random times, the earliest start and its placement are those of trying
        /// every breakpoint — with and without the hard conformance rule and a power cap.
        #[test]
        fn earliest_start_is_the_first_start_that_fits(
            free in proptest::collection::vec(0u32..6, 1..7),
            releases in proptest::collection::vec((1u64..400, 0usize..6, 1u32..5), 0..25),
            reservations in proptest::collection::vec((0u64..400, 1u64..200, 0usize..6, 1u32..4), 0..8),
            w in proptest::option::weighted(0.9, 1u64..300),
            k in 1u32..16,
            subset in 1u8..64,
            hard: bool,
            cap in proptest::option::weighted(0.2, 100u64..3000),
        ) {
            let classes = free.len();
            let info: Vec<ClassInfo> = (0..classes)
                .map(|c| ClassInfo {
                    group: GroupId((c % 3) as u32),
                    conformance: ConformanceFingerprint((c / 3) as u64),
                    power_w: 100 + 50 * c as u32,
                    gpus: 0,
                })
                .collect();
            let mut p = Profile::new(Time::ZERO, &free);
            for &(t, c, n) in &releases {
                p.add_release(Time::from_secs(t), &[((c % classes) as u16, n)]);
            }
            for &(t, len, c, n) in &reservations {
                // Only what is free over the whole window is reserved (as a pass does).
                let c = (c % classes) as u16;
                let start = Time::from_secs(t);
                let mut probe = p.clone();
                let seg = probe.breakpoint(start);
                let mut out = Placement::default();
                if probe.fit(seg, d(len), &[c], n, &info, PickRules::default(), &mut out).is_ok() {
                    p = probe;
                    p.reserve(start, d(len), &[(c, n)]);
                }
            }
            let eligible: Vec<u16> = (0..classes as u16).filter(|c| subset & (1 << c) != 0).collect();
            proptest::prop_assume!(!eligible.is_empty());
            let rules = PickRules { conformance_hard: hard, power_cap_w: cap };
            let walltime = w.map(Duration::from_secs);
            let mut out = Placement::default();
            let got = p.earliest(walltime, &eligible, k, &info, rules, &mut out).map(|t| (t, out.picks.clone()));
            proptest::prop_assert_eq!(got, earliest_by_trying_every_start(&p, walltime, &eligible, k, &info, rules));
        }
    }
}
