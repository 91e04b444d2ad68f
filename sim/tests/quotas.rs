//! Two-tier quotas: hard limits at the (fake) quorum that can never be exceeded, soft limits through the
//! score.

mod common;
use common::*;
use lattice_engine::{Duration, Policy, TenantId, TenantQuota, VClusterId};
use lattice_sim::{SimConfig, simulate};
use proptest::prelude::*;

fn quota(max_nodes: Option<u32>, max_allocs: Option<u32>) -> TenantQuota {
    TenantQuota {
        max_nodes,
        max_concurrent_allocations: max_allocs,
        ..TenantQuota::default()
    }
}

/// One scheduler knows its tenant's committed usage: with max_nodes 4 on 8 nodes, the second 3-node job
/// waits for the first although nodes are free; nothing reaches the quorum to be rejected.
#[test]
fn scheduler_respects_max_nodes_before_proposing() {
    let w = workload(vec![
        job("a", 0, 3, 10, 10),
        job("b", 1, 3, 10, 10),
        job("c", 2, 1, 10, 10),
    ]);
    let cfg = SimConfig {
        tenants: [("t".to_string(), quota(Some(4), None))].into(),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(8), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "b"), 10.0);
    assert_eq!(start_of(&r, "c"), 2.0, "1 more node fits under the quota");
    assert_eq!(r.summary.quorum_rejections, 0);
}

/// Two vClusters `a` and `b` with four home nodes each, and a workload submitting the 3-node jobs
/// `x` (to `a`) and `y` (to `b`) at once: their two schedulers propose in the same cycle.
fn two_schedulers() -> (lattice_traces::Inventory, lattice_traces::Workload) {
    let mut inv = nodes(8);
    inv.vclusters.intern("a");
    inv.vclusters.intern("b");
    for (i, n) in inv.nodes.iter_mut().enumerate() {
        n.home_vcluster = Some(VClusterId((i / 4) as u32));
    }
    let mut w = workload(vec![job("x", 0, 3, 10, 10), job("y", 0, 3, 10, 10)]);
    w.vclusters = lattice_engine::Registry::default();
    w.vclusters.intern("a");
    w.vclusters.intern("b");
    w.jobs[1].spec_mut().vcluster = VClusterId(1);
    (inv, w)
}

/// Two vCluster schedulers propose for the same tenant in the same cycle; each only sees committed state
/// and its own proposals, so together they would hold 6 > 4 nodes. The quorum commits the first and
/// rejects the second with the seed's message; the loser is retried and runs after the first ends.
#[test]
fn concurrent_proposals_first_commit_wins() {
    let (inv, mut w) = two_schedulers();
    w.tenants = lattice_engine::Registry::default();
    w.tenants.intern("physics");
    let cfg = SimConfig {
        tenants: [("physics".to_string(), quota(Some(4), None))].into(),
        commit_latency: Duration::from_secs(5),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.quota_rejections.get("max_nodes"), Some(&1));
    assert_eq!(
        r.summary.rejection_examples[0],
        "allocation rejected: tenant \"physics\" would exceed max_nodes quota (current: 3, requested: 3, limit: 4)"
    );
    // x commits at 5 and ends at 15; y is re-proposed then and commits at 20.
    assert_eq!(start_of(&r, "x"), 5.0);
    assert_eq!(start_of(&r, "y"), 20.0);
}

/// max_concurrent_allocations counts running allocations.
#[test]
fn max_concurrent_allocations() {
    let w = workload((0..4).map(|i| job(&format!("j{i}"), 0, 1, 10, 10)).collect());
    let cfg = SimConfig {
        tenants: [("t".to_string(), quota(None, Some(2)))].into(),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(8), &cfg, &mut |_, _| {}).unwrap();
    let starts: Vec<f64> = r.jobs.iter().map(|j| j.start_s.unwrap()).collect();
    assert_eq!(starts, vec![0.0, 0.0, 10.0, 10.0]);
}

/// Soft quota: a tenant past its node-hours budget is starved by the score, not rejected. 1 node; both
/// tenants queue behind R; `a` has used its whole budget (R was its job), so `b` goes first.
#[test]
fn exhausted_budget_lowers_priority_but_does_not_reject() {
    let mut jobs = vec![job("R", 0, 1, 3600, 3600), job("a1", 1, 1, 10, 10)];
    let mut b1 = job("b1", 2, 1, 10, 10);
    b1.spec_mut().tenant = TenantId(1);
    jobs.push(b1);
    let mut w = workload(jobs);
    w.tenants.intern("b");
    let mut cfg = weighted(Policy::EASY, lattice_engine::CostWeights::default());
    cfg.tenants = [(
        "t".to_string(),
        TenantQuota {
            node_hours_budget: Some(1.0),
            ..TenantQuota::default()
        },
    )]
    .into();
    let r = simulate(&w, &nodes(1), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "b1"), 3600.0);
    assert_eq!(start_of(&r, "a1"), 3610.0, "starved, not rejected");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Hard quotas are never exceeded, even momentarily, under concurrent proposals from several
    /// vCluster schedulers with commit latency (the invariant checker recounts them at every event).
    #[test]
    fn hard_quotas_never_exceeded(
        jobs in prop::collection::vec((0u64..30, 1u32..4, 1u64..40, 0u64..50, 0u32..2, 0u32..3), 1..40),
        max_nodes in 1u32..6, max_allocs in 1u32..4, latency in 0u64..6,
    ) {
        let mut inv = nodes(12);
        for v in ["a", "b", "c"] { inv.vclusters.intern(v); }
        for (i, n) in inv.nodes.iter_mut().enumerate() {
            n.home_vcluster = Some(VClusterId((i / 4) as u32));
        }
        let mut t = 0;
        let trace: Vec<_> = jobs.iter().enumerate().map(|(i, &(gap, k, req, run, tenant, vc))| {
            t += gap;
            let mut j = job(&format!("j{i}"), t, k, req, run);
            j.spec_mut().tenant = TenantId(tenant);
            j.spec_mut().vcluster = VClusterId(vc);
            j
        }).collect();
        let mut w = workload(trace);
        w.tenants = lattice_engine::Registry::default();
        w.tenants.intern("t0");
        w.tenants.intern("t1");
        w.vclusters = lattice_engine::Registry::default();
        for v in ["a", "b", "c"] { w.vclusters.intern(v); }
        let cfg = SimConfig {
            tenants: [("t0".to_string(), quota(Some(max_nodes.max(3)), Some(max_allocs))), ("t1".to_string(), quota(Some(max_nodes.max(3)), None))].into(),
            commit_latency: Duration::from_secs(latency),
            check_invariants: true,
            ..SimConfig::default()
        };
        simulate(&w, &inv, &cfg, &mut |_, _| {}).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

/// Burst allowance: while another tenant waits, a tenant above `burst × target` gets nothing more.
/// 3 nodes; targets a 0.25, b 0.75. a1 (1 node, 1000 s) runs from 0. At 10, b1 (3 nodes) must wait for
/// it, and a2 (1 node) would fit — but a holds 100 % of the usage, above 1.5 × 0.25, while b waits:
/// a2 waits until b1 has run (1000 → 1010). With burst_allowance 100 it starts at once.
#[test]
fn burst_allowance_caps_a_tenant_while_others_wait() {
    let mut b1 = job("b1", 10, 3, 10, 10);
    b1.spec_mut().tenant = TenantId(1);
    let mut w = workload(vec![job("a1", 0, 1, 1000, 1000), b1, job("a2", 10, 1, 10, 10)]);
    w.tenants = lattice_engine::Registry::default();
    w.tenants.intern("a");
    w.tenants.intern("b");
    let run_with = |burst: f64| {
        let mut cfg = weighted(Policy::EASY, lattice_engine::CostWeights::default());
        cfg.tenants = [
            (
                "a".to_string(),
                TenantQuota {
                    fair_share_target: Some(0.25),
                    burst_allowance: Some(burst),
                    ..TenantQuota::default()
                },
            ),
            (
                "b".to_string(),
                TenantQuota {
                    fair_share_target: Some(0.75),
                    ..TenantQuota::default()
                },
            ),
        ]
        .into();
        simulate(&w, &nodes(3), &cfg, &mut |_, _| {}).unwrap()
    };
    let capped = run_with(1.5);
    assert_eq!((start_of(&capped, "b1"), start_of(&capped, "a2")), (1000.0, 1010.0));
    let free = run_with(100.0);
    assert_eq!(start_of(&free, "a2"), 10.0);
}

/// Projects from a trace and a tenants file: physics/qcd may hold 2 nodes, so its third one-node job
/// waits for a qcd job to end although nodes are free; bio's project of the same name, and physics's
/// other project, are not held back by it. Nothing reaches the quorum to be rejected.
#[test]
fn a_project_max_nodes_from_the_tenants_file_holds_only_that_project() {
    let text = [
        ("q1", "physics", "qcd"),
        ("q2", "physics", "qcd"),
        ("q3", "physics", "qcd"),
        ("a1", "physics", "astro"),
        ("b1", "bio", "qcd"),
        ("b2", "bio", "qcd"),
    ]
    .iter()
    .map(|(id, t, p)| {
        format!(
            r#"{{"ts": 0, "type": "submit", "alloc": {{"id": "{id}", "tenant": "{t}", "project": "{p}", "nodes": 1, "walltime": 100, "duration": 100}}}}"#
        )
    })
    .collect::<Vec<_>>()
    .join("\n");
    let w = lattice_traces::parse_jsonl("p.jsonl", &text);
    assert_eq!(w.skipped_total(), 0, "{:?}", w.problems);
    let contracts = lattice_traces::parse_tenants(
        "t.yaml",
        "physics:\n  projects:\n    qcd:\n      max_nodes: 2\nbio: {}\n",
    )
    .unwrap();
    let cfg = SimConfig {
        tenants: contracts.tenants,
        projects: contracts.projects,
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(16), &cfg, &mut |_, _| {}).unwrap();
    for (id, start) in [
        ("q1", 0.0),
        ("q2", 0.0),
        ("q3", 100.0),
        ("a1", 0.0),
        ("b1", 0.0),
        ("b2", 0.0),
    ] {
        assert_eq!(start_of(&r, id), start, "{id}");
    }
    assert_eq!(r.summary.quorum_rejections, 0);
    // A contract for a project the trace never uses is an error, as for a tenant.
    let cfg = SimConfig {
        projects: [(
            "physics".to_string(),
            [("nope".to_string(), lattice_engine::ProjectQuota::default())].into(),
        )]
        .into(),
        ..SimConfig::default()
    };
    let e = simulate(&w, &nodes(16), &cfg, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("project `nope` of tenant `physics`"), "{e}");
}

/// Two vCluster schedulers propose two jobs of one project in the same cycle; together they would
/// exceed the project's max_nodes (the tenant has no limit). The quorum commits the first and rejects
/// the second naming the project; the loser runs after the first ends.
#[test]
fn the_quorum_rejects_a_proposal_past_a_project_limit() {
    let (inv, w) = two_schedulers();
    let quota = lattice_engine::ProjectQuota {
        max_nodes: Some(4),
        ..Default::default()
    };
    let cfg = SimConfig {
        projects: [("t".to_string(), [("default".to_string(), quota)].into())].into(),
        commit_latency: Duration::from_secs(5),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &inv, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.quota_rejections.get("max_nodes"), Some(&1));
    assert_eq!(
        r.summary.rejection_examples[0],
        "allocation rejected: project \"t/default\" would exceed max_nodes quota (current: 3, requested: 3, limit: 4)"
    );
    assert_eq!(start_of(&r, "x"), 5.0);
    assert_eq!(start_of(&r, "y"), 20.0);
}
