//! Projects as entities (book: "Entity Mapping", "Quota Enforcement"): a project's own hard limits
//! hold with its tenant's, and its own soft budget lowers its jobs' scores; other projects of the
//! tenant are not affected.

use lattice_engine::*;

fn engine(nodes: u32, weights: bool) -> (Engine, TenantId, VClusterId) {
    let mut e = Engine::new(
        EngineConfig::new(Policy::EASY),
        (0..nodes).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
    )
    .unwrap();
    let t = e.add_tenant("physics");
    let v = e.add_vcluster("batch");
    if weights {
        let mut cfg = VClusterConfig::new(Policy::EASY);
        cfg.weights = Some(CostWeights {
            wait_time: 1.0,
            ..CostWeights::default()
        });
        e.configure_vcluster(v, cfg).unwrap();
    }
    (e, t, v)
}

fn job(t: TenantId, v: VClusterId, project: u32, nodes: u32) -> AllocSpec {
    let mut s = AllocSpec::simple(t, v, nodes, Duration::from_hours(1));
    s.project = ProjectId(project);
    s
}

/// Commits every proposal the pass made; returns the allocations started.
fn pass(e: &mut Engine, now: Time) -> Vec<AllocId> {
    e.schedule(now);
    let mut started = Vec::new();
    while let Some(p) = e.poll_proposal() {
        e.handle_commit(now, p.alloc).unwrap();
        started.push(p.alloc);
    }
    started
}

/// qcd may hold 2 nodes: of its three one-node jobs two start, the third waits though nodes are
/// free, while astro (same tenant, no project quota) starts; when a qcd job ends, the third starts.
#[test]
fn a_project_max_nodes_holds_back_only_that_project() {
    let (mut e, t, v) = engine(8, false);
    e.set_project_quota(
        ProjectId(0),
        t,
        ProjectQuota {
            max_nodes: Some(2),
            ..ProjectQuota::default()
        },
    );
    let qcd: Vec<AllocId> = (0..3)
        .map(|_| e.handle_submit(Time(0), job(t, v, 0, 1)).unwrap())
        .collect();
    let astro = e.handle_submit(Time(0), job(t, v, 1, 3)).unwrap();
    let started = pass(&mut e, Time(0));
    assert_eq!(
        started,
        [qcd[0], qcd[1], astro],
        "qcd's third waits for its project's headroom"
    );
    assert_eq!(e.project_committed(ProjectId(0)), (2, 2));
    assert_eq!(e.project_committed(ProjectId(1)), (3, 1));
    assert_eq!(e.tenant_committed(t), (5, 3));
    let end = Time::from_secs(600);
    e.handle_completion(end, qcd[0], EndReason::Success).unwrap();
    assert_eq!(pass(&mut e, end), [qcd[2]]);
    assert_eq!(e.project_committed(ProjectId(0)), (2, 2));
}

/// max_concurrent_allocations of a project counts its running allocations: the second waits while
/// the first runs, and starts at its end (the other projects of the tenant meanwhile start).
#[test]
fn a_project_allocation_limit_counts_running_allocations() {
    let (mut e, t, v) = engine(8, false);
    let quota = |n| ProjectQuota {
        max_concurrent_allocations: Some(n),
        ..ProjectQuota::default()
    };
    e.set_project_quota(ProjectId(3), t, quota(1));
    let a = e.handle_submit(Time(0), job(t, v, 3, 1)).unwrap();
    let b = e.handle_submit(Time(0), job(t, v, 3, 1)).unwrap();
    let other = e.handle_submit(Time(0), job(t, v, 4, 1)).unwrap();
    assert_eq!(pass(&mut e, Time(0)), [a, other]);
    e.handle_completion(Time(5), a, EndReason::Success).unwrap();
    assert_eq!(pass(&mut e, Time(5)), [b]);
}

/// A project past its node-hours budget gets the seed's starvation penalty; its sibling does not, and
/// so the sibling's later job starts first when one node frees up.
#[test]
fn a_project_budget_penalises_its_own_jobs() {
    let (mut e, t, v) = engine(1, true);
    e.set_project_quota(
        ProjectId(0),
        t,
        ProjectQuota {
            node_hours_budget: Some(0.5),
            ..ProjectQuota::default()
        },
    );
    let first = e.handle_submit(Time(0), job(t, v, 0, 1)).unwrap();
    assert_eq!(pass(&mut e, Time(0)), [first]);
    // qcd's next job waits longer than astro's, but qcd will have used 1 node-hour of its 0.5.
    let qcd = e.handle_submit(Time::from_secs(3000), job(t, v, 0, 1)).unwrap();
    let astro = e.handle_submit(Time::from_secs(3500), job(t, v, 1, 1)).unwrap();
    let end = Time::from_secs(3600);
    e.handle_completion(end, first, EndReason::Success).unwrap();
    assert_eq!(pass(&mut e, end), [astro]);
    let (q, a) = (e.score_breakdown(qcd).unwrap(), e.score_breakdown(astro).unwrap());
    assert_eq!(q.penalty, quota::budget_penalty(2.0));
    assert_eq!(a.penalty, 0.0);
}

/// Two tenants' projects are distinct even under one name: a tenant-scoped rejection message names
/// the project within its tenant.
#[test]
fn a_project_rejection_reads_like_the_seed() {
    let q = ProjectQuota {
        max_concurrent_allocations: Some(1),
        ..ProjectQuota::default()
    };
    let e = quota::check_project("physics", "qcd", &q, 4, 1, 2).unwrap_err();
    assert_eq!(e.scope, QuotaScope::Project);
    assert_eq!(
        e.to_string(),
        "allocation rejected: project \"physics/qcd\" would exceed max_concurrent_allocations quota (current: 1, requested: 1, limit: 1)"
    );
}
