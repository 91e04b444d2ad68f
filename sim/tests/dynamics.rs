//! Cluster dynamics: node failures and requeue, heartbeat grace, drain, the failure injector, energy cost.

mod common;
use common::*;
use lattice_engine::{Duration, Policy, Time};
use lattice_sim::{FailureModel, SimConfig, SimResult, simulate};
use lattice_traces::{TraceEvent, TraceEventKind};

fn ev(t: u64, kind: TraceEventKind) -> TraceEvent {
    TraceEvent {
        time: Time::from_secs(t),
        kind,
        line: 0,
    }
}

fn node(n: &str) -> String {
    n.to_string()
}

fn run_events(jobs: Vec<lattice_traces::TraceJob>, events: Vec<TraceEvent>, n: u32) -> SimResult {
    let mut w = workload(jobs);
    w.events = events;
    let cfg = SimConfig {
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(&w, &nodes(n), &cfg, &mut |_, _| {}).unwrap()
}

/// A hardware failure under A (2 nodes, 100 s) at t=50: A is requeued (on_node_failure, the batch
/// default) with its submit time, sits out that cycle, and restarts from zero on the remaining nodes at
/// the next one; 50 node-seconds × 2 are lost.
#[test]
fn node_failure_requeues_and_keeps_submit_time() {
    let r = run_events(
        vec![job("A", 0, 2, 100, 100)],
        vec![ev(
            50,
            TraceEventKind::NodeFail {
                node: node("n00000"),
                heartbeat: false,
            },
        )],
        3,
    );
    let a = &r.jobs[0];
    assert_eq!((a.submit_s, a.start_s, a.state), (0.0, Some(0.0), "completed"));
    // Restarted at 50.001 (the next cycle), ran 100 s.
    assert_eq!(a.end_s, Some(150.001));
    assert_eq!(r.summary.requeues, 1);
    assert_eq!(r.summary.node_failures, 1);
    assert!((r.summary.lost_node_hours - 100.0 / 3600.0).abs() < 1e-6);
    // Two runs: on n0-n1 until the failure, then on the two healthy nodes n1-n2.
    let run = |start_s, end_s, nodes| lattice_sim::RunSpan {
        job: 0,
        start_s,
        end_s: Some(end_s),
        nodes,
    };
    assert_eq!(
        r.timeline.runs,
        vec![run(0.0, 50.0, vec![(0, 1)]), run(50.001, 150.001, vec![(1, 2)])]
    );
    assert_eq!(r.timeline.events.len(), 1);
    assert_eq!(r.timeline.events[0].kind, lattice_sim::TimelineKind::NodeDown);
}

/// `requeue: never` fails the allocation on a node failure.
#[test]
fn requeue_never_fails() {
    let mut a = job("A", 0, 2, 100, 100);
    a.spec_mut().requeue = lattice_engine::RequeuePolicy::Never;
    let r = run_events(
        vec![a],
        vec![ev(
            50,
            TraceEventKind::NodeFail {
                node: node("n00000"),
                heartbeat: false,
            },
        )],
        3,
    );
    assert_eq!((r.jobs[0].state, r.jobs[0].reason), ("failed", "node_failure"));
}

/// A missed heartbeat only degrades the node: if the heartbeat resumes within the grace period (60 s)
/// nothing happens; otherwise the node goes Down at the end of the grace and the job is requeued.
#[test]
fn heartbeat_grace_period() {
    let resumed = run_events(
        vec![job("A", 0, 2, 100, 100)],
        vec![
            ev(
                10,
                TraceEventKind::NodeFail {
                    node: node("n00000"),
                    heartbeat: true,
                },
            ),
            ev(40, TraceEventKind::NodeRecover { node: node("n00000") }),
        ],
        2,
    );
    assert_eq!((resumed.jobs[0].end_s, resumed.summary.requeues), (Some(100.0), 0));
    let lost = run_events(
        vec![job("A", 0, 2, 100, 100)],
        vec![
            ev(
                10,
                TraceEventKind::NodeFail {
                    node: node("n00000"),
                    heartbeat: true,
                },
            ),
            ev(200, TraceEventKind::NodeRecover { node: node("n00000") }),
        ],
        2,
    );
    // Down at 70 (10 + 60 s grace); back at 200; A restarts then.
    assert_eq!(lost.summary.requeues, 1);
    assert_eq!(lost.jobs[0].end_s, Some(300.0));
}

/// A `settings` event changes the heartbeat grace from its time on: with `agents.grace` at 300 s,
/// the heartbeat that is back at 200 s is within the grace (nothing requeued), where the default
/// 60 s took the node Down at 70 s.
#[test]
fn a_settings_event_changes_the_heartbeat_grace_from_its_time() {
    let settings = lattice_engine::controller::settings::Settings::from([("agents.grace".to_string(), 300_000)]);
    let r = run_events(
        vec![job("A", 0, 2, 100, 100)],
        vec![
            ev(5, TraceEventKind::Settings { settings }),
            ev(
                10,
                TraceEventKind::NodeFail {
                    node: node("n00000"),
                    heartbeat: true,
                },
            ),
            ev(200, TraceEventKind::NodeRecover { node: node("n00000") }),
        ],
        2,
    );
    assert_eq!((r.jobs[0].end_s, r.summary.requeues), (Some(100.0), 0));
}

/// Drain waits for the running allocation, then the node is Drained (not schedulable) until undrain.
#[test]
fn drain_then_undrain() {
    let r = run_events(
        vec![job("A", 0, 1, 100, 100), job("B", 10, 2, 10, 10)],
        vec![
            ev(5, TraceEventKind::Drain { node: node("n00000") }),
            ev(500, TraceEventKind::Undrain { node: node("n00000") }),
        ],
        2,
    );
    // A keeps running on the draining node; B needs both nodes: it waits for the undrain.
    assert_eq!(r.jobs[0].end_s, Some(100.0));
    assert_eq!(start_of(&r, "B"), 500.0);
}

/// Conformance drift (book: "Drift Response"): the drifted node keeps its running work and takes no
/// new work until its agent's fingerprint conforms again; then it is back at once.
#[test]
fn a_drifted_node_drains_until_it_conforms() {
    let drift = |at, drifted| {
        ev(
            at,
            TraceEventKind::Drift {
                node: node("n00000"),
                drifted,
            },
        )
    };
    let r = run_events(
        vec![job("A", 0, 1, 100, 100), job("B", 10, 2, 10, 10)],
        vec![drift(5, true), drift(300, false)],
        2,
    );
    assert_eq!(r.jobs[0].end_s, Some(100.0));
    assert_eq!(start_of(&r, "B"), 300.0);
    // Without the drift, B starts when A ends.
    let plain = run_events(vec![job("A", 0, 1, 100, 100), job("B", 10, 2, 10, 10)], vec![], 2);
    assert_eq!(start_of(&plain, "B"), 100.0);
}

/// A node still drifted 24 h after its drift (book: "drift_remediation_timeout") goes Down: the long
/// job on it is requeued and restarts elsewhere; a node that conforms in time never goes Down.
#[test]
fn a_node_not_remediated_within_a_day_goes_down() {
    let drift = |at, n: &str, drifted| ev(at, TraceEventKind::Drift { node: node(n), drifted });
    let day = 86_400;
    let r = run_events(
        vec![job("A", 0, 1, 3 * day, 2 * day)],
        vec![
            drift(10, "n00000", true),
            drift(10, "n00001", true),
            drift(3600, "n00001", false),
        ],
        2,
    );
    assert_eq!(r.summary.drifts, 2);
    assert_eq!(r.summary.drift_timeouts, 1);
    assert_eq!(r.summary.requeues, 1);
    // A ran on n00000 from 0; at 10 + 24 h it was stopped and started again on n00001 (at the next
    // pass, a millisecond on).
    let end = r.jobs[0].end_s.unwrap();
    assert!((end - (10 + day + 2 * day) as f64).abs() < 0.01, "{end}");
    // Remediated in time: nothing goes Down.
    let ok = run_events(
        vec![job("A", 0, 1, 3 * day, 2 * day)],
        vec![drift(10, "n00000", true), drift(day, "n00000", false)],
        2,
    );
    assert_eq!(ok.summary.drift_timeouts, 0);
    assert_eq!(ok.summary.requeues, 0);
    assert_eq!(ok.jobs[0].end_s, Some((2 * day) as f64));
}

/// The seeded failure injector: deterministic for a seed, different across seeds, and everything still
/// finishes (requeue) with invariants checked throughout.
#[test]
fn failure_injector_is_seeded() {
    let w = workload((0..40).map(|i| job(&format!("j{i}"), i * 30, 2, 600, 500)).collect());
    let run = |seed| {
        let cfg = SimConfig {
            seed,
            failures: Some(FailureModel {
                mtbf: Duration::from_hours(2),
                repair: Duration::from_mins(30),
            }),
            check_invariants: true,
            ..SimConfig::default()
        };
        simulate(&w, &nodes(8), &cfg, &mut |_, _| {}).unwrap()
    };
    let (a, b, c) = (run(1), run(1), run(2));
    assert!(a.summary.injected_failures > 0);
    assert_eq!(a.jobs, b.jobs);
    assert_ne!(
        (a.summary.injected_failures, a.summary.lost_node_hours),
        (c.summary.injected_failures, c.summary.lost_node_hours)
    );
    assert!(
        a.jobs
            .iter()
            .all(|j| j.state == "completed" || j.reason == "node_failure")
    );
}

/// Energy: 2 nodes of 500 W for 2 h = 2 kWh; price 0.10 for the first hour, 0.30 after: cost 0.4.
#[test]
fn energy_cost_integrates_price_over_runs() {
    let mut inv = nodes(2);
    for n in &mut inv.nodes {
        n.capabilities.power_w = 500;
    }
    let mut w = workload(vec![job("A", 0, 2, 7200, 7200)]);
    w.events = vec![
        ev(0, TraceEventKind::EnergyPrice { price: 0.10 }),
        ev(3600, TraceEventKind::EnergyPrice { price: 0.30 }),
    ];
    let r = simulate(
        &w,
        &inv,
        &SimConfig {
            policy: Policy::EASY,
            ..SimConfig::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.summary.energy_kwh, 2.0);
    assert!((r.summary.energy_cost - 0.4).abs() < 1e-9, "{}", r.summary.energy_cost);
}

/// A SIGTERM grace: a job past its walltime (100 s, would run 200 s) ends at walltime + grace (130 s),
/// still `walltime_exceeded`; one that finishes inside the grace ends at its own end; without a grace
/// the kill lands at the walltime. The job queued behind waits for the real end.
#[test]
fn walltime_grace_delays_the_kill() {
    let mut w = workload(vec![
        job("A", 0, 2, 100, 200),
        job("B", 0, 1, 100, 110),
        job("C", 1, 3, 10, 10),
    ]);
    w.events = Vec::new();
    let run = |grace: u64| {
        let cfg = SimConfig {
            check_invariants: true,
            walltime_grace: Duration::from_secs(grace),
            ..SimConfig::default()
        };
        simulate(&w, &nodes(3), &cfg, &mut |_, _| {}).unwrap()
    };
    let r = run(30);
    let (a, b, c) = (&r.jobs[0], &r.jobs[1], &r.jobs[2]);
    assert_eq!(
        (a.end_s, a.state, a.reason),
        (Some(130.0), "failed", "walltime_exceeded")
    );
    assert_eq!((b.end_s, b.reason), (Some(110.0), "walltime_exceeded"));
    assert_eq!(c.start_s, Some(130.0));
    let r = run(0);
    assert_eq!(r.jobs[0].end_s, Some(100.0));
    assert_eq!(r.jobs[1].end_s, Some(100.0));
    assert_eq!(r.jobs[2].start_s, Some(100.0));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        /// Under random injected failures, every allocation keeps its original submit time through any
        /// number of requeues, never starts before it, and ends completed or failed by a node failure
        /// (invariants checked at every event).
        #[test]
        fn requeued_allocations_keep_their_submit_time(
            jobs in prop::collection::vec((0u64..120, 1u32..4, 60u64..900, 0u8..3), 1..30),
            seed in 0u64..1000,
        ) {
            let mut t = 0;
            let trace: Vec<_> = jobs.iter().enumerate().map(|(i, &(gap, k, run, policy))| {
                t += gap;
                let mut j = job(&format!("j{i}"), t, k, run, run);
                j.spec_mut().requeue = match policy {
                    0 => lattice_engine::RequeuePolicy::Never,
                    1 => lattice_engine::RequeuePolicy::OnNodeFailure,
                    _ => lattice_engine::RequeuePolicy::Always,
                };
                j
            }).collect();
            let w = workload(trace.clone());
            let cfg = SimConfig {
                seed,
                failures: Some(FailureModel { mtbf: Duration::from_hours(1), repair: Duration::from_mins(10) }),
                check_invariants: true,
                ..SimConfig::default()
            };
            let r = simulate(&w, &nodes(6), &cfg, &mut |_, _| {}).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (rec, j) in r.jobs.iter().zip(&trace) {
                prop_assert_eq!(rec.submit_s, j.submit.as_secs_f64(), "{}", rec.id);
                if let Some(s) = rec.start_s {
                    prop_assert!(s >= rec.submit_s);
                }
                prop_assert!(rec.state == "completed" || rec.reason == "node_failure", "{:?}", rec);
            }
        }
    }
}

/// Prologue failure: n00000's image cache is broken. A (1 node) starts there at 0, the agent reports the
/// failure 5 s later, and A is retried on a different node at the next cycle (its submit time kept).
/// When every node is broken, A fails after the initial attempt plus 3 retries (`prologue_failure`);
/// `node_recover` repairs the cache.
#[test]
fn prologue_failure_retries_on_other_nodes() {
    let bad = |n: &str| ev(0, TraceEventKind::PrologueFail { node: node(n) });
    let r = run_events(vec![job("A", 1, 1, 100, 100)], vec![bad("n00000")], 3);
    let a = &r.jobs[0];
    assert_eq!(
        (a.submit_s, a.start_s, a.end_s, a.state),
        (1.0, Some(1.0), Some(106.001), "completed")
    );
    assert_eq!(r.summary.prologue_failures, 1);
    assert_eq!(r.summary.requeues, 0, "a prologue retry is not a requeue");

    let r = run_events(vec![job("A", 1, 1, 100, 100)], vec![bad("n00000"), bad("n00001")], 2);
    let a = &r.jobs[0];
    assert_eq!((a.state, a.reason), ("failed", "prologue_failure"));
    assert_eq!(r.summary.prologue_failures, 4);

    // Repaired before the retry: the retry may use the node again.
    let r = run_events(
        vec![job("A", 1, 1, 100, 100)],
        vec![
            bad("n00000"),
            ev(3, TraceEventKind::NodeRecover { node: node("n00000") }),
        ],
        1,
    );
    assert_eq!((r.jobs[0].state, r.summary.prologue_failures), ("completed", 1));
}

/// Nodes join the running site (`node_added`, a rack of two by `prefix` and `count`): B, waiting
/// behind A for the site's two nodes, starts on them when they join at 600 s (not when A ends at
/// 3600 s); utilization counts them from when they joined. A node of an unknown vCluster, a name
/// already in the inventory and an entry without a name are reported, not added.
#[test]
fn nodes_that_join_are_scheduled_and_counted_from_their_join() {
    let text = [
        r#"{"ts": 0, "type": "submit", "alloc": {"id": "A", "nodes": 2, "walltime": 3600, "duration": 3600}}"#,
        r#"{"ts": 0, "type": "submit", "alloc": {"id": "B", "nodes": 2, "walltime": 3600, "duration": 3600}}"#,
        r#"{"ts": 600, "type": "node_added", "node": {"prefix": "rack7-", "count": 2, "cpu_cores": 64}}"#,
        r#"{"ts": 700, "type": "node_added", "node": {"name": "x", "vcluster": "nowhere"}}"#,
        r#"{"ts": 700, "type": "node_added", "node": {"name": "n00000"}}"#,
        r#"{"ts": 700, "type": "node_added", "node": {"gpu_count": 4}}"#,
        r#"{"ts": 800, "type": "drain", "node": "rack7-0001"}"#,
    ]
    .join("\n");
    let w = lattice_traces::parse_jsonl("t.jsonl", &text);
    assert_eq!(w.skipped.get("invalid_field"), Some(&1), "{:?}", w.problems);
    assert!(w.problems[0].message.contains("name"), "{:?}", w.problems);
    assert_eq!(w.problems[0].line, 6);
    let cfg = SimConfig {
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "A"), 0.0);
    assert_eq!(start_of(&r, "B"), 600.0, "B starts on the joined nodes");
    assert_eq!((r.summary.nodes, r.summary.nodes_added), (4, 2));
    assert_eq!(r.summary.skipped.get("unknown_vcluster"), Some(&1));
    assert_eq!(r.summary.skipped.get("node_added_refused"), Some(&1));
    assert!(
        r.summary
            .notes
            .iter()
            .any(|n| n.contains("node_added refused: node `n00000` is already in the inventory")),
        "{:?}",
        r.summary.notes
    );
    // Span 0..4200 s; 2 nodes all along, 2 from 600 s; 4 × 3600 node-seconds run.
    let capacity = 2.0 * 4200.0 + 2.0 * 3600.0;
    assert!(
        (r.summary.utilization - 4.0 * 3600.0 / capacity).abs() < 1e-6,
        "{}",
        r.summary.utilization
    );
    // The joined nodes are nodes like the others: the drain event finds one.
    assert_eq!(r.summary.skipped.get("unknown_node"), None);
}

/// A `node_capabilities` event (what production's agent discovered where the inventory leaves
/// GPUs unset): n00000, held by A when it comes, takes 4 GH200 GPUs when A ends at 100 s, and G,
/// asking for a GH200 at 150 s, runs there; without the event G cannot run anywhere. A node the
/// site does not have is reported, and an unknown key skips the line naming it.
#[test]
fn discovered_capabilities_schedule_the_node_from_when_it_is_free() {
    let text = |event: &str| {
        [
            r#"{"ts": 0, "type": "submit", "alloc": {"id": "A", "nodes": 2, "walltime": 100, "duration": 100}}"#,
            event,
            r#"{"ts": 2, "type": "node_capabilities", "node": "nowhere", "capabilities": {"gpu_count": 1}}"#,
            r#"{"ts": 3, "type": "node_capabilities", "node": "n00001", "capabilities": {"gpus": 1}}"#,
            r#"{"ts": 150, "type": "submit", "alloc": {"id": "G", "nodes": 1, "walltime": 10, "duration": 10, "constraints": {"gpu_type": "GH200"}}}"#,
        ]
        .join("\n")
    };
    let cfg = SimConfig {
        check_invariants: true,
        ..SimConfig::default()
    };
    let event = r#"{"ts": 1, "type": "node_capabilities", "node": "n00000", "capabilities": {"gpu_count": 4, "gpu_type": "GH200"}}"#;
    let w = lattice_traces::parse_jsonl("t.jsonl", &text(event));
    assert_eq!(w.skipped.get("invalid_field"), Some(&1), "{:?}", w.problems);
    assert!(w.problems[0].message.contains("gpus"), "{:?}", w.problems);
    let r = simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "A"), 0.0);
    assert_eq!(start_of(&r, "G"), 150.0);
    assert_eq!(r.summary.skipped.get("unknown_node"), Some(&1));

    let w = lattice_traces::parse_jsonl("t.jsonl", &text(r#"{"ts": 1, "type": "storage_recover"}"#));
    let r = simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap();
    assert!(
        r.jobs.iter().find(|j| j.id == "G").is_none_or(|g| g.start_s.is_none()),
        "no GH200 without the event"
    );
}
