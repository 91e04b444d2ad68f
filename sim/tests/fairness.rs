//! Demand-aware fairness moves with the fair-share weight, by the amount worked out by hand.

mod common;
use common::*;
use lattice_engine::{CostWeights, Duration, Policy, TenantId};
use lattice_sim::simulate;

/// Two nodes, one-hour windows. Tenant A submits four 1-node, 1 h jobs at t=0 (a1..a4). Tenant B
/// submits one (b1) at t=10. a1 and a2 take both nodes at 0; at 3,600 s both end and three jobs
/// wait: a3, a4 (waited 3,600 s) and b1 (3,590 s).
///
/// - `fair_share` 0, `wait_time` 1: the longest waits go first, so a3 and a4 run in hour 1 and b1 in
///   hour 2.
/// - `fair_share` 1: A has used two node-hours and B none, so b1 goes first, with a3 on the other
///   node; a4 runs in hour 2.
///
/// Hour 0 (same in both runs). Delivered: A 7,200 node-s, B 0. Waiting: A 7,200 (a3, a4), B 3,590.
/// Demand: A 14,400, B 3,590. Fair split of the 7,200 delivered, equal targets capped by demand
/// (max-min): B 3,590, A 3,610. Deviation 3,590 / 7,200 = 0.498611 for both tenants. Jain's index
/// of delivered / fair over (1.99, 0) is 0.5. Weight: 10,790 waiting node-s.
///
/// Hour 1. Without fair share: A 7,200 delivered, B waits 3,600, so the fair split is 3,600 each,
/// the deviation 0.5 and Jain 0.5. With fair share: A 3,600 and B 3,600 delivered, a4 waits 3,600,
/// the fair split is 3,600 each, the deviation 0 and Jain 1. Weight: 3,600 either way.
///
/// Hour 2 has no waiting work, so it does not count. Over the two counted hours, weighted by
/// waiting work:
/// - max deviation: (10,790 × 0.498611 + 3,600 × 0.5) / 14,390 = 0.498959 without fair share, and
///   10,790 × 0.498611 / 14,390 = 0.373872 with it;
/// - Jain: 0.5 without, (10,790 × 0.5 + 3,600) / 14,390 = 0.625087 with.
///
/// The whole-run figures cannot see this: both tenants get the same node-hours either way.
#[test]
fn raising_fair_share_improves_demand_aware_fairness_by_the_hand_worked_amount() {
    let mut jobs = Vec::new();
    for i in 1..=4 {
        jobs.push(job(&format!("a{i}"), 0, 1, 3600, 3600));
    }
    let mut b = job("b1", 10, 1, 3600, 3600);
    b.spec_mut().tenant = TenantId(1);
    jobs.push(b);
    let mut w = workload(jobs);
    w.tenants.intern("b");
    let run = |fair_share: f64, wait_time: f64| {
        let mut cfg = weighted(
            Policy::EASY,
            CostWeights {
                fair_share,
                wait_time,
                ..zero_weights()
            },
        );
        cfg.fairness_window = Duration::from_hours(1);
        simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap()
    };
    let without = run(0.0, 1.0);
    let with = run(1.0, 0.0);
    // The schedules as worked out above.
    assert_eq!(
        (
            start_of(&without, "a3"),
            start_of(&without, "a4"),
            start_of(&without, "b1")
        ),
        (3600.0, 3600.0, 7200.0)
    );
    assert_eq!(
        (start_of(&with, "b1"), start_of(&with, "a3"), start_of(&with, "a4")),
        (3600.0, 3600.0, 7200.0)
    );
    let (a, b) = (&without.summary, &with.summary);
    assert_eq!((a.fair_share_windows, b.fair_share_windows), (2, 2));
    assert_eq!((a.fair_share_dev_max, b.fair_share_dev_max), (0.498959, 0.373872));
    assert_eq!((a.fair_share_dev_mean, b.fair_share_dev_mean), (0.498959, 0.373872));
    assert_eq!((a.fair_share_jain, b.fair_share_jain), (0.5, 0.625087));
    // The whole-run index is the same for both: each tenant's node-hours do not depend on the order.
    assert_eq!(a.jain_index, b.jain_index);
}

/// Service fairness: B's single job waits an hour in one run and not at all in the other; with the
/// fair share weight its slowdown matches A's better.
#[test]
fn service_fairness_follows_the_tenants_slowdowns() {
    let mut jobs = vec![job("a1", 0, 2, 3600, 3600), job("a2", 0, 2, 3600, 3600)];
    let mut b = job("b1", 10, 2, 3600, 3600);
    b.spec_mut().tenant = TenantId(1);
    jobs.push(b);
    let mut w = workload(jobs);
    w.tenants.intern("b");
    let r = simulate(
        &w,
        &nodes(2),
        &weighted(
            Policy::EASY,
            CostWeights {
                wait_time: 1.0,
                ..zero_weights()
            },
        ),
        &mut |_, _| {},
    )
    .unwrap();
    // a1 0-3600, a2 3600-7200 (waited 3,600 s: bsld 2), b1 7200-10800 (waited 7,190 s: bsld ≈ 3).
    let s = &r.summary;
    let a_bsld = (1.0 + 2.0) / 2.0;
    let b_bsld = (7190.0 + 3600.0) / 3600.0;
    let jain = (a_bsld + b_bsld) * (a_bsld + b_bsld) / (2.0 * (a_bsld * a_bsld + b_bsld * b_bsld));
    assert!(
        (s.tenant_bsld_jain - jain).abs() < 1e-6,
        "{} vs {jain}",
        s.tenant_bsld_jain
    );
    // Worst over median (the lower of the two middle values for two tenants): b over a.
    assert!((s.tenant_bsld_worst_to_median - b_bsld / a_bsld).abs() < 1e-6);
    // p95 wait: a's is 3,600 s, b's 7,190 s.
    assert_eq!(s.tenant_p95_wait_spread_s, 3590.0);
}
