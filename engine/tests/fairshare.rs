//! Fair share with decay: the tutorial's jack/jill example (002_*.txt) on the engine's usage ledger,
//! and Lattice's own f3 steering a contended cluster towards the contracted shares.

use lattice_engine::*;

const H: u64 = 3600;

fn cluster(policy: Policy, fair_share: FairShareConfig) -> (Engine, TenantId, TenantId, VClusterId) {
    let mut cfg = EngineConfig::new(policy);
    cfg.fair_share = fair_share;
    let mut e = Engine::new(cfg, (0..4).map(|i| NodeSpec::plain(format!("pi{i}"))).collect()).unwrap();
    let jack = e.add_tenant("jack");
    let jill = e.add_tenant("jill");
    let v = e.add_vcluster("pi");
    e.set_tenant_share(jack, 0.25);
    e.set_tenant_share(jill, 0.75);
    (e, jack, jill, v)
}

/// Runs one whole-cluster 6-hour job for `tenant` from `now` to `now + 6 h`.
fn run_job(e: &mut Engine, now: Time, tenant: TenantId, v: VClusterId) -> Time {
    let id = e
        .handle_submit(now, AllocSpec::simple(tenant, v, 4, Duration::from_hours(6)))
        .unwrap();
    e.schedule(now);
    let p = e.poll_proposal().expect("the cluster is idle");
    assert_eq!(p.alloc, id);
    e.handle_commit(now, id).unwrap();
    let end = now + Duration::from_hours(6);
    e.handle_completion(end, id, EndReason::Success).unwrap();
    end
}

/// The tutorial: shares S(jack) = 0.25, S(jill) = 0.75, decay D = 0.7 per day over 7 days, usage as a
/// fraction of the cluster-day (96 node-hours), priority P = S − U with U = S · Σ Dᵈ·u(today − d).
/// Both submit whole-cluster 6-hour jobs; the higher priority runs next, ties go to the larger share.
///
/// The tutorial's prose drops the `S ·` factor of its own formula (it writes P(jill) = 0.75 − 0.25 after
/// one job, and a tie at 0.25 after two). Following the formula, as the issue asks:
/// - step 1: P(jack) = 0.25, P(jill) = 0.75 → jill
/// - step 2: P(jill) = 0.75 − 0.75 · 24/96 = 0.5625 → jill
/// - step 3: P(jill) = 0.75 − 0.75 · 48/96 = 0.375 → jill (the tutorial has a tie here, won by jill too)
/// - step 4: P(jill) = 0.75 − 0.75 · 72/96 = 0.1875 < 0.25 → jack (as in the tutorial)
/// - step 5: P(jack) = 0.25 − 0.25 · 24/96 = 0.1875 = P(jill) → tie → jill (larger share)
///
/// Steps 1-4 fill the 24-hour day: jill 75 %, jack 25 %, the shares they paid for.
#[test]
fn tutorial_jack_and_jill_sequence() {
    let (mut e, jack, jill, v) = cluster(Policy::EASY, FairShareConfig::tutorial());
    let share = |t: TenantId| if t == jack { 0.25 } else { 0.75 };
    let priority = |e: &Engine, t: TenantId| share(t) - share(t) * e.usage_ledger().decayed_fraction(t.index(), 4.0);
    let mut now = Time::ZERO;
    let mut order = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (pj, pl) = (priority(&e, jack), priority(&e, jill));
        seen.push((pj, pl));
        // Ties go to the larger share (jill).
        let next = if pj > pl + 1e-12 { jack } else { jill };
        order.push(if next == jack { "jack" } else { "jill" });
        now = run_job(&mut e, now, next, v);
    }
    assert_eq!(order, ["jill", "jill", "jill", "jack", "jill"]);
    let want = [
        (0.25, 0.75),
        (0.25, 0.5625),
        (0.25, 0.375),
        (0.25, 0.1875),
        (0.1875, 0.1875),
    ];
    for (i, (got, want)) in seen.iter().zip(want).enumerate() {
        // Step 5 is at t = 24 h, a day boundary: yesterday's usage counts D = 0.7.
        if i < 4 {
            assert!(
                (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
                "step {}: {got:?}",
                i + 1
            );
        }
    }
    // At 24 h the day rolls over: everything from day 0 now weighs 0.7.
    let (pj, pl) = seen[4];
    assert!((pj - (0.25 - 0.25 * 0.7 * 0.25)).abs() < 1e-9, "{pj}");
    assert!((pl - (0.75 - 0.75 * 0.7 * 0.75)).abs() < 1e-9, "{pl}");
}

/// Lattice's f3 = max(0, target − actual)/target, with actual = the tenant's share of decayed usage, as
/// the only weight: jack's and jill's whole-cluster jobs all queued at once converge to 25/75.
/// jack's jobs are submitted first, so the initial tie (both unused) goes to jack by arrival; after it,
/// jill is below her share for three jobs, then both are at target (tie → arrival → jack), and so on:
/// jack, jill, jill, jill, jack, jill, jill, jill.
#[test]
fn f3_steers_towards_contracted_shares() {
    let (mut e, jack, jill, v) = cluster(Policy::EASY, FairShareConfig::tutorial());
    let mut cfg = VClusterConfig::new(Policy::EASY);
    cfg.weights = Some(CostWeights {
        priority: 0.0,
        wait_time: 0.0,
        fair_share: 1.0,
        topology: 0.0,
        data_readiness: 0.0,
        backlog: 0.0,
        energy: 0.0,
        checkpoint: 0.0,
        conformance: 0.0,
    });
    e.configure_vcluster(v, cfg).unwrap();
    for t in [jack, jill] {
        for _ in 0..8 {
            e.handle_submit(Time::ZERO, AllocSpec::simple(t, v, 4, Duration::from_hours(6)))
                .unwrap();
        }
    }
    let mut now = Time::ZERO;
    let mut order = Vec::new();
    for _ in 0..8 {
        e.schedule(now);
        let p = e.poll_proposal().expect("one job starts per cycle");
        let a = e.allocation(p.alloc).unwrap().spec.tenant;
        order.push(if a == jack { "jack" } else { "jill" });
        // The breakdown says why: f3 is the third component.
        e.handle_commit(now, p.alloc).unwrap();
        now = now + Duration::from_secs(6 * H);
        e.handle_completion(now, p.alloc, EndReason::Success).unwrap();
    }
    assert_eq!(order, ["jack", "jill", "jill", "jill", "jack", "jill", "jill", "jill"]);
    let waiting: Vec<AllocId> = e.queue();
    let b = e.score_breakdown(waiting[0]).unwrap();
    assert!((0.0..=1.0).contains(&b.components[2]));
}

/// KAI targets in the engine: A deserves 30 (weight 1), B 30 (weight 3), C 40 but is idle. A queues 80
/// nodes of work, B 50, on 100 nodes: A 30 + 10 + 10 = 50, B 30 + 20 = 50 (its request), C 0.
#[test]
fn kai_targets_follow_demand() {
    let mut e = Engine::new(
        EngineConfig::new(Policy::EASY),
        (0..100).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
    )
    .unwrap();
    let v = e.add_vcluster("batch");
    let mut ids = Vec::new();
    for (name, deserved, weight) in [("A", 30.0, 1.0), ("B", 30.0, 3.0), ("C", 40.0, 1.0)] {
        let t = e.add_tenant(name);
        e.set_tenant_quota(
            t,
            TenantQuota {
                deserved_nodes: Some(deserved),
                over_quota_weight: Some(weight),
                ..TenantQuota::default()
            },
        );
        ids.push(t);
    }
    // A queues 80 nodes (8 × 10), B 50 (5 × 10); nothing runs (submissions only).
    for _ in 0..8 {
        e.handle_submit(Time(0), AllocSpec::simple(ids[0], v, 10, Duration::from_hours(1)))
            .unwrap();
    }
    for _ in 0..5 {
        e.handle_submit(Time(0), AllocSpec::simple(ids[1], v, 10, Duration::from_hours(1)))
            .unwrap();
    }
    let t = e.fair_share_targets(v);
    assert!(
        (t[0] - 0.5).abs() < 1e-9 && (t[1] - 0.5).abs() < 1e-9 && t[2] == 0.0,
        "{t:?}"
    );
}

/// The hierarchy's second level: inside one tenant, the project that has used less goes first, even
/// though both projects' jobs have the same tenant-level deficit.
#[test]
fn project_level_share_breaks_ties_within_a_tenant() {
    let mut e = Engine::new(
        EngineConfig::new(Policy::EASY),
        (0..2).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
    )
    .unwrap();
    let t = e.add_tenant("physics");
    let v = e.add_vcluster("batch");
    let mut cfg = VClusterConfig::new(Policy::EASY);
    cfg.weights = Some(CostWeights {
        priority: 0.0,
        wait_time: 0.0,
        fair_share: 1.0,
        topology: 0.0,
        data_readiness: 0.0,
        backlog: 0.0,
        energy: 0.0,
        checkpoint: 0.0,
        conformance: 0.0,
    });
    e.configure_vcluster(v, cfg).unwrap();
    let job = |p: u32| {
        let mut s = AllocSpec::simple(t, v, 2, Duration::from_hours(1));
        s.project = ProjectId(p);
        s
    };
    // Project 0 runs first (alone), then one job of each project queues: project 1 (unused) goes first.
    let a = e.handle_submit(Time(0), job(0)).unwrap();
    e.schedule(Time(0));
    let p = e.poll_proposal().unwrap();
    e.handle_commit(Time(0), p.alloc).unwrap();
    let q0 = e.handle_submit(Time(1), job(0)).unwrap();
    let q1 = e.handle_submit(Time(2), job(1)).unwrap();
    let end = Time::from_secs(3600);
    e.handle_completion(end, a, EndReason::Success).unwrap();
    e.schedule(end);
    assert_eq!(e.poll_proposal().unwrap().alloc, q1);
    let (b0, b1) = (
        e.score_breakdown(q0).unwrap(),
        e.allocation(q1).unwrap().start_score.clone().unwrap(),
    );
    assert!(
        b1.components[2] > b0.components[2],
        "{} vs {}",
        b1.components[2],
        b0.components[2]
    );
}
