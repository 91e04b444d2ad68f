//! Each weight moves the outcome in the direction of the tuning guide's "Weight Impact Matrix", on small
//! traces worked out by hand.

mod common;
use common::*;
use lattice_engine::{CostWeights, Policy, PreemptionClass, Time, TopologyHint};
use lattice_sim::simulate;

/// Raising w4 lowers the mean group span. 2 groups × 4 nodes. A (3 nodes, 100 s) takes group 0 (best
/// fit, lowest id), B (3 nodes) group 1; C (2 nodes, 50 s) then only finds one free node per group.
/// - w4 = 0: C starts at once across both groups: spans 1, 1, 2 (mean 4/3).
/// - w4 = 0.9, w2 = 0.05: C's score would gain 0.9 · (2 − 1)/2 = 0.45 from a one-group placement, far
///   more than its wait term 0.05 · ln(1 + wait/1 h); it waits until A ends (t=100) and starts in
///   group 0: spans 1, 1, 1.
#[test]
fn raising_w4_lowers_group_span() {
    let w = workload(vec![
        job("A", 0, 3, 100, 100),
        job("B", 1, 3, 100, 100),
        job("C", 2, 2, 50, 50),
    ]);
    let inv = grouped(2, 4, 1);
    let run_with = |topology: f64| {
        let cfg = weighted(
            Policy::EASY,
            CostWeights {
                topology,
                wait_time: 0.05,
                ..zero_weights()
            },
        );
        simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap()
    };
    let low = run_with(0.0);
    let high = run_with(0.9);
    assert_eq!(low.jobs[2].groups, Some(2));
    assert_eq!(start_of(&low, "C"), 2.0);
    assert_eq!(high.jobs[2].groups, Some(1));
    assert_eq!(start_of(&high, "C"), 100.0);
    assert!(high.summary.mean_group_span < low.summary.mean_group_span);
    assert_eq!(high.summary.deferred_for_topology, 1);
    // The price: C waits (the matrix's "increases wait").
    assert!(high.summary.mean_wait_s > low.summary.mean_wait_s);
}

/// The topology hint: with the same high w4 as above, C asking `topology: any` never waits for a
/// one-group placement (it starts at once across both groups), while `tight` waits as no hint does.
#[test]
fn a_job_hinting_any_topology_never_waits_for_it() {
    let run_with = |hint: Option<TopologyHint>| {
        let mut c = job("C", 2, 2, 50, 50);
        c.spec_mut().constraints.topology = hint;
        let w = workload(vec![job("A", 0, 3, 100, 100), job("B", 1, 3, 100, 100), c]);
        let cfg = weighted(
            Policy::EASY,
            CostWeights {
                topology: 0.9,
                wait_time: 0.05,
                ..zero_weights()
            },
        );
        simulate(&w, &grouped(2, 4, 1), &cfg, &mut |_, _| {}).unwrap()
    };
    let any = run_with(Some(TopologyHint::Any));
    assert_eq!((start_of(&any, "C"), any.jobs[2].groups), (2.0, Some(2)));
    assert_eq!(any.summary.deferred_for_topology, 0);
    for hint in [Some(TopologyHint::Tight), None] {
        let r = run_with(hint);
        assert_eq!((start_of(&r, "C"), r.jobs[2].groups), (100.0, Some(1)), "{hint:?}");
    }
}

/// Raising w3 lowers the max tenant share deviation. 4 nodes; tenant A submits 8 whole-machine jobs of
/// 10 s at t=0, tenant B 8 at t=1; the replay stops at t=80 (8 jobs fit).
/// - Arrival order: A's 8 jobs run first: A gets 100 %, deviation 0.5.
/// - w3 = 0.9: after A's first job, B is below its share (f3 = 1) and A above (f3 = 0), so B goes next;
///   then both are at 50 % and the wait term breaks the tie for A: they alternate, deviation 0.
#[test]
fn raising_w3_lowers_share_deviation() {
    let mut jobs = Vec::new();
    for i in 0..8 {
        jobs.push(job(&format!("a{i}"), 0, 4, 10, 10));
    }
    for i in 0..8 {
        let mut j = job(&format!("b{i}"), 1, 4, 10, 10);
        j.spec_mut().tenant = lattice_engine::TenantId(1);
        jobs.push(j);
    }
    let mut w = workload(jobs);
    w.tenants.intern("b");
    let inv = nodes(4);
    let run_with = |fair_share: f64| {
        let mut cfg = weighted(
            Policy::EASY,
            CostWeights {
                fair_share,
                wait_time: 0.05,
                ..zero_weights()
            },
        );
        cfg.horizon = Some(Time::from_secs(80));
        simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap()
    };
    let low = run_with(0.0);
    let high = run_with(0.9);
    assert_eq!(low.summary.max_share_deviation, 0.5);
    assert_eq!(high.summary.max_share_deviation, 0.0);
    assert!(high.summary.jain_index > low.summary.jain_index);
    assert_eq!(start_of(&high, "b0"), 10.0);
}

/// Raising w1 lets a high-priority job overtake: 1 node; X (class 0) and Y (class 9) wait behind R.
#[test]
fn raising_w1_runs_high_priority_first() {
    let mut y = job("Y", 2, 1, 10, 10);
    y.spec_mut().preemption_class = PreemptionClass::new(9).unwrap();
    let w = workload(vec![job("R", 0, 1, 10, 10), job("X", 1, 1, 10, 10), y]);
    let run_with = |priority: f64| {
        let cfg = weighted(
            Policy::EASY,
            CostWeights {
                priority,
                wait_time: 0.2,
                ..zero_weights()
            },
        );
        simulate(&w, &nodes(1), &cfg, &mut |_, _| {}).unwrap()
    };
    assert_eq!(start_of(&run_with(0.0), "X"), 10.0, "wait order without w1");
    let high = run_with(0.9);
    assert_eq!((start_of(&high, "Y"), start_of(&high, "X")), (10.0, 20.0));
}

/// w7 lets time-flexible jobs wait for a cheap window. Prices: 0.30 until t=600, then 0.10. A flexible
/// job (class 0, reference wait 1 h) submitted at t=0 waits for t=600 when w7 = 0.5; with w7 = 0 it starts
/// at once; a high-priority job (class 9) never waits.
#[test]
fn energy_weight_defers_flexible_jobs_to_cheap_windows() {
    let mut urgent = job("U", 0, 1, 60, 60);
    urgent.spec_mut().preemption_class = PreemptionClass::new(9).unwrap();
    let w = workload(vec![job("F", 0, 1, 60, 60), urgent]);
    let mut inv = nodes(2);
    inv.energy_prices = vec![(Time::ZERO, 0.30), (Time::from_secs(600), 0.10)];
    let run_with = |energy: f64| {
        let cfg = weighted(
            Policy::EASY,
            CostWeights {
                energy,
                wait_time: 0.1,
                ..zero_weights()
            },
        );
        simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap()
    };
    let off = run_with(0.0);
    assert_eq!(start_of(&off, "F"), 0.0);
    let on = run_with(0.5);
    assert_eq!(start_of(&on, "F"), 600.0);
    assert_eq!(start_of(&on, "U"), 0.0);
    assert!(on.summary.deferred_for_energy >= 1);
}

/// Placements prefer the largest conformance group, and the sensitive `reservation` policy makes it hard.
/// One group of 6 nodes: 4 with fingerprint 0, 2 with fingerprint 1 (nodes 4, 5).
#[test]
fn conformance_is_preferred_and_hard_for_reservation() {
    let mut inv = grouped(1, 6, 1);
    for n in &mut inv.nodes[4..] {
        n.conformance = lattice_engine::ConformanceFingerprint(1);
    }
    // A 3-node job lands on fingerprint 0 only (fitness 1); a 5-node job must mix (4/5).
    let w = workload(vec![job("A", 0, 3, 10, 10), job("B", 20, 5, 10, 10)]);
    let r = run_inv(&w, &inv, Policy::EASY);
    assert_eq!(r.jobs[0].conformance, Some(1.0));
    assert_eq!(r.jobs[1].conformance, Some(0.8));
    // Under the reservation policy a 5-node job can never mix fingerprints: it is never started.
    let r = run_inv(&w, &inv, Policy::Reservation);
    assert_eq!(r.jobs[1].start_s, None);
    assert_eq!(r.summary.unfinished, 1);
}

/// The power budget caps what runs at once: 4 nodes of 1 kW, budget 2.5 kW: two 1-node jobs at a time.
#[test]
fn power_budget_is_respected() {
    let mut inv = nodes(4);
    for n in &mut inv.nodes {
        n.capabilities.power_w = 1000;
    }
    inv.power_budget_w = Some(2500);
    let w = workload(vec![
        job("a", 0, 1, 10, 10),
        job("b", 0, 1, 10, 10),
        job("c", 0, 1, 10, 10),
    ]);
    let r = run_inv(&w, &inv, Policy::EASY);
    assert_eq!(
        (start_of(&r, "a"), start_of(&r, "b"), start_of(&r, "c")),
        (0.0, 0.0, 10.0)
    );
    assert_eq!(r.summary.min_power_headroom_kw, Some(0.5));
}

/// Each vCluster schedules its own nodes: 2 home nodes for `a`, 2 for `b`. A 3-node job in `a` is
/// unsatisfiable although 4 nodes exist; `a`'s jobs never land on `b`'s nodes; each pool backfills alone.
#[test]
fn vclusters_schedule_their_own_nodes() {
    let mut inv = nodes(4);
    inv.vclusters.intern("a");
    inv.vclusters.intern("b");
    for (i, n) in inv.nodes.iter_mut().enumerate() {
        n.home_vcluster = Some(lattice_engine::VClusterId((i / 2) as u32));
    }
    let mut w = workload(vec![
        job("a1", 0, 2, 100, 100),
        job("a2", 1, 1, 10, 10),
        job("b1", 2, 1, 10, 10),
        job("a3", 3, 3, 10, 10),
    ]);
    w.vclusters = lattice_engine::Registry::default();
    w.vclusters.intern("a");
    w.vclusters.intern("b");
    w.jobs[2].spec_mut().vcluster = lattice_engine::VClusterId(1);
    let r = run_inv(&w, &inv, Policy::EASY);
    assert_eq!(
        r.summary.skipped.get("unsatisfiable"),
        Some(&1),
        "a3 needs 3 of a's 2 nodes"
    );
    // a2 waits for a1 although b has free nodes; b1 starts at once on b's nodes.
    assert_eq!(start_of(&r, "a2"), 100.0);
    assert_eq!(start_of(&r, "b1"), 2.0);
    assert_eq!(r.summary.per_vcluster.len(), 2);
}

/// A vCluster with a 15 s cycle interval decides at cycle ticks only: a job submitted at t=1 starts at 15.
#[test]
fn cycle_interval_batches_decisions_at_ticks() {
    let w = workload(vec![job("x", 1, 1, 10, 10), job("y", 16, 1, 10, 10)]);
    let mut cfg = weighted(Policy::EASY, CostWeights::default());
    cfg.vclusters.get_mut("default").unwrap().cycle_interval = lattice_engine::Duration::from_secs(15);
    let r = simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "x"), 15.0);
    assert_eq!(start_of(&r, "y"), 30.0);
}

/// bin-pack packs partially used groups before opening empty ones. 2 groups × 4 nodes: A (1 node) opens
/// group 0; B (2 nodes) goes to group 0 as well (best fit: 3 free there), leaving group 1 whole for C (4).
#[test]
fn bin_pack_fills_partially_used_groups() {
    let w = workload(vec![
        job("A", 0, 1, 100, 100),
        job("B", 1, 2, 100, 100),
        job("C", 2, 4, 100, 100),
    ]);
    let inv = grouped(2, 4, 1);
    let r = run_inv(&w, &inv, Policy::BinPack);
    assert_eq!((start_of(&r, "B"), start_of(&r, "C")), (1.0, 2.0));
    assert!(r.jobs.iter().all(|j| j.groups == Some(1)));
}

/// Node ranges take as many free nodes as they can, up to max: {2..6} on 4 free nodes gets 4.
#[test]
fn node_ranges_take_what_is_free_up_to_max() {
    let mut j = job("R", 0, 2, 10, 10);
    j.spec_mut().nodes = lattice_engine::NodeRange { min: 2, max: 6 };
    let mut small = job("S", 0, 3, 10, 10);
    small.spec_mut().nodes = lattice_engine::NodeRange { min: 1, max: 3 };
    let w = workload(vec![j, small]);
    let r = run_inv(&w, &nodes(4), Policy::EASY);
    assert_eq!(r.jobs[0].nodes, 4);
    assert_eq!(start_of(&r, "S"), 10.0, "S waits for R's nodes");
    assert_eq!(r.jobs[1].nodes, 3);
}

/// Hard constraints filter nodes: `require_unified_memory` only lands on unified-memory nodes.
#[test]
fn require_unified_memory_is_hard() {
    let mut inv = nodes(4);
    inv.nodes[3].capabilities.unified_memory = true;
    let mut j = job("U", 0, 1, 10, 10);
    j.spec_mut().constraints.require_unified_memory = true;
    let mut j2 = job("U2", 0, 1, 10, 10);
    j2.spec_mut().constraints.require_unified_memory = true;
    let w = workload(vec![j, j2]);
    let r = run_inv(&w, &inv, Policy::EASY);
    assert_eq!((start_of(&r, "U"), start_of(&r, "U2")), (0.0, 10.0));
}

/// A trace's `vcluster` event changes the vCluster's scheduler configuration from its time on (the
/// keys it gives; the others stay). 4 nodes: A (2 nodes, 100 s) runs, B (4 nodes) waits for it, C
/// (1 node, 10 s) arrives at t=2. Under fcfs C waits behind B (starts at 200); switched to easy at
/// t=1, C backfills at once. A bad key skips the line and names it.
#[test]
fn a_vcluster_event_changes_the_policy_from_its_time_on() {
    let text = |change: &str| {
        format!(
            r#"{{"ts": 0, "type": "submit", "alloc": {{"id": "A", "tenant": "t", "nodes": 2, "walltime": 100, "duration": 100}}}}
{{"ts": 1, "type": "submit", "alloc": {{"id": "B", "tenant": "t", "nodes": 4, "walltime": 100, "duration": 100}}}}
{change}
{{"ts": 2, "type": "submit", "alloc": {{"id": "C", "tenant": "t", "nodes": 1, "walltime": 10, "duration": 10}}}}"#
        )
    };
    let run = |change: &str| {
        let w = lattice_traces::parse_jsonl("v.jsonl", &text(change));
        let cfg = weighted(Policy::Fcfs, zero_weights());
        (
            w.skipped_total(),
            w.problems.clone(),
            simulate(&w, &nodes(4), &cfg, &mut |_, _| {}).unwrap(),
        )
    };
    let (skipped, _, r) = run("");
    assert_eq!((skipped, start_of(&r, "C")), (0, 200.0), "fcfs");
    let (skipped, _, r) =
        run(r#"{"ts": 1.5, "type": "vcluster", "vcluster": "default", "config": {"policy": "easy"}}"#);
    assert_eq!((skipped, start_of(&r, "C")), (0, 2.0), "easy from t=1.5");
    assert_eq!(start_of(&r, "B"), 100.0);
    let (skipped, problems, r) =
        run(r#"{"ts": 1.5, "type": "vcluster", "vcluster": "default", "config": {"policy": "easy", "cycle": 5}}"#);
    assert_eq!((skipped, start_of(&r, "C")), (1, 200.0), "skipped");
    let p = format!("{problems:?}");
    assert!(p.contains("config.cycle"), "{p}");
}
