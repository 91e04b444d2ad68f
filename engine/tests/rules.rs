//! Engine rules, exercised through the sans-I/O API alone (no simulator).

use lattice_engine::*;

fn nodes(n: u32) -> Vec<NodeSpec> {
    (0..n).map(|i| NodeSpec::plain(format!("n{i}"))).collect()
}

fn engine(policy: Policy, n: u32) -> (Engine, TenantId, VClusterId) {
    let mut e = Engine::new(EngineConfig::new(policy), nodes(n)).unwrap();
    let t = e.add_tenant("physics");
    let v = e.add_vcluster("hpc-batch");
    (e, t, v)
}

fn spec(t: TenantId, v: VClusterId, k: u32, wall_s: u64) -> AllocSpec {
    AllocSpec::simple(t, v, k, Duration::from_secs(wall_s))
}

/// One node for 10 s with 30 GB of data on `tier`, wanted hot.
fn staging_spec(t: TenantId, v: VClusterId, tier: Tier) -> AllocSpec {
    let mut s = spec(t, v, 1, 10);
    s.data = vec![DataMount {
        source: "d".into(),
        size_gb: 30.0,
        tier,
        tier_hint: Tier::Hot,
    }];
    s
}

/// Runs a pass and commits every proposal at `now`; returns the started ids.
fn pass(e: &mut Engine, now: Time) -> Vec<AllocId> {
    e.schedule(now);
    let mut out = Vec::new();
    while let Some(p) = e.poll_proposal() {
        e.handle_commit(now, p.alloc).unwrap();
        out.push(p.alloc);
    }
    out
}

#[test]
fn submit_validation_refuses_bad_requests() {
    let (mut e, t, v) = engine(Policy::EASY, 4);
    let mut s = spec(t, v, 0, 10);
    assert_eq!(e.handle_submit(Time(0), s.clone()), Err(SubmitError::NoNodes(0)));
    s.nodes = NodeRange { min: 3, max: 2 };
    assert_eq!(
        e.handle_submit(Time(0), s.clone()),
        Err(SubmitError::BadRange { min: 3, max: 2 })
    );
    assert_eq!(
        e.handle_submit(Time(0), spec(t, v, 5, 10)),
        Err(SubmitError::Unsatisfiable {
            requested: 5,
            eligible: 4
        })
    );
    assert_eq!(
        e.handle_submit(Time(0), spec(TenantId(9), v, 1, 10)),
        Err(SubmitError::UnknownTenant(TenantId(9)))
    );
    let mut gpu = spec(t, v, 1, 10);
    gpu.constraints.gpu_type = Some("GH200".into());
    assert!(matches!(
        e.handle_submit(Time(0), gpu),
        Err(SubmitError::Unsatisfiable { eligible: 0, .. })
    ));
    assert!(e.allocations().is_empty(), "refused requests create nothing");
}

#[test]
fn fcfs_head_blocks_and_easy_backfills() {
    for (policy, small_starts) in [(Policy::Fcfs, false), (Policy::EASY, true)] {
        let (mut e, t, v) = engine(policy, 4);
        let big_running = e.handle_submit(Time(0), spec(t, v, 3, 100)).unwrap();
        assert_eq!(pass(&mut e, Time(0)), vec![big_running]);
        let head = e.handle_submit(Time(1), spec(t, v, 4, 10)).unwrap();
        let small = e.handle_submit(Time(1), spec(t, v, 1, 10)).unwrap();
        let started = pass(&mut e, Time(1));
        assert_eq!(started.contains(&small), small_starts, "{policy}");
        assert!(!started.contains(&head));
        if small_starts {
            assert!(e.allocation(small).unwrap().backfilled);
            let r = e.reservations().next().unwrap();
            assert_eq!((r.alloc, r.start), (head, Time::from_secs(100)));
        }
    }
}

/// `lattice diag`: each waiting allocation says why, as the pass found it, and the reason goes
/// when it starts.
#[test]
fn waiting_allocations_say_why() {
    use lattice_engine::waiting::Waiting;
    for policy in [Policy::Fcfs, Policy::EASY] {
        let (mut e, t, v) = engine(policy, 4);
        let running = e.handle_submit(Time(0), spec(t, v, 3, 100)).unwrap();
        pass(&mut e, Time(0));
        let head = e.handle_submit(Time(1), spec(t, v, 4, 10)).unwrap();
        let behind = e.handle_submit(Time(1), spec(t, v, 2, 10)).unwrap();
        let mut after = spec(t, v, 1, 10);
        after.depends_on = vec![Dependency {
            on: head,
            condition: DependencyCondition::Success,
        }];
        let dependent = e.handle_submit(Time(1), after).unwrap();
        assert_eq!(e.waiting(head), None, "no pass has looked at it yet");
        pass(&mut e, Time(1));
        assert_eq!(e.waiting(running), None, "running: not waiting");
        assert_eq!(e.waiting(dependent), Some(Waiting::Dependencies { unresolved: 1 }));
        match policy {
            // FCFS: the head waits for nodes, everything behind it for the head.
            Policy::Fcfs => {
                assert_eq!(e.waiting(head), Some(Waiting::Resources));
                assert_eq!(e.waiting(behind), Some(Waiting::BehindHead { head }));
            }
            // EASY: the head's nodes are reserved from the running job's end; the 2-node job does not
            // fit in the one free node.
            _ => {
                assert_eq!(
                    e.waiting(head),
                    Some(Waiting::Reserved {
                        start: Time::from_secs(100)
                    })
                );
                assert_eq!(e.waiting(behind), Some(Waiting::Resources));
            }
        }
        // Once started, the reason is gone.
        e.handle_completion(Time::from_secs(100), running, EndReason::Success)
            .unwrap();
        let started = pass(&mut e, Time::from_secs(100));
        assert!(started.contains(&head), "{policy}");
        assert_eq!(e.waiting(head), None);
    }
}

#[test]
fn constraints_pick_matching_nodes_lowest_id_first() {
    let mut ns = nodes(4);
    for n in &mut ns[2..] {
        n.capabilities.gpu_type = Some("GH200".into());
        n.capabilities.gpu_count = 4;
    }
    let mut e = Engine::new(EngineConfig::new(Policy::EASY), ns).unwrap();
    let (t, v) = (e.add_tenant("ml"), e.add_vcluster("ml"));
    let mut s = spec(t, v, 1, 10);
    s.constraints.gpu_type = Some("GH200".into());
    let a = e.handle_submit(Time(0), s.clone()).unwrap();
    let b = e.handle_submit(Time(0), spec(t, v, 1, 10)).unwrap();
    pass(&mut e, Time(0));
    assert_eq!(e.allocation(a).unwrap().nodes, vec![NodeId(2)]);
    assert_eq!(e.allocation(b).unwrap().nodes, vec![NodeId(0)]);
    // Two more GPU jobs: one fits (node 3), the next waits although CPU nodes are free.
    let c = e.handle_submit(Time(1), s.clone()).unwrap();
    let d = e.handle_submit(Time(1), s).unwrap();
    let started = pass(&mut e, Time(1));
    assert_eq!(started, vec![c]);
    assert_eq!(e.allocation(d).unwrap().state, AllocState::Pending);
    assert_eq!(e.reservations().next().unwrap().start, Time::from_secs(10));
}

#[test]
fn quorum_reject_requeues_in_place_and_latency_delays_start() {
    let (mut e, t, v) = engine(Policy::EASY, 2);
    let a = e.handle_submit(Time(0), spec(t, v, 2, 10)).unwrap();
    e.schedule(Time(0));
    let p = e.poll_proposal().unwrap();
    assert_eq!((p.alloc, p.nodes.len()), (a, 2));
    assert_eq!(e.free_nodes(), 0, "proposed nodes are held");
    e.handle_reject(Time(0), a).unwrap();
    assert_eq!(e.free_nodes(), 2);
    assert_eq!(e.queue(), vec![a]);
    e.schedule(Time(5));
    let p = e.poll_proposal().unwrap();
    e.handle_commit(Time(7), p.alloc).unwrap();
    let al = e.allocation(a).unwrap();
    assert_eq!((al.state, al.started), (AllocState::Running, Some(Time(7))));
    assert_eq!(al.estimated_end(), Some(Time(7) + Duration::from_secs(10)));
    assert_eq!(e.handle_commit(Time(8), a), Err(EngineError::NotProposed(a)));
}

#[test]
fn completion_frees_nodes_and_invalid_transitions_are_errors() {
    let (mut e, t, v) = engine(Policy::EASY, 2);
    let a = e.handle_submit(Time(0), spec(t, v, 2, 10)).unwrap();
    assert!(matches!(
        e.handle_completion(Time(0), a, EndReason::Success),
        Err(EngineError::InvalidTransition { .. })
    ));
    pass(&mut e, Time(0));
    e.handle_completion(Time(5), a, EndReason::Success).unwrap();
    let al = e.allocation(a).unwrap();
    assert_eq!((al.state, al.ended), (AllocState::Completed, Some(Time(5))));
    assert_eq!(e.free_nodes(), 2);
    assert!(e.nodes().iter().all(|n| n.owner.is_none()));
    assert!(e.handle_completion(Time(6), a, EndReason::Success).is_err());
    assert_eq!(
        e.handle_completion(Time(6), AllocId(99), EndReason::Success),
        Err(EngineError::UnknownAlloc(AllocId(99)))
    );
}

#[test]
#[should_panic(expected = "time went backwards")]
fn time_never_goes_backwards() {
    let (mut e, t, v) = engine(Policy::EASY, 2);
    e.handle_submit(Time(10), spec(t, v, 1, 10)).unwrap();
    e.schedule(Time(9));
}

#[test]
fn dependencies_gate_the_queue_and_cascade_cancellation() {
    let (mut e, t, v) = engine(Policy::EASY, 4);
    let up = e.handle_submit(Time(0), spec(t, v, 1, 10)).unwrap();
    let mut on_success = spec(t, v, 1, 10);
    on_success.depends_on = vec![Dependency {
        on: up,
        condition: DependencyCondition::Success,
    }];
    let s = e.handle_submit(Time(0), on_success).unwrap();
    let mut on_failure = spec(t, v, 1, 10);
    on_failure.depends_on = vec![Dependency {
        on: up,
        condition: DependencyCondition::Failure,
    }];
    let f = e.handle_submit(Time(0), on_failure).unwrap();
    let mut chained = spec(t, v, 1, 10);
    chained.depends_on = vec![Dependency {
        on: f,
        condition: DependencyCondition::Success,
    }];
    let c = e.handle_submit(Time(0), chained).unwrap();
    let mut cleanup = spec(t, v, 1, 10);
    cleanup.depends_on = vec![Dependency {
        on: f,
        condition: DependencyCondition::Any,
    }];
    let any = e.handle_submit(Time(0), cleanup).unwrap();
    assert_eq!(
        pass(&mut e, Time(0)),
        vec![up],
        "dependents wait although nodes are free"
    );
    e.handle_completion(Time(10), up, EndReason::Success).unwrap();
    // `any` accepts every terminal state, including the cancellation of its upstream.
    assert_eq!(pass(&mut e, Time(10)), vec![s, any]);
    let fa = e.allocation(f).unwrap();
    assert_eq!(
        (fa.state, fa.end_reason),
        (AllocState::Cancelled, Some(EndReason::DependencyUnsatisfied))
    );
    assert_eq!(
        e.allocation(c).unwrap().state,
        AllocState::Cancelled,
        "cancellation cascades"
    );
    let mut late = spec(t, v, 1, 10);
    late.depends_on = vec![Dependency {
        on: AllocId(42),
        condition: DependencyCondition::Any,
    }];
    assert_eq!(
        e.handle_submit(Time(11), late),
        Err(SubmitError::UnknownDependency(AllocId(42)))
    );
}

#[test]
fn node_events_follow_the_state_machine() {
    let (mut e, t, v) = engine(Policy::EASY, 3);
    let a = e.handle_submit(Time(0), spec(t, v, 1, 100)).unwrap();
    pass(&mut e, Time(0));
    assert_eq!(e.allocation(a).unwrap().nodes, vec![NodeId(0)]);
    // Draining a busy node: it stays with its allocation, and becomes Drained when it ends.
    assert!(
        e.handle_node_event(Time(1), NodeId(0), NodeEvent::Drain)
            .unwrap()
            .is_empty()
    );
    assert_eq!(e.node(NodeId(0)).unwrap().state, NodeState::Draining);
    // An idle node drains at once and leaves the free pool.
    e.handle_node_event(Time(1), NodeId(1), NodeEvent::Drain).unwrap();
    assert_eq!(e.node(NodeId(1)).unwrap().state, NodeState::Drained);
    assert_eq!(e.free_nodes(), 1);
    e.handle_completion(Time(2), a, EndReason::Success).unwrap();
    assert_eq!(e.node(NodeId(0)).unwrap().state, NodeState::Drained);
    assert_eq!(e.free_nodes(), 1, "a drained node is not schedulable");
    // Unsatisfiable now? No: drained nodes still count toward what the inventory can ever give.
    let wide = e.handle_submit(Time(3), spec(t, v, 3, 10)).unwrap();
    assert!(pass(&mut e, Time(3)).is_empty());
    for n in [0, 1] {
        e.handle_node_event(Time(4), NodeId(n), NodeEvent::Undrain).unwrap();
    }
    assert_eq!(pass(&mut e, Time(4)), vec![wide]);
    // A hardware failure under a running allocation frees its other nodes; by default (on_node_failure)
    // it is requeued with its submit time and sits out this cycle.
    let failed = e
        .handle_node_event(Time(5), NodeId(2), NodeEvent::HardwareFailure)
        .unwrap();
    assert_eq!(failed, vec![wide]);
    let w = e.allocation(wide).unwrap();
    assert_eq!((w.state, w.requeues, w.submitted), (AllocState::Pending, 1, Time(3)));
    assert_eq!(e.free_nodes(), 2);
    assert!(
        pass(&mut e, Time(5)).is_empty(),
        "not rescheduled in the cycle it failed in"
    );
    // Invalid transitions are typed errors.
    assert!(matches!(
        e.handle_node_event(Time(6), NodeId(2), NodeEvent::HealthOk),
        Err(EngineError::Node(_))
    ));
}

#[test]
fn cancel_pending_and_running() {
    let (mut e, t, v) = engine(Policy::EASY, 1);
    let a = e.handle_submit(Time(0), spec(t, v, 1, 10)).unwrap();
    let b = e.handle_submit(Time(0), spec(t, v, 1, 10)).unwrap();
    pass(&mut e, Time(0));
    e.handle_cancel(Time(1), b).unwrap();
    assert!(e.queue().is_empty());
    e.handle_cancel(Time(2), a).unwrap();
    assert_eq!(e.allocation(a).unwrap().state, AllocState::Cancelled);
    assert_eq!(e.free_nodes(), 1);
}

#[test]
fn unbounded_allocations_block_reservations_forever() {
    let (mut e, t, v) = engine(Policy::CONSERVATIVE, 2);
    let mut svc = spec(t, v, 1, 1);
    svc.lifecycle = Lifecycle::Unbounded;
    let s = e.handle_submit(Time(0), svc).unwrap();
    pass(&mut e, Time(0));
    let wide = e.handle_submit(Time(1), spec(t, v, 2, 10)).unwrap();
    let narrow = e.handle_submit(Time(1), spec(t, v, 1, 10)).unwrap();
    assert_eq!(
        pass(&mut e, Time(1)),
        vec![narrow],
        "the wide job can never start while the service runs"
    );
    assert!(e.reservations().all(|r| r.alloc != wide));
    assert_eq!(e.allocation(s).unwrap().estimated_end(), None);
}

#[test]
fn pyss_rejects_heterogeneous_pools_and_constraints() {
    let mut ns = nodes(2);
    ns[1].capabilities.memory_gb = 512;
    assert!(matches!(
        Engine::new(EngineConfig::new(Policy::PyssEasy), ns),
        Err(EngineError::PyssHeterogeneous(2))
    ));
    let (mut e, t, v) = engine(Policy::PyssEasy, 2);
    let mut s = spec(t, v, 1, 10);
    s.constraints.memory_gb = Some(1);
    assert_eq!(e.handle_submit(Time(0), s), Err(SubmitError::PyssConstraints));
}

#[test]
fn policies_display_as_on_the_command_line() {
    assert_eq!(Policy::EASY.to_string(), "easy");
    assert_eq!(Policy::CONSERVATIVE.to_string(), "conservative");
    assert_eq!(Policy::Fcfs.to_string(), "fcfs");
    assert_eq!(
        Policy::Backfill {
            depth: Depth::Limited(10)
        }
        .to_string(),
        "backfill(depth=10)"
    );
    assert_eq!(Policy::PyssEasy.to_string(), "easy(compat=pyss)");
}

mod placement_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        /// On heterogeneous nodes (GPU types, memory, features, groups, fingerprints), every proposal's
        /// nodes satisfy the allocation's constraints, are free, are as many as requested, and the
        /// topology span of a placement is never more than what its eligible free nodes required.
        #[test]
        fn every_placement_satisfies_every_constraint(
            node_kinds in prop::collection::vec((0u8..3, 0u32..3, any::<bool>(), 0u32..4, 0u64..2), 4..40),
            jobs in prop::collection::vec((1u32..6, 0u8..3, 0u32..3, any::<bool>(), 1u64..100), 1..30),
            policy in prop_oneof![Just(Policy::EASY), Just(Policy::CONSERVATIVE), Just(Policy::BinPack), Just(Policy::Reservation), Just(Policy::Fcfs)],
        ) {
            let gpu = |t: u8| match t { 0 => None, 1 => Some("A100".to_string()), _ => Some("GH200".to_string()) };
            let specs: Vec<NodeSpec> = node_kinds.iter().enumerate().map(|(i, &(t, mem, nvme, g, fp))| {
                let mut n = NodeSpec::plain(format!("n{i}"));
                n.capabilities.gpu_type = gpu(t);
                n.capabilities.gpu_count = if t == 0 { 0 } else { 4 };
                n.capabilities.memory_gb = 128 << mem;
                if nvme { n.capabilities.features.insert("nvme_scratch".into()); }
                n.group = GroupId(g);
                n.conformance = ConformanceFingerprint(fp);
                n
            }).collect();
            let mut e = Engine::new(EngineConfig::new(policy), specs.clone()).unwrap();
            let (t, v) = (e.add_tenant("t"), e.add_vcluster("v"));
            let mut now = Time(0);
            let mut submitted = Vec::new();
            for &(k, gt, mem, nvme, wall) in &jobs {
                let mut s = spec(t, v, k, wall);
                s.constraints.gpu_type = gpu(gt);
                s.constraints.memory_gb = Some(128 << mem);
                if nvme { s.constraints.features.insert("nvme_scratch".into()); }
                if let Ok(id) = e.handle_submit(now, s) { submitted.push(id); }
                e.schedule(now);
                while let Some(p) = e.poll_proposal() {
                    let a = e.allocation(p.alloc).unwrap().clone();
                    prop_assert_eq!(p.nodes.len() as u32, a.spec.nodes.min);
                    let mut seen = std::collections::BTreeSet::new();
                    for n in &p.nodes {
                        prop_assert!(seen.insert(*n), "node {} twice", n);
                        prop_assert!(a.spec.constraints.satisfied_by(&specs[n.index()].capabilities));
                    }
                    if policy == Policy::Reservation {
                        let fp = specs[p.nodes[0].index()].conformance;
                        prop_assert!(p.nodes.iter().all(|n| specs[n.index()].conformance == fp));
                    }
                    e.handle_commit(now, p.alloc).unwrap();
                }
                now = now + Duration::from_secs(7);
                // Let some allocations finish so nodes are reused.
                for id in submitted.clone() {
                    let a = e.allocation(id).unwrap();
                    if a.state == AllocState::Running && a.estimated_end().is_some_and(|x| x <= now) {
                        e.handle_completion(now, id, EndReason::Success).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn requeue_policies() {
    for (policy, max, want) in [
        (RequeuePolicy::Never, 3, AllocState::Failed),
        (RequeuePolicy::OnNodeFailure, 0, AllocState::Failed),
        (RequeuePolicy::OnNodeFailure, 3, AllocState::Pending),
    ] {
        let (mut e, t, v) = engine(Policy::EASY, 2);
        let mut s = spec(t, v, 1, 100);
        s.requeue = policy;
        s.max_requeues = max;
        let a = e.handle_submit(Time(0), s).unwrap();
        pass(&mut e, Time(0));
        let node = e.allocation(a).unwrap().nodes[0];
        e.handle_node_event(Time(1), node, NodeEvent::HardwareFailure).unwrap();
        assert_eq!(e.allocation(a).unwrap().state, want, "{policy:?} max {max}");
    }
    // `always` also requeues an application failure; `on_node_failure` does not.
    for (policy, want) in [
        (RequeuePolicy::Always, AllocState::Pending),
        (RequeuePolicy::OnNodeFailure, AllocState::Failed),
    ] {
        let (mut e, t, v) = engine(Policy::EASY, 1);
        let mut s = spec(t, v, 1, 100);
        s.requeue = policy;
        let a = e.handle_submit(Time(0), s).unwrap();
        pass(&mut e, Time(0));
        e.handle_completion(Time(5), a, EndReason::ExitFailure).unwrap();
        assert_eq!(e.allocation(a).unwrap().state, want, "{policy:?}");
    }
}

#[test]
fn staging_failures_retry_then_alert_and_f5_tracks_progress() {
    let (mut e, t, v) = engine(Policy::EASY, 1);
    e.set_vast_bandwidth(10.0);
    let a = e.handle_submit(Time(0), staging_spec(t, v, Tier::Cold)).unwrap();
    assert_eq!(e.allocation(a).unwrap().state, AllocState::Staging);
    assert_eq!(e.data_readiness(a), Some(0.0));
    e.schedule(Time::from_secs(5)); // 3 GB/s × 5 s = 15 GB
    assert_eq!(e.data_readiness(a), Some(0.5));
    for _ in 0..4 {
        e.handle_staging_failure(Time::from_secs(5), a).unwrap();
    }
    assert_eq!(e.data_readiness(a), Some(0.0));
    assert_eq!(e.staging_alerts(), 1, "after 3 retries an alert, and it keeps waiting");
    // An allocation without data has no readiness figure (f5 = 0.5 neutral).
    let b = e.handle_submit(Time::from_secs(6), spec(t, v, 1, 10)).unwrap();
    assert_eq!(e.data_readiness(b), None);
}

#[test]
fn a_walltime_extension_moves_the_estimated_end_and_the_reservation() {
    // 2 nodes: A runs on both for 100 s; B (2 nodes) is reserved at A's estimated end.
    let (mut e, t, v) = engine(Policy::EASY, 2);
    let a = e.handle_submit(Time(0), spec(t, v, 2, 100)).unwrap();
    assert_eq!(pass(&mut e, Time(0)), vec![a]);
    let b = e.handle_submit(Time(1_000), spec(t, v, 2, 10)).unwrap();
    pass(&mut e, Time(1_000));
    assert_eq!(e.running_estimates().collect::<Vec<_>>(), vec![(Time(100_000), a)]);
    let before: Vec<Time> = e.reservations().filter(|r| r.alloc == b).map(|r| r.start).collect();
    assert_eq!(before, vec![Time(100_000)]);

    e.handle_walltime_update(Time(2_000), a, Duration::from_secs(300))
        .unwrap();
    pass(&mut e, Time(2_000));
    assert_eq!(e.running_estimates().collect::<Vec<_>>(), vec![(Time(300_000), a)]);
    let after: Vec<Time> = e.reservations().filter(|r| r.alloc == b).map(|r| r.start).collect();
    assert_eq!(after, vec![Time(300_000)], "B's reservation follows A's new end");
    // A pending allocation's walltime changes too; an ended one's cannot.
    e.handle_walltime_update(Time(2_000), b, Duration::from_secs(20))
        .unwrap();
    assert_eq!(
        e.allocation(b).unwrap().spec.lifecycle.walltime(),
        Some(Duration::from_secs(20))
    );
    e.handle_completion(Time(3_000), a, EndReason::Success).unwrap();
    assert_eq!(
        e.handle_walltime_update(Time(3_000), a, Duration::from_secs(900)),
        Err(EngineError::WalltimeFixed(a))
    );
}

#[test]
fn an_adopted_allocation_runs_on_its_nodes_from_its_original_start() {
    // After a control-plane restart: A (2 of 4 nodes, 100 s) started at 10 s before the restart; the
    // driver submits it again at 50 s and adopts it on the nodes the quorum records for it.
    let (mut e, t, v) = engine(Policy::EASY, 4);
    let now = Time::from_secs(50);
    let a = e.handle_submit(now, spec(t, v, 2, 100)).unwrap();
    let b = e.handle_submit(now, spec(t, v, 3, 10)).unwrap();
    // Not free / unknown nodes are refused and change nothing.
    assert_eq!(
        e.handle_adopt(now, a, &[NodeId(1), NodeId(9)], Time(0), Time::from_secs(10)),
        Err(EngineError::UnknownNode(NodeId(9)))
    );
    assert_eq!(e.allocation(a).unwrap().state, AllocState::Pending);
    e.handle_adopt(now, a, &[NodeId(3), NodeId(1)], Time(5_000), Time::from_secs(10))
        .unwrap();
    let x = e.allocation(a).unwrap();
    assert_eq!(x.state, AllocState::Running);
    assert_eq!(x.nodes, vec![NodeId(1), NodeId(3)]);
    assert_eq!((x.submitted, x.started), (Time(5_000), Some(Time::from_secs(10))));
    assert_eq!(e.node(NodeId(1)).unwrap().owner.map(|o| o.alloc), Some(a));
    assert!(
        e.poll_proposal().is_none(),
        "the quorum already holds its nodes: nothing to propose"
    );
    // Its estimated end is the original start + walltime: B (3 nodes) is reserved for 110 s.
    assert_eq!(
        e.running_estimates().collect::<Vec<_>>(),
        vec![(Time::from_secs(110), a)]
    );
    assert!(pass(&mut e, now).is_empty());
    let r: Vec<Time> = e.reservations().filter(|r| r.alloc == b).map(|r| r.start).collect();
    assert_eq!(r, vec![Time::from_secs(110)]);
    // A node it holds cannot be adopted twice; a running allocation cannot be adopted again.
    let c = e.handle_submit(now, spec(t, v, 1, 10)).unwrap();
    assert_eq!(
        e.handle_adopt(now, c, &[NodeId(1)], now, now),
        Err(EngineError::NodeNotFree(NodeId(1)))
    );
    assert!(e.handle_adopt(now, a, &[NodeId(0)], now, now).is_err());
    // It completes like any run.
    e.handle_completion(Time::from_secs(60), a, EndReason::Success).unwrap();
    assert_eq!(pass(&mut e, Time::from_secs(60)), vec![b, c]);
}

#[test]
fn staging_on_a_fresh_engine_accrues_from_the_submission_not_from_time_zero() {
    // A control plane that (re)started a moment ago: its engine's first input is a staging
    // submission at wall-clock time. Bandwidth accrues from then, not from the epoch.
    let (mut e, t, v) = engine(Policy::EASY, 1);
    e.set_vast_bandwidth(10.0);
    let at = Time::from_secs(1_800_000_000);
    let a = e.handle_submit(at, staging_spec(t, v, Tier::Warm)).unwrap();
    e.schedule(at + Duration::from_secs(5)); // 3 GB/s × 5 s = 15 GB
    assert_eq!(e.data_readiness(a), Some(0.5));
    assert_eq!(e.allocation(a).unwrap().state, AllocState::Staging);
}
