//! Elastic resource sharing: idle vClusters lend nodes (up to their lend cap), borrowers carry the
//! preemption risk, and the home vCluster reclaims them (book: scheduling chapter, "Elastic Resource
//! Sharing"; the integration table's "Elastic borrowing" row).

mod common;
use common::*;
use lattice_engine::{
    CheckpointKind, CheckpointSpec, CostWeights, Policy, PreemptionClass, VClusterConfig, VClusterId,
};
use lattice_sim::{SimConfig, SimResult, simulate};

const H: u64 = 3600;

/// 8 nodes, vClusters `a` and `b` with 4 home nodes each, both scored.
fn two_vcluster_site() -> (lattice_traces::Inventory, SimConfig) {
    let mut inv = nodes(8);
    inv.vclusters.intern("a");
    inv.vclusters.intern("b");
    for (i, n) in inv.nodes.iter_mut().enumerate() {
        n.home_vcluster = Some(VClusterId((i / 4) as u32));
    }
    let mut c = VClusterConfig::new(Policy::EASY);
    c.weights = Some(CostWeights::default());
    let cfg = SimConfig {
        vclusters: [("a".to_string(), c), ("b".to_string(), c)].into(),
        check_invariants: true,
        ..SimConfig::default()
    };
    (inv, cfg)
}

/// vClusters `a` and `b`, 4 home nodes each, both scored.
fn two_vclusters(jobs: Vec<(lattice_traces::TraceJob, u32)>) -> SimResult {
    let (inv, cfg) = two_vcluster_site();
    let mut w = workload(
        jobs.iter()
            .map(|(j, vc)| {
                let mut j = j.clone();
                j.spec_mut().vcluster = VClusterId(*vc);
                j
            })
            .collect(),
    );
    w.vclusters = lattice_engine::Registry::default();
    w.vclusters.intern("a");
    w.vclusters.intern("b");
    // Streamed records give the same borrowed node-hours and per-vCluster metrics.
    replay_streamed_and_kept(&w, &inv, &cfg)
}

fn ckpt(mut j: lattice_traces::TraceJob, minutes: f64) -> lattice_traces::TraceJob {
    j.spec_mut().checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: Some(minutes),
        mechanism: Default::default(),
    };
    j
}

fn rec<'a>(r: &'a SimResult, id: &str) -> &'a lattice_sim::JobRecord {
    r.jobs.iter().find(|j| j.id == id).unwrap()
}

/// `a` is full (A1 on its 4 nodes) and queues A2 (2 nodes); `b` is idle and lends up to 50 % (2 nodes):
/// A2 starts at once on `b`'s nodes. A3 (3 nodes) would exceed the lend cap and waits for `a`'s nodes.
#[test]
fn idle_vcluster_lends_up_to_its_cap() {
    let r = two_vclusters(vec![
        (job("A1", 0, 4, 10 * H, 10 * H), 0),
        (ckpt(job("A2", 1, 2, H, H), 1.0), 0),
        (ckpt(job("A3", 2, 3, H, H), 1.0), 0),
    ]);
    assert_eq!(start_of(&r, "A2"), 1.0);
    assert_eq!(rec(&r, "A2").borrowed, 2);
    assert_eq!(start_of(&r, "A3"), (10 * H) as f64);
    assert_eq!(rec(&r, "A3").borrowed, 0);
    assert!((r.summary.borrowed_node_hours - 2.0).abs() < 1e-9);
}

/// Reclaim: `b` needs its nodes back while A2 borrows two of them. B1 (4 nodes) arrives at 10 min: A2 is
/// preempted with reason `reclaim`, keeps them for the 60 s return grace, checkpoints for 1 min, and B1
/// starts on its home nodes at 10 min + 2 min. A2 resumes later on `a`'s own nodes.
#[test]
fn home_vcluster_reclaims_lent_nodes() {
    let r = two_vclusters(vec![
        (job("A1", 0, 4, 10 * H, 10 * H), 0),
        (ckpt(job("A2", 1, 2, 5 * H, 5 * H), 1.0), 0),
        (job("B1", 600, 4, H, H), 1),
    ]);
    assert_eq!(start_of(&r, "B1"), 720.0);
    assert_eq!(rec(&r, "B1").borrowed, 0, "reclaim returns nodes to the home vCluster");
    assert_eq!(r.summary.preemptions_by_reason.get("reclaim"), Some(&1));
    let a2 = rec(&r, "A2");
    assert_eq!((a2.preempted, a2.state), (1, "completed"));
    // The timeline shows A2 starting on 2 borrowed nodes and the reclaim preemption at B1's arrival.
    let kinds: Vec<(f64, lattice_sim::TimelineKind)> = r.timeline.events.iter().map(|e| (e.time_s, e.kind)).collect();
    assert_eq!(kinds[0], (1.0, lattice_sim::TimelineKind::Borrow(2)));
    assert!(
        kinds.contains(&(600.0, lattice_sim::TimelineKind::Preemption("reclaim"))),
        "{kinds:?}"
    );
}

/// Non-preemptible allocations (checkpoint none, class ≥ 7) are never placed on borrowed nodes.
#[test]
fn non_preemptible_allocations_do_not_borrow() {
    let mut a2 = job("A2", 1, 2, H, H);
    a2.spec_mut().preemption_class = PreemptionClass::new(8).unwrap();
    // A1 is non-preemptible too, so A2 cannot take its nodes either.
    let mut a1 = job("A1", 0, 4, 10 * H, 10 * H);
    a1.spec_mut().preemption_class = PreemptionClass::new(7).unwrap();
    let r = two_vclusters(vec![(a1, 0), (a2, 0)]);
    assert_eq!(start_of(&r, "A2"), (10 * H) as f64);
    assert_eq!(rec(&r, "A2").borrowed, 0);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Random two-vCluster workloads with borrowing, reclaim and priority preemption: every invariant
        /// holds at every event (ownership, quotas, reservations), no preemption moves up, and every
        /// allocation finishes.
        #[test]
        fn borrowing_and_reclaim_keep_invariants(
            jobs in prop::collection::vec((0u64..900, 1u32..5, 60u64..3000, 30u64..3000, 0u8..9, 0u32..2, proptest::option::of(0.5f64..12.0)), 1..30),
        ) {
            let mut t = 0;
            let trace: Vec<(lattice_traces::TraceJob, u32)> = jobs.iter().enumerate().map(|(i, &(gap, k, req, run, class, vc, ck))| {
                t += gap;
                let mut j = job(&format!("j{i}"), t, k, req, run);
                j.spec_mut().preemption_class = PreemptionClass::new(class).unwrap();
                if let Some(m) = ck { j = ckpt(j, m); }
                (j, vc)
            }).collect();
            let r = two_vclusters(trace);
            prop_assert_eq!(r.summary.unfinished, 0);
            // Suspended time is not node-time: the machine is never more than fully used.
            prop_assert!(r.summary.utilization <= 1.0 + 1e-9, "utilization {}", r.summary.utilization);
            // The timeline agrees with the records: runs never share a node at the same time, every
            // allocation's last run ends when it ended, and every preemption is logged.
            let runs = &r.timeline.runs;
            for (i, a) in runs.iter().enumerate() {
                let a_end = a.end_s.unwrap_or(f64::INFINITY);
                prop_assert!(a.start_s <= a_end);
                for b in &runs[i + 1..] {
                    let b_end = b.end_s.unwrap_or(f64::INFINITY);
                    let overlap_t = a.start_s < b_end && b.start_s < a_end;
                    let overlap_n = a.nodes.iter().any(|x| b.nodes.iter().any(|y| x.0 <= y.1 && y.0 <= x.1));
                    prop_assert!(!(overlap_t && overlap_n), "runs {:?} and {:?} share a node", a, b);
                }
            }
            for (k, j) in r.jobs.iter().enumerate() {
                let last = runs.iter().rev().find(|s| s.job as usize == k).map(|s| s.end_s);
                prop_assert_eq!(last.flatten(), j.end_s, "{}", j.id);
            }
            let logged = r.timeline.events.iter().filter(|e| matches!(e.kind, lattice_sim::TimelineKind::Preemption(_))).count();
            prop_assert_eq!(logged as u64, r.summary.preemptions);
        }
    }
}

/// A trace that numbers its vClusters otherwise than the inventory (`b` first) replays alike with
/// its ids aligned to the engine's: the same records, names kept, and jobs that shared one request
/// share its renumbered one.
#[test]
fn aligning_a_traces_vcluster_ids_changes_no_result() {
    let (inv, cfg) = two_vcluster_site();
    let shared = std::sync::Arc::new({
        let mut s = job("x", 0, 3, 2 * H, H).spec.as_ref().clone();
        s.vcluster = VClusterId(0); // `b` in the trace's numbering
        s
    });
    let mut jobs = Vec::new();
    for i in 0..6u64 {
        let mut j = job(&format!("j{i}"), i * 600, 2 + (i % 3) as u32, 2 * H, H);
        if i % 2 == 0 {
            j.spec = shared.clone();
        } else {
            j.spec_mut().vcluster = VClusterId(1); // `a`
        }
        jobs.push(j);
    }
    drop(shared);
    let mut w = workload(jobs);
    w.vclusters = lattice_engine::Registry::default();
    w.vclusters.intern("b");
    w.vclusters.intern("a");
    let before = simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap();
    let mut aligned = w.clone();
    assert!(lattice_sim::align_ids(&mut aligned, &inv));
    assert!(
        !lattice_sim::align_ids(&mut aligned.clone(), &inv),
        "aligned once is aligned"
    );
    assert_eq!(aligned.vclusters.names(), ["a", "b"]);
    assert!(std::sync::Arc::ptr_eq(&aligned.jobs[0].spec, &aligned.jobs[2].spec));
    assert_eq!(aligned.jobs[0].spec.vcluster, VClusterId(1));
    assert_eq!(aligned.jobs[1].spec.vcluster, VClusterId(0));
    let after = simulate(&aligned, &inv, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(before.jobs, after.jobs);
    assert!(before.jobs.iter().any(|j| &*j.vcluster == "b") && before.jobs.iter().any(|j| &*j.vcluster == "a"));
}
