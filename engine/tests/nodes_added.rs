//! Nodes joining a running site (the inventory, SMD, gained them): [`Engine::add_node`] gives the
//! next id, joins the node's class and pool, and the next pass schedules on it. Refusals change
//! nothing.

use lattice_engine::*;

fn site(nodes: u32, policy: Policy) -> (Engine, TenantId, VClusterId) {
    let mut e = Engine::new(
        EngineConfig::new(policy),
        (0..nodes).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
    )
    .unwrap();
    let t = e.add_tenant("physics");
    let v = e.add_vcluster("batch");
    (e, t, v)
}

/// Commits every proposal the pass made; returns (allocation, nodes) started.
fn pass(e: &mut Engine, now: Time) -> Vec<(AllocId, Vec<NodeId>)> {
    e.schedule(now);
    let mut started = Vec::new();
    while let Some(p) = e.poll_proposal() {
        e.handle_commit(now, p.alloc).unwrap();
        started.push((p.alloc, p.nodes));
    }
    started
}

fn gpu_node(name: &str) -> NodeSpec {
    let mut n = NodeSpec::plain(name);
    n.capabilities.gpu_type = Some("GH200".into());
    n.capabilities.gpu_count = 4;
    n
}

/// A 3-node job waits behind a 2-node one on a 4-node site; two nodes join at 60 s: a pass is due
/// then, and the job starts there, on a joined node.
#[test]
fn a_joined_node_is_scheduled_at_the_next_pass() {
    let (mut e, t, v) = site(4, Policy::EASY);
    let long = e
        .handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(2)))
        .unwrap();
    let wide = e
        .handle_submit(Time(0), AllocSpec::simple(t, v, 3, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut e, Time(0)).len(), 1);
    assert!(
        pass(&mut e, Time::from_secs(30)).is_empty(),
        "3 nodes do not fit in the 2 free"
    );
    let at = Time::from_secs(60);
    let ids: Vec<NodeId> = (4..6)
        .map(|i| e.add_node(at, NodeSpec::plain(format!("n{i}"))).unwrap())
        .collect();
    assert_eq!(ids, [NodeId(4), NodeId(5)]);
    assert_eq!(e.nodes().len(), 6);
    assert_eq!(e.free_nodes(), 4);
    assert_eq!(e.class_count(), 1, "the joined nodes are like the others");
    assert_eq!(e.next_wakeup(), Some(at), "a pass is due when nodes join");
    let started = pass(&mut e, at);
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].0, wide);
    assert!(started[0].1.iter().any(|n| ids.contains(n)), "{:?}", started[0].1);
    assert_eq!(e.allocation(long).unwrap().state, AllocState::Running);
}

/// A GPU node joins a CPU-only site: a new class; a GPU job (refused before: nothing could run it)
/// is accepted and runs there.
#[test]
fn a_joined_node_of_a_new_kind_makes_a_new_class() {
    let (mut e, t, v) = site(2, Policy::EASY);
    let mut gpu_job = AllocSpec::simple(t, v, 1, Duration::from_hours(1));
    gpu_job.constraints.gpu_count = Some(4);
    assert!(matches!(
        e.handle_submit(Time(0), gpu_job.clone()),
        Err(SubmitError::Unsatisfiable { .. })
    ));
    let g = e.add_node(Time(10), gpu_node("g0")).unwrap();
    assert_eq!(e.class_count(), 2);
    assert_eq!(e.free_by_class(), &[2, 1]);
    let id = e.handle_submit(Time(10), gpu_job).unwrap();
    assert_eq!(pass(&mut e, Time(10)), [(id, vec![g])]);
}

/// A node that joins Down is not free until it is enabled.
#[test]
fn a_node_that_joins_down_waits_for_its_enable() {
    let (mut e, t, v) = site(1, Policy::EASY);
    let mut spec = NodeSpec::plain("late");
    spec.state = NodeState::Down;
    let n = e.add_node(Time(0), spec).unwrap();
    let id = e
        .handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    assert!(pass(&mut e, Time(0)).is_empty());
    assert_eq!(e.free_nodes(), 1);
    e.handle_node_event(Time(5), n, NodeEvent::Enable).unwrap();
    assert_eq!(pass(&mut e, Time(5)), [(id, vec![NodeId(0), n])]);
}

/// Refused with nothing changed: a name already there, a home vCluster that schedules on the shared
/// pool, a second class under the pyss-compatible policy (a node like the others is accepted).
#[test]
fn refused_joins_change_nothing() {
    let (mut e, _, v) = site(2, Policy::EASY);
    let before = (e.nodes().len(), e.class_count(), e.free_nodes(), e.next_wakeup());
    assert!(matches!(
        e.add_node(Time(0), NodeSpec::plain("n1")),
        Err(EngineError::DuplicateNode(n)) if n == "n1"
    ));
    let mut homed = NodeSpec::plain("h0");
    homed.home_vcluster = Some(v);
    let err = e.add_node(Time(0), homed).unwrap_err();
    assert!(err.to_string().contains("shared pool"), "{err}");
    assert_eq!(
        (e.nodes().len(), e.class_count(), e.free_nodes(), e.next_wakeup()),
        before
    );

    let (mut p, _, _) = site(2, Policy::PyssEasy);
    assert!(matches!(
        p.add_node(Time(0), gpu_node("g0")),
        Err(EngineError::PyssHeterogeneous(2))
    ));
    assert_eq!((p.nodes().len(), p.class_count()), (2, 1));
    assert_eq!(p.add_node(Time(0), NodeSpec::plain("n2")).unwrap(), NodeId(2));
}

/// Home nodes of a vCluster not registered yet make its pool: the vCluster registered afterwards
/// schedules there (and only there), and work already running on the shared pool keeps its place
/// in the running set (it still ends and frees its nodes).
#[test]
fn home_nodes_for_a_new_vcluster_make_its_pool() {
    let (mut e, t, shared) = site(2, Policy::EASY);
    let running = e
        .handle_submit(Time(0), AllocSpec::simple(t, shared, 2, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut e, Time(0)).len(), 1);
    // The next vCluster's id is 1.
    let mut home = NodeSpec::plain("ml0");
    home.home_vcluster = Some(VClusterId(1));
    let h = e.add_node(Time(10), home).unwrap();
    let ml = e.add_vcluster("ml");
    assert_eq!(ml, VClusterId(1));
    let job = e
        .handle_submit(Time(10), AllocSpec::simple(t, ml, 1, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut e, Time(10)), [(job, vec![h])]);
    assert_eq!(e.running_estimates().count(), 2);
    e.handle_completion(Time(20), running, EndReason::Success).unwrap();
    assert_eq!(e.running_estimates().count(), 1);
    assert_eq!(e.free_nodes(), 2);
}

/// A job submitted before a new kind of node joins may run on it: its eligible classes grow (here
/// 64-core nodes join while a 2-node job waits behind the site's only two).
#[test]
fn waiting_work_may_run_on_a_class_that_joined_after_it() {
    let (mut e, t, v) = site(2, Policy::EASY);
    e.handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(2)))
        .unwrap();
    let waiting = e
        .handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut e, Time(0)).len(), 1);
    let joined: Vec<NodeId> = (0..2)
        .map(|i| {
            let mut n = NodeSpec::plain(format!("big{i}"));
            n.capabilities.cpu_cores = 64;
            e.add_node(Time(60), n).unwrap()
        })
        .collect();
    assert_eq!(e.class_count(), 2);
    assert_eq!(pass(&mut e, Time(60)), [(waiting, joined)]);
}

/// A node's capabilities change (its agent discovered GPUs the inventory left unset): it moves to
/// the class of nodes like it, a pass is due, and work that needs it runs there.
#[test]
fn discovered_capabilities_move_a_node_to_its_class() {
    let (mut e, t, v) = site(2, Policy::EASY);
    let at = Time::from_secs(30);
    let caps = gpu_node("x").capabilities;
    assert!(e.set_capabilities(at, NodeId(1), caps.clone()).unwrap());
    assert_eq!(e.class_count(), 2);
    assert_eq!(e.free_by_class(), &[1, 1]);
    assert_eq!(e.node(NodeId(1)).unwrap().spec.capabilities, caps);
    assert_eq!(e.next_wakeup(), Some(at), "a pass is due");
    let mut gpu_job = AllocSpec::simple(t, v, 1, Duration::from_hours(1));
    gpu_job.constraints.gpu_count = Some(4);
    let id = e.handle_submit(at, gpu_job).unwrap();
    assert_eq!(pass(&mut e, at), [(id, vec![NodeId(1)])]);
    // Node 0 joins the same class: the emptied class keeps no node.
    assert!(e.set_capabilities(at, NodeId(0), caps).unwrap());
    assert_eq!(e.class_count(), 2);
    assert_eq!(e.free_by_class(), &[0, 1]);
}

/// A held node takes its new capabilities when it is released (its allocation's resources were
/// counted by the class it started on); the same capabilities again change nothing; under the
/// pyss-compatible policy a second class is refused, with nothing changed.
#[test]
fn a_held_node_takes_its_capabilities_when_released() {
    let (mut e, t, v) = site(2, Policy::EASY);
    let id = e
        .handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut e, Time(0)).len(), 1);
    let caps = gpu_node("x").capabilities;
    assert!(
        !e.set_capabilities(Time(5), NodeId(0), caps.clone()).unwrap(),
        "held: later"
    );
    assert_eq!(e.class_count(), 1);
    assert_eq!(e.node(NodeId(0)).unwrap().spec.capabilities.gpu_count, 0);
    e.handle_completion(Time(10), id, EndReason::Success).unwrap();
    assert_eq!(e.node(NodeId(0)).unwrap().spec.capabilities, caps);
    assert_eq!(e.class_count(), 2);
    assert_eq!(e.free_by_class(), &[1, 1]);
    assert!(e.set_capabilities(Time(11), NodeId(0), caps).unwrap());

    let (mut p, _, _) = site(2, Policy::PyssEasy);
    assert!(matches!(
        p.set_capabilities(Time(0), NodeId(0), gpu_node("x").capabilities),
        Err(EngineError::PyssHeterogeneous(2))
    ));
    assert_eq!((p.class_count(), p.free_by_class()), (1, &[2][..]));
    // A held node's new capabilities are refused when they come, not dropped at its release.
    let (mut p, t, v) = site(2, Policy::PyssEasy);
    p.handle_submit(Time(0), AllocSpec::simple(t, v, 2, Duration::from_hours(1)))
        .unwrap();
    assert_eq!(pass(&mut p, Time(0)).len(), 1);
    assert!(matches!(
        p.set_capabilities(Time(1), NodeId(0), gpu_node("x").capabilities),
        Err(EngineError::PyssHeterogeneous(2))
    ));
}
