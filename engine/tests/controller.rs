//! The controller carries out engine outputs through the ports: a recording world sees every decision.

use lattice_engine::{
    AllocSpec, CheckpointKind, CheckpointSpec, Controller, CostWeights, Decision, Duration, Engine, EngineConfig,
    Input, NodeEvent, NodeId, NodeSpec, Policy, PreemptHow, PreemptionClass, Time, VClusterConfig, World,
};

/// Records decisions; the quorum commits at once (or, with `.1`, answers later, as an input).
#[derive(Default)]
struct Recorder(Vec<Decision>, bool);

impl lattice_engine::Quorum for Recorder {
    fn propose(&mut self, _: &Engine, _: Time, p: &lattice_engine::Proposal) -> Option<bool> {
        self.0.push(Decision::Propose(p.clone()));
        if self.1 { None } else { Some(true) }
    }
    fn refuse(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, why: &lattice_engine::Refusal) {
        self.0.push(Decision::Refuse {
            alloc,
            why: why.clone(),
        });
    }
    fn persist(&mut self, _: &Engine, _: Time, record: lattice_engine::Durable) {
        self.0.push(Decision::Persist(record));
    }
    fn release(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, nodes: &[NodeId]) {
        self.0.push(Decision::Release {
            alloc,
            nodes: nodes.to_vec(),
        });
    }
    fn scale(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, node: NodeId, added: bool) {
        self.0.push(Decision::Scale { alloc, node, added });
    }
    fn audit(
        &mut self,
        _: &Engine,
        _: Time,
        alloc: lattice_engine::AllocId,
        event: lattice_engine::AuditEvent,
        nodes: &[NodeId],
    ) {
        self.0.push(Decision::Audit {
            alloc,
            event,
            nodes: nodes.to_vec(),
        });
    }
}

impl lattice_engine::Fleet for Recorder {
    fn launch(&mut self, _: &Engine, _: Time, l: &lattice_engine::Launch<'_>) {
        self.0.push(Decision::Launch {
            alloc: l.alloc,
            nodes: l.nodes.to_vec(),
            resume_from: l.resume_from,
            staging_remaining_s: l.staging_remaining_s,
            vni: l.vni,
        });
    }
    fn stop(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, why: lattice_engine::StopReason) {
        self.0.push(Decision::Stop { alloc, why });
    }
    fn preempt(&mut self, _: &Engine, _: Time, order: &lattice_engine::PreemptOrder) {
        self.0.push(Decision::Preempt(*order));
    }
    fn checkpoint(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId) -> Option<bool> {
        self.0.push(Decision::Checkpoint { alloc });
        None
    }
    fn wipe(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, nodes: &[NodeId]) {
        self.0.push(Decision::Wipe {
            alloc,
            nodes: nodes.to_vec(),
        });
    }
    fn boot(&mut self, _: &Engine, _: Time, alloc: lattice_engine::AllocId, nodes: &[NodeId]) {
        self.0.push(Decision::Boot {
            alloc,
            nodes: nodes.to_vec(),
        });
    }
    fn watch(&mut self, _: &Engine, _: Time, node: NodeId, grace: Duration) {
        self.0.push(Decision::Watch { node, grace });
    }
    fn drift(&mut self, _: &Engine, _: Time, node: NodeId, drifted: bool, sensitive: bool) {
        self.0.push(Decision::Drift {
            node,
            drifted,
            sensitive,
        });
    }
}

impl lattice_engine::Timer for Recorder {
    fn wake_at(&mut self, at: Time) {
        self.0.push(Decision::WakeAt(at));
    }
}

fn controller(nodes: u32) -> (Controller, lattice_engine::TenantId, lattice_engine::VClusterId) {
    let mut e = Engine::new(
        EngineConfig::new(Policy::EASY),
        (0..nodes).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
    )
    .unwrap();
    let t = e.add_tenant("t");
    let v = e.add_vcluster("v");
    let mut c = VClusterConfig::new(Policy::EASY);
    c.weights = Some(CostWeights::default());
    e.configure_vcluster(v, c).unwrap();
    (Controller::new(e), t, v)
}

fn pass(c: &mut Controller, now: Time, w: &mut dyn World) {
    c.schedule(now);
    c.dispatch(now, w).unwrap();
}

#[test]
fn a_preempted_victim_resumes_from_its_checkpoint_even_after_a_lost_run() {
    let (mut c, t, v) = controller(2);
    let mut w = Recorder::default();
    let mut low = AllocSpec::simple(t, v, 2, Duration::from_hours(4));
    low.preemption_class = PreemptionClass::new(1).unwrap();
    low.checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: Some(1.0),
        ..Default::default()
    };
    let low = c.submit(Time(0), low).unwrap();
    pass(&mut c, Time(0), &mut w);
    assert!(
        w.0.iter()
            .any(|d| matches!(d, Decision::Launch { alloc, resume_from, .. }
        if *alloc == low && *resume_from == Duration::ZERO))
    );
    // Ten minutes in, a class-9 allocation needs the nodes.
    let mut high = AllocSpec::simple(t, v, 2, Duration::from_hours(1));
    high.preemption_class = PreemptionClass::new(9).unwrap();
    let t1 = Time::from_secs(600);
    let high = c.submit(t1, high).unwrap();
    w.0.clear();
    pass(&mut c, t1, &mut w);
    let order =
        w.0.iter()
            .find_map(|d| match d {
                Decision::Preempt(o) => Some(*o),
                _ => None,
            })
            .expect("a preemption order");
    assert_eq!((order.alloc, order.for_alloc, order.at), (low, high, t1));
    assert!(matches!(order.how, PreemptHow::CheckpointThenStop { .. }), "{order:?}");
    // The checkpoint is written a minute later: the victim stops, its nodes go to the preemptor.
    let t2 = Time::from_secs(660);
    w.0.clear();
    c.apply(t2, Input::Suspended(low, true), &mut w).unwrap();
    assert!(matches!(&w.0[0], Decision::Release { alloc, .. } if *alloc == low));
    pass(&mut c, t2, &mut w);
    assert!(
        w.0.iter()
            .any(|d| matches!(d, Decision::Launch { alloc, .. } if *alloc == high))
    );
    // The preemptor ends; the victim runs again from the work its checkpoint kept (10 min).
    let t3 = Time::from_secs(3600);
    w.0.clear();
    c.apply(t3, Input::Exited(high, lattice_engine::EndReason::Success), &mut w)
        .unwrap();
    pass(&mut c, t3, &mut w);
    assert!(
        w.0.iter()
            .any(|d| matches!(d, Decision::Launch { alloc, resume_from, .. }
            if *alloc == low && *resume_from == Duration::from_mins(10))),
        "{:?}",
        w.0
    );
    assert_eq!(c.stats.preemptions.get("priority"), Some(&1));
    // A node failure loses the run: it is stopped and released; only the work since the checkpoint
    // (400 s on 2 nodes) is lost, and the next run resumes from the checkpoint again.
    let t4 = Time::from_secs(4000);
    w.0.clear();
    c.apply(t4, Input::Node(NodeId(0), NodeEvent::HardwareFailure), &mut w)
        .unwrap();
    assert!(
        matches!(&w.0[0], Decision::Stop { alloc, .. } if *alloc == low),
        "{:?}",
        w.0
    );
    assert!(
        matches!(&w.0[1], Decision::Release { alloc, .. } if *alloc == low),
        "{:?}",
        w.0
    );
    assert_eq!(c.resume_point(low), Duration::from_mins(10));
    assert_eq!(c.stats.preemption_checkpoints, 1);
    assert!(
        (c.stats.lost_node_s - 2.0 * 400.0).abs() < 1e-9,
        "{}",
        c.stats.lost_node_s
    );
}

#[test]
fn heartbeat_grace_depends_on_what_the_node_runs() {
    let (mut c, t, v) = controller(2);
    let mut w = Recorder::default();
    let mut claim = AllocSpec::simple(t, v, 1, Duration::from_hours(1));
    claim.sensitive_claim = true;
    c.submit(Time(0), claim).unwrap();
    pass(&mut c, Time(0), &mut w);
    assert!(
        w.0.iter().any(|d| matches!(
            d,
            Decision::Audit {
                event: lattice_engine::AuditEvent::Claim,
                ..
            }
        )),
        "a claim is audited when its nodes are committed"
    );
    let busy = c.engine.allocations()[0].nodes[0];
    let idle = NodeId(1 - busy.0);
    w.0.clear();
    c.apply(Time(10), Input::Node(busy, NodeEvent::HeartbeatMiss), &mut w)
        .unwrap();
    c.apply(Time(10), Input::Node(idle, NodeEvent::HeartbeatMiss), &mut w)
        .unwrap();
    assert_eq!(
        w.0,
        vec![
            Decision::Watch {
                node: busy,
                grace: Duration::from_mins(5)
            },
            Decision::Watch {
                node: idle,
                grace: Duration::from_secs(60)
            },
        ]
    );
    // The grace runs out for the sensitive node: Down, its claim stopped and released.
    w.0.clear();
    c.apply(Time(310_010), Input::GraceExpired(busy), &mut w).unwrap();
    assert!(matches!(w.0.first(), Some(Decision::Stop { .. })), "{:?}", w.0);
}

/// Book, "Drift Response": the drifted node's running work goes on, it takes no new work, the
/// world is told (remediation); once it conforms again a standard node is back in the pool.
#[test]
fn a_drifted_node_drains_keeps_its_work_and_returns_when_it_conforms() {
    let (mut c, t, v) = controller(2);
    let mut w = Recorder::default();
    let running = c
        .submit(Time(0), AllocSpec::simple(t, v, 1, Duration::from_hours(1)))
        .unwrap();
    pass(&mut c, Time(0), &mut w);
    let node = c.engine.allocation(running).unwrap().nodes[0];
    let other = NodeId(1 - node.0);
    c.apply(Time(10), Input::Conformance(node, true), &mut w).unwrap();
    assert!(c.is_drifted(node));
    assert_eq!(c.engine.node(node).unwrap().state, lattice_engine::NodeState::Draining);
    assert_eq!(
        c.engine.allocation(running).unwrap().state,
        lattice_engine::AllocState::Running
    );
    assert!(w.0.contains(&Decision::Drift {
        node,
        drifted: true,
        sensitive: false
    }));
    // Reported again: nothing new.
    let before = w.0.len();
    c.apply(Time(11), Input::Conformance(node, true), &mut w).unwrap();
    assert_eq!(w.0.len(), before);
    // New work goes to the other node only; a 2-node job waits.
    let one = c
        .submit(Time(20), AllocSpec::simple(t, v, 1, Duration::from_hours(1)))
        .unwrap();
    let two = c
        .submit(Time(20), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    pass(&mut c, Time(20), &mut w);
    assert_eq!(c.engine.allocation(one).unwrap().nodes, vec![other]);
    assert_eq!(
        c.engine.allocation(two).unwrap().state,
        lattice_engine::AllocState::Pending
    );
    // Remediated: it conforms, it is back (draining → ready), the world is told.
    c.apply(Time(30), Input::Conformance(node, false), &mut w).unwrap();
    assert!(!c.is_drifted(node));
    assert_eq!(c.engine.node(node).unwrap().state, lattice_engine::NodeState::Ready);
    assert_eq!(
        w.0.last(),
        Some(&Decision::Drift {
            node,
            drifted: false,
            sensitive: false
        })
    );
    assert_eq!(c.stats.drifts, 1);
}

/// A drifted node not remediated within the drift remediation timeout (24 h) goes Down: the work
/// still on it is stopped and requeued like a lost node's, the world is asked to wake at the
/// deadline, and it stays Down when it conforms later (an operator brings it back). One remediated
/// in time never goes Down.
#[test]
fn a_node_drifted_past_the_remediation_timeout_goes_down() {
    let (mut c, t, v) = controller(3);
    let mut w = Recorder::default();
    let day = Duration::from_hours(24);
    let long = c
        .submit(Time(0), AllocSpec::simple(t, v, 1, Duration::from_hours(48)))
        .unwrap();
    pass(&mut c, Time(0), &mut w);
    let node = c.engine.allocation(long).unwrap().nodes[0];
    let quick = NodeId((node.0 + 1) % 3);
    c.apply(Time(1000), Input::Conformance(node, true), &mut w).unwrap();
    c.apply(Time(2000), Input::Conformance(quick, true), &mut w).unwrap();
    pass(&mut c, Time(2000), &mut w);
    let deadline = Time(1000) + day;
    assert!(
        w.0.contains(&Decision::WakeAt(deadline)),
        "woken at the deadline: {:?}",
        w.0
    );
    assert_eq!(c.drift_deadline(node), Some(deadline));
    // `quick` is remediated in time.
    c.apply(Time(3_600_000), Input::Conformance(quick, false), &mut w)
        .unwrap();
    assert_eq!(c.drift_deadline(quick), None);
    // Just before: still draining, its work running.
    pass(&mut c, Time(deadline.0 - 1), &mut w);
    assert_eq!(c.engine.node(node).unwrap().state, lattice_engine::NodeState::Draining);
    assert_eq!(c.stats.drift_timeouts, 0);
    // At the deadline: Down, the run stopped and released, the allocation requeued.
    let before = w.0.len();
    pass(&mut c, deadline, &mut w);
    assert_eq!(c.engine.node(node).unwrap().state, lattice_engine::NodeState::Down);
    assert_eq!(c.stats.drift_timeouts, 1);
    let after = &w.0[before..];
    assert!(
        after
            .iter()
            .any(|d| matches!(d, Decision::Stop { alloc, .. } if *alloc == long)),
        "{after:?}"
    );
    assert!(
        after
            .iter()
            .any(|d| matches!(d, Decision::Release { alloc, .. } if *alloc == long)),
        "{after:?}"
    );
    assert_ne!(
        c.engine.allocation(long).unwrap().nodes,
        vec![node],
        "not on the Down node"
    );
    assert_eq!(c.engine.node(quick).unwrap().state, lattice_engine::NodeState::Ready);
    // Once only; conforming later does not bring it back.
    pass(&mut c, Time(deadline.0 + 5000), &mut w);
    assert_eq!(c.stats.drift_timeouts, 1);
    c.apply(Time(deadline.0 + 6000), Input::Conformance(node, false), &mut w)
        .unwrap();
    assert_eq!(c.engine.node(node).unwrap().state, lattice_engine::NodeState::Down);
}

/// `n` nodes at home in a sensitive vCluster (the first added: id 0).
fn sensitive_controller(n: u32) -> Controller {
    let home = lattice_engine::VClusterId(0);
    let nodes: Vec<NodeSpec> = (0..n)
        .map(|i| NodeSpec {
            home_vcluster: Some(home),
            ..NodeSpec::plain(format!("n{i}"))
        })
        .collect();
    let mut e = Engine::new(EngineConfig::new(Policy::EASY), nodes).unwrap();
    e.add_tenant("t");
    let sv = e.add_vcluster("sensitive");
    assert_eq!(sv, home);
    e.configure_vcluster(sv, VClusterConfig::new(Policy::Reservation))
        .unwrap();
    Controller::new(e)
}

/// A sensitive node's remediation time is 4 hours.
#[test]
fn a_sensitive_node_has_four_hours_to_be_remediated() {
    let mut c = sensitive_controller(1);
    let mut w = Recorder::default();
    let n = NodeId(0);
    c.apply(Time(0), Input::Conformance(n, true), &mut w).unwrap();
    assert_eq!(c.drift_deadline(n), Some(Time(0) + Duration::from_hours(4)));
    pass(&mut c, Time(0) + Duration::from_hours(4), &mut w);
    assert_eq!(c.engine.node(n).unwrap().state, lattice_engine::NodeState::Down);
}

/// A sensitive node (at home in a sensitive vCluster) drains on drift and says so (the world audits
/// it); conforming again does not return it: an operator undrains it.
#[test]
fn a_drifted_sensitive_node_stays_drained_until_an_operator_undrains_it() {
    let mut c = sensitive_controller(2);
    let mut w = Recorder::default();
    let n = NodeId(0);
    c.apply(Time(5), Input::Conformance(n, true), &mut w).unwrap();
    assert_eq!(c.engine.node(n).unwrap().state, lattice_engine::NodeState::Drained);
    assert!(w.0.contains(&Decision::Drift {
        node: n,
        drifted: true,
        sensitive: true
    }));
    c.apply(Time(6), Input::Conformance(n, false), &mut w).unwrap();
    assert_eq!(c.engine.node(n).unwrap().state, lattice_engine::NodeState::Drained);
    c.apply(Time(7), Input::Node(n, NodeEvent::Undrain), &mut w).unwrap();
    assert_eq!(c.engine.node(n).unwrap().state, lattice_engine::NodeState::Ready);
}

/// A claim of `k` nodes in the sensitive controller's vCluster.
fn claim(c: &mut Controller, now: Time, k: u32) -> lattice_engine::AllocId {
    let mut spec = AllocSpec::simple(
        lattice_engine::TenantId(0),
        lattice_engine::VClusterId(0),
        k,
        Duration::from_hours(1),
    );
    spec.sensitive_claim = true;
    c.submit(now, spec).unwrap()
}

fn launched(w: &Recorder, id: lattice_engine::AllocId) -> bool {
    w.0.iter()
        .any(|d| matches!(d, Decision::Launch { alloc, .. } if *alloc == id))
}

fn audited(w: &Recorder, id: lattice_engine::AllocId) -> Vec<&'static str> {
    w.0.iter()
        .filter_map(|d| match d {
            Decision::Audit { alloc, event, .. } if *alloc == id => Some(event.as_str()),
            _ => None,
        })
        .collect()
}

/// With a hardened image, a committed claim first boots its nodes into it (book: "OpenCHAMI boots
/// N1-N4 with hardened sensitive image (if not already)"): it launches only once every node has
/// booted, the boot audited between claim and launch; a later claim on the same nodes launches at
/// once (they still run the hardened image after the wipe).
#[test]
fn a_claim_boots_its_nodes_into_the_hardened_image_before_it_launches() {
    let mut c = sensitive_controller(2);
    c.hardened_boot = Some(Duration::from_mins(10));
    let mut w = Recorder::default();
    let id = claim(&mut c, Time(0), 2);
    pass(&mut c, Time(0), &mut w);
    assert!(
        w.0.contains(&Decision::Boot {
            alloc: id,
            nodes: vec![NodeId(0), NodeId(1)]
        }),
        "{:?}",
        w.0
    );
    assert!(!launched(&w, id), "not before its nodes booted");
    assert!(c.is_booting(id));
    assert_eq!(
        c.next_wakeup(),
        Some(Time(0) + Duration::from_mins(10)),
        "woken at the boot deadline"
    );
    // A node rebooting is silent: no heartbeat watch while it boots.
    c.apply(Time(500), Input::Node(NodeId(1), NodeEvent::HeartbeatMiss), &mut w)
        .unwrap();
    assert!(!w.0.iter().any(|d| matches!(d, Decision::Watch { .. })), "{:?}", w.0);
    c.apply(Time(1000), Input::Booted(id, NodeId(0), true), &mut w).unwrap();
    assert!(!launched(&w, id), "one node is still booting");
    // A duplicate report changes nothing.
    c.apply(Time(1500), Input::Booted(id, NodeId(0), true), &mut w).unwrap();
    c.apply(Time(2000), Input::Booted(id, NodeId(1), true), &mut w).unwrap();
    assert!(launched(&w, id));
    assert_eq!(audited(&w, id), ["claim", "boot", "start"]);
    assert!(c.is_hardened(NodeId(0)) && c.is_hardened(NodeId(1)));
    assert_eq!(c.stats.hardened_boots, 2);
    // It ends, its nodes are wiped; the next claim launches without booting.
    c.apply(
        Time(9000),
        Input::Exited(id, lattice_engine::EndReason::Success),
        &mut w,
    )
    .unwrap();
    c.apply(Time(10_000), Input::WipeDone(id, true), &mut w).unwrap();
    let before = w.0.len();
    let next = claim(&mut c, Time(11_000), 2);
    pass(&mut c, Time(11_000), &mut w);
    assert!(launched(&w, next));
    assert!(
        !w.0[before..].iter().any(|d| matches!(d, Decision::Boot { .. })),
        "{:?}",
        &w.0[before..]
    );
}

/// A node whose hardened boot fails goes Down (Booting → Failed) and the claim fails — never
/// requeued — its nodes released and wiped; a boot that does not finish within the timeout fails the
/// same way; nothing launches in either case.
#[test]
fn a_failed_or_timed_out_hardened_boot_fails_the_claim() {
    let mut c = sensitive_controller(4);
    c.hardened_boot = Some(Duration::from_mins(10));
    let mut w = Recorder::default();
    let failed = claim(&mut c, Time(0), 2);
    pass(&mut c, Time(0), &mut w);
    let nodes = c.engine.allocation(failed).unwrap().nodes.clone();
    c.apply(Time(500), Input::Booted(failed, nodes[0], true), &mut w)
        .unwrap();
    c.apply(Time(900), Input::Booted(failed, nodes[1], false), &mut w)
        .unwrap();
    assert!(!launched(&w, failed));
    assert_eq!(
        c.engine.allocation(failed).unwrap().state,
        lattice_engine::AllocState::Failed
    );
    assert_eq!(c.engine.node(nodes[1]).unwrap().state, lattice_engine::NodeState::Down);
    assert!(
        w.0.contains(&Decision::Wipe {
            alloc: failed,
            nodes: nodes.clone()
        }),
        "{:?}",
        w.0
    );
    assert_eq!(audited(&w, failed), ["claim", "release"]);
    assert_eq!(c.stats.boot_failures, 1);
    // Timed out: the two other nodes never report; ten minutes on, both are Down, the claim failed.
    let slow = claim(&mut c, Time(1000), 2);
    pass(&mut c, Time(1000), &mut w);
    let slow_nodes = c.engine.allocation(slow).unwrap().nodes.clone();
    assert!(
        slow_nodes.iter().all(|n| !nodes.contains(n) || *n == nodes[0]),
        "{slow_nodes:?}"
    );
    let deadline = Time(1000) + Duration::from_mins(10);
    assert_eq!(c.next_wakeup(), Some(deadline));
    pass(&mut c, deadline, &mut w);
    assert!(!launched(&w, slow));
    assert_eq!(
        c.engine.allocation(slow).unwrap().state,
        lattice_engine::AllocState::Failed
    );
    let booting: Vec<NodeId> = slow_nodes.iter().copied().filter(|n| !c.is_hardened(*n)).collect();
    for n in &booting {
        assert_eq!(c.engine.node(*n).unwrap().state, lattice_engine::NodeState::Down);
    }
    // A late report changes nothing.
    c.apply(Time(deadline.0 + 10), Input::Booted(slow, booting[0], true), &mut w)
        .unwrap();
    assert!(!launched(&w, slow));
    assert!(!c.is_booting(slow));
}

/// An operator retries a quarantined node's wipe (book: "Wipe Failure Handling"): the retry is
/// audited and the world wipes that node alone; wiped, it returns to the pool (Down → Ready);
/// failed again, it stays quarantined. A node that is not quarantined is refused.
#[test]
fn a_quarantined_node_is_wiped_again_on_an_operators_retry() {
    let mut c = sensitive_controller(2);
    let mut w = Recorder::default();
    let id = claim(&mut c, Time(0), 2);
    pass(&mut c, Time(0), &mut w);
    c.apply(Time(100), Input::Exited(id, lattice_engine::EndReason::Success), &mut w)
        .unwrap();
    c.apply(Time(200), Input::WipeDone(id, false), &mut w).unwrap();
    assert_eq!(c.quarantined(), [NodeId(0), NodeId(1)]);
    assert!(matches!(
        c.apply(Time(250), Input::RetryWipe(NodeId(5)), &mut w),
        Err(lattice_engine::ControlError::NotQuarantined(_))
    ));
    let before = w.0.len();
    c.apply(Time(300), Input::RetryWipe(NodeId(0)), &mut w).unwrap();
    assert_eq!(
        w.0[before..],
        [
            Decision::Audit {
                alloc: id,
                event: lattice_engine::AuditEvent::WipeRetry,
                nodes: vec![NodeId(0)]
            },
            Decision::Wipe {
                alloc: id,
                nodes: vec![NodeId(0)]
            },
        ]
    );
    assert_eq!(c.quarantined(), [NodeId(1)], "being wiped again");
    assert!(matches!(
        c.apply(Time(310), Input::RetryWipe(NodeId(0)), &mut w),
        Err(lattice_engine::ControlError::NotQuarantined(_))
    ));
    c.apply(Time(400), Input::NodeWiped(id, NodeId(0), true), &mut w)
        .unwrap();
    assert_eq!(
        c.engine.node(NodeId(0)).unwrap().state,
        lattice_engine::NodeState::Ready
    );
    assert_eq!(c.quarantined(), [NodeId(1)]);
    c.apply(Time(500), Input::RetryWipe(NodeId(1)), &mut w).unwrap();
    c.apply(Time(600), Input::NodeWiped(id, NodeId(1), false), &mut w)
        .unwrap();
    assert_eq!(c.engine.node(NodeId(1)).unwrap().state, lattice_engine::NodeState::Down);
    assert_eq!(c.quarantined(), [NodeId(1)], "failed again: still quarantined");
    assert_eq!(
        audited(&w, id),
        [
            "claim",
            "start",
            "release",
            "quarantine",
            "wipe_retry",
            "wipe",
            "wipe_retry",
            "quarantine"
        ]
    );
}

/// A node that fails while the start is at the quorum (which does not know node health and
/// commits it): the commit finds the run lost — nothing launches, the nodes are released and the
/// allocation waits again, then starts on healthy nodes.
#[test]
fn a_start_committed_on_a_node_that_failed_meanwhile_is_lost_at_once() {
    let (mut c, t, v) = controller(4);
    let mut w = Recorder(Vec::new(), true);
    let id = c
        .submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    pass(&mut c, Time(0), &mut w);
    let nodes = match w.0.iter().find(|d| matches!(d, Decision::Propose(_))) {
        Some(Decision::Propose(p)) => p.nodes.clone(),
        other => panic!("{other:?}"),
    };
    c.apply(Time(1_000), Input::Node(nodes[1], NodeEvent::HardwareFailure), &mut w)
        .unwrap();
    w.0.clear();
    c.apply(Time(2_000), Input::Committed(id), &mut w).unwrap();
    assert!(!w.0.iter().any(|d| matches!(d, Decision::Launch { .. })), "{:?}", w.0);
    assert!(
        w.0.iter().any(|d| matches!(d, Decision::Stop { alloc, why: lattice_engine::StopReason::NodeLost(n) } if *alloc == id && *n == nodes[1])),
        "{:?}",
        w.0
    );
    assert!(
        w.0.iter()
            .any(|d| matches!(d, Decision::Release { alloc, .. } if *alloc == id))
    );
    let a = c.engine.allocation(id).unwrap();
    assert_eq!((a.state, a.nodes.len()), (lattice_engine::AllocState::Pending, 0));
    // Proposed again on the three nodes still up.
    w.0.clear();
    pass(&mut c, Time(30_000), &mut w);
    let again = w.0.iter().find_map(|d| match d {
        Decision::Propose(p) if p.alloc == id => Some(p.nodes.clone()),
        _ => None,
    });
    assert!(again.is_some_and(|n| !n.contains(&nodes[1])), "{:?}", w.0);
}

/// A start waits for its own submission and for a prior end to be durable; each is named in the
/// refusal, and once the world reports them durable the next pass proposes it.
#[test]
fn a_start_waits_for_its_submission_and_a_prior_end_to_be_durable() {
    use lattice_engine::{Durable, Refusal};
    let (mut c, t, v) = controller(2);
    let mut w = Recorder::default();
    let a = c
        .submit(Time(0), AllocSpec::simple(t, v, 1, Duration::from_hours(1)))
        .unwrap();
    c.apply(Time(0), Input::NotDurable(Durable::Submission(a)), &mut w)
        .unwrap();
    c.apply(Time(0), Input::AwaitsPrior(a, 7), &mut w).unwrap();
    pass(&mut c, Time(0), &mut w);
    let refused = |w: &Recorder| {
        w.0.iter()
            .filter_map(|d| match d {
                Decision::Refuse {
                    why: Refusal::NotDurable { awaiting },
                    ..
                } => Some(awaiting.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(refused(&w), vec![vec![Durable::Submission(a), Durable::PriorEnd(7)]]);
    assert!(w.0.contains(&Decision::Persist(Durable::PriorEnd(7))), "{:?}", w.0);
    assert!(!w.0.iter().any(|d| matches!(d, Decision::Launch { .. })));
    assert_eq!(c.stats.durability_holds, 1);
    // Its submission is durable: still waiting for the prior end (not asked for again).
    c.apply(Time(1_000), Input::Durable(Durable::Submission(a)), &mut w)
        .unwrap();
    w.0.clear();
    pass(&mut c, Time(1_000), &mut w);
    assert_eq!(refused(&w), vec![vec![Durable::PriorEnd(7)]]);
    assert!(
        !w.0.iter().any(|d| matches!(d, Decision::Persist(_))),
        "asked once: {:?}",
        w.0
    );
    c.apply(Time(2_000), Input::Durable(Durable::PriorEnd(7)), &mut w)
        .unwrap();
    w.0.clear();
    pass(&mut c, Time(2_000), &mut w);
    assert!(refused(&w).is_empty());
    assert!(
        w.0.iter()
            .any(|d| matches!(d, Decision::Launch { alloc, .. } if *alloc == a))
    );
}

/// With durable ends, a dependent waits for its dependency's end to be reported durable; without,
/// it starts at once.
#[test]
fn a_dependent_waits_for_its_dependency_end_to_be_durable() {
    use lattice_engine::{Dependency, DependencyCondition, Durable, EndReason};
    for durable_ends in [false, true] {
        let (mut c, t, v) = controller(2);
        c.durable_ends = durable_ends;
        let mut w = Recorder::default();
        let up = c
            .submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
            .unwrap();
        let mut spec = AllocSpec::simple(t, v, 2, Duration::from_hours(1));
        spec.depends_on = vec![Dependency {
            on: up,
            condition: DependencyCondition::Success,
        }];
        let down = c.submit(Time(0), spec).unwrap();
        pass(&mut c, Time(0), &mut w);
        c.apply(Time(10_000), Input::Exited(up, EndReason::Success), &mut w)
            .unwrap();
        w.0.clear();
        pass(&mut c, Time(10_000), &mut w);
        let launched = |w: &Recorder| {
            w.0.iter()
                .any(|d| matches!(d, Decision::Launch { alloc, .. } if *alloc == down))
        };
        assert_eq!(launched(&w), !durable_ends, "{:?}", w.0);
        if durable_ends {
            assert!(w.0.contains(&Decision::Persist(Durable::End(up))), "{:?}", w.0);
            c.apply(Time(12_000), Input::Durable(Durable::End(up)), &mut w).unwrap();
            w.0.clear();
            pass(&mut c, Time(12_000), &mut w);
            assert!(launched(&w), "{:?}", w.0);
        }
    }
}

/// A node whose wipe is under way stays out of the pool until the wipe's outcome, whatever an
/// operator does meanwhile: an undrain, or lifting a drain order, changes nothing (work started
/// there would run on a node being wiped).
#[test]
fn an_undrain_during_a_wipe_waits_for_the_wipe() {
    use lattice_engine::{EndReason, NodeOrder, NodeState};
    let mut c = sensitive_controller(2);
    let mut w = Recorder::default();
    let id = claim(&mut c, Time(0), 2);
    pass(&mut c, Time(0), &mut w);
    assert!(launched(&w, id));
    let drained = NodeOrder {
        drained: true,
        disabled: false,
    };
    c.apply(Time(1_000), Input::Order(NodeId(1), drained), &mut w).unwrap();
    c.apply(Time(2_000), Input::Exited(id, EndReason::Success), &mut w)
        .unwrap();
    assert!(c.is_wiping(id));
    c.apply(Time(3_000), Input::Node(NodeId(0), NodeEvent::Undrain), &mut w)
        .unwrap();
    c.apply(Time(3_000), Input::Order(NodeId(1), NodeOrder::default()), &mut w)
        .unwrap();
    for n in [NodeId(0), NodeId(1)] {
        assert_ne!(
            c.engine.node(n).unwrap().state,
            NodeState::Ready,
            "{n:?} is being wiped"
        );
    }
    let next = c
        .submit(
            Time(3_000),
            AllocSpec::simple(
                lattice_engine::TenantId(0),
                lattice_engine::VClusterId(0),
                1,
                Duration::from_hours(1),
            ),
        )
        .unwrap();
    pass(&mut c, Time(3_000), &mut w);
    assert!(!launched(&w, next), "nothing starts on a node being wiped");
    c.apply(Time(4_000), Input::WipeDone(id, true), &mut w).unwrap();
    assert_eq!(c.engine.node(NodeId(0)).unwrap().state, NodeState::Ready);
    pass(&mut c, Time(4_000), &mut w);
    assert!(launched(&w, next), "{:?}", w.0);
}

fn launched_now(w: &Recorder) -> Vec<lattice_engine::AllocId> {
    w.0.iter()
        .filter_map(|d| match d {
            Decision::Launch { alloc, .. } => Some(*alloc),
            _ => None,
        })
        .collect()
}

fn preempted_now(w: &Recorder) -> Vec<lattice_engine::AllocId> {
    w.0.iter()
        .filter_map(|d| match d {
            Decision::Preempt(o) => Some(o.alloc),
            _ => None,
        })
        .collect()
}

fn classed(t: lattice_engine::TenantId, v: lattice_engine::VClusterId, nodes: u32, hours: u64, class: u8) -> AllocSpec {
    let mut s = AllocSpec::simple(t, v, nodes, Duration::from_hours(hours));
    s.preemption_class = PreemptionClass::new(class).unwrap();
    s
}

/// The book's preemption: the freed nodes are assigned to the pending allocation. While one victim
/// still writes its checkpoint, the nodes another victim already freed take only what ends before
/// the victims' stop orders run out (15 min 30 s for a checkpoint): not a job that would end before
/// the victims' walltimes, which would leave the preemptor short again, preempting anew.
#[test]
fn nodes_a_victim_freed_wait_for_its_preemptor_while_the_others_stop() {
    let (mut c, t, v) = controller(6);
    let mut w = Recorder::default();
    let quick = c.submit(Time(0), classed(t, v, 3, 8, 1)).unwrap();
    let mut slow = classed(t, v, 3, 8, 1);
    slow.checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: Some(10.0),
        ..Default::default()
    };
    let slow = c.submit(Time(0), slow).unwrap();
    pass(&mut c, Time(0), &mut w);
    assert_eq!(launched_now(&w), vec![quick, slow]);
    // A short job waits for nodes, then a class-9 allocation needs all six.
    let t1 = Time::from_secs(600);
    let short = c.submit(t1, classed(t, v, 3, 2, 0)).unwrap();
    let mut tiny = classed(t, v, 3, 1, 0);
    tiny.lifecycle = lattice_engine::Lifecycle::Bounded {
        walltime: Duration::from_mins(5),
    };
    let tiny = c.submit(t1, tiny).unwrap();
    let high = c.submit(t1, classed(t, v, 6, 1, 9)).unwrap();
    w.0.clear();
    pass(&mut c, t1, &mut w);
    assert_eq!(preempted_now(&w), vec![quick, slow], "{:?}", w.0);
    // The victim without a checkpoint stops at once; the other is still writing its checkpoint.
    let t2 = Time::from_secs(630);
    w.0.clear();
    c.apply(t2, Input::Suspended(quick, false), &mut w).unwrap();
    pass(&mut c, t2, &mut w);
    assert_eq!(
        launched_now(&w),
        vec![tiny],
        "the freed nodes are the preemptor's but for what ends before its victims must be off theirs: {:?}",
        w.0
    );
    w.0.clear();
    c.apply(
        Time::from_secs(930),
        Input::Exited(tiny, lattice_engine::EndReason::Success),
        &mut w,
    )
    .unwrap();
    pass(&mut c, Time::from_secs(930), &mut w);
    assert_eq!(launched_now(&w), vec![], "{:?}", w.0);
    // Its checkpoint written, the second victim stops: the preemptor starts on all six.
    let t3 = Time::from_secs(1200);
    w.0.clear();
    c.apply(t3, Input::Suspended(slow, true), &mut w).unwrap();
    pass(&mut c, t3, &mut w);
    assert_eq!(launched_now(&w), vec![high], "{:?}", w.0);
    assert_eq!(preempted_now(&w), vec![]);
    assert!(c.engine.allocation(short).is_some_and(|a| a.started.is_none()));
}

/// An allocation goes ahead of its pool only while its victims' nodes are coming free for it. Once
/// it ran, it queues as anyone else: preempted in turn, it does not take the nodes back ahead of an
/// allocation that scores higher (a stale mark once let two victims of one preemptor swap nodes for
/// ever).
#[test]
fn a_preemptor_that_ran_queues_as_anyone_else() {
    let (mut c, t, v) = controller(4);
    let mut w = Recorder::default();
    let low = c.submit(Time(0), classed(t, v, 4, 8, 1)).unwrap();
    pass(&mut c, Time(0), &mut w);
    // `mid` preempts `low` and runs.
    let t1 = Time::from_secs(600);
    let mid = c.submit(t1, classed(t, v, 4, 4, 5)).unwrap();
    w.0.clear();
    pass(&mut c, t1, &mut w);
    assert_eq!(preempted_now(&w), vec![low]);
    c.apply(t1, Input::Suspended(low, false), &mut w).unwrap();
    w.0.clear();
    pass(&mut c, t1, &mut w);
    assert_eq!(launched_now(&w), vec![mid]);
    // `top` preempts `mid` and runs; meanwhile `next` (class 8) arrives.
    let t2 = Time::from_secs(1200);
    let top = c.submit(t2, classed(t, v, 4, 1, 9)).unwrap();
    w.0.clear();
    pass(&mut c, t2, &mut w);
    assert_eq!(preempted_now(&w), vec![mid]);
    c.apply(t2, Input::Suspended(mid, false), &mut w).unwrap();
    w.0.clear();
    pass(&mut c, t2, &mut w);
    assert_eq!(launched_now(&w), vec![top]);
    let next = c.submit(Time::from_secs(1300), classed(t, v, 4, 1, 8)).unwrap();
    // `top` ends: the class-8 allocation scores above the class-5 one and takes the nodes.
    let t3 = Time::from_secs(1800);
    w.0.clear();
    c.apply(t3, Input::Exited(top, lattice_engine::EndReason::Success), &mut w)
        .unwrap();
    pass(&mut c, t3, &mut w);
    assert_eq!(launched_now(&w), vec![next], "{:?}", w.0);
    assert!(c.engine.allocation(mid).is_some_and(|a| a.started.is_none()));
}

/// Every way an allocation ends is noted once for `take_ended` — a completion, a failure, a
/// dependency's cancel and the cancels it cascades to — and only then can its node list be moved
/// out; a running one keeps its list.
#[test]
fn every_end_is_noted_once_and_only_ended_allocations_give_up_their_nodes() {
    use lattice_engine::{AllocState, Dependency, DependencyCondition, EndReason};
    let (mut c, t, v) = controller(4);
    c.engine.track_ended();
    let mut w = Recorder::default();
    let hour = Duration::from_hours(1);
    let up = c.submit(Time(0), AllocSpec::simple(t, v, 2, hour)).unwrap();
    let runner = c.submit(Time(0), AllocSpec::simple(t, v, 2, hour)).unwrap();
    let after = |on| {
        let mut s = AllocSpec::simple(t, v, 1, hour);
        s.depends_on = vec![Dependency {
            on,
            condition: DependencyCondition::Success,
        }];
        s
    };
    let down = c.submit(Time(0), after(up)).unwrap();
    let down2 = c.submit(Time(0), after(down)).unwrap();
    pass(&mut c, Time(0), &mut w);
    assert!(c.engine.take_ended().is_empty());
    assert!(
        c.engine.take_nodes(runner).is_empty(),
        "a running allocation keeps its nodes"
    );
    assert_eq!(c.engine.allocation(runner).unwrap().nodes.len(), 2);
    c.apply(Time(10_000), Input::Exited(up, EndReason::ExitFailure), &mut w)
        .unwrap();
    pass(&mut c, Time(10_000), &mut w);
    let mut ended = c.engine.take_ended();
    ended.sort();
    assert_eq!(ended, vec![up, down, down2]);
    assert_eq!(c.engine.allocation(down2).unwrap().state, AllocState::Cancelled);
    assert_eq!(c.engine.take_nodes(up).len(), 2);
    assert!(c.engine.allocation(up).unwrap().nodes.is_empty());
    c.apply(Time(20_000), Input::Exited(runner, EndReason::Success), &mut w)
        .unwrap();
    assert_eq!(c.engine.take_ended(), vec![runner]);
    assert!(c.engine.take_ended().is_empty());
}
