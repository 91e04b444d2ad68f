//! The checkpoint broker's cost model in the simulator, storage outages, and the walltime/checkpoint
//! race (book: "Checkpoint Broker").

mod common;
use common::*;
use lattice_engine::{CheckpointKind, CheckpointSpec, CostWeights, Policy, PreemptionClass, Time};
use lattice_sim::{SimResult, simulate};

const H: u64 = 3600;

fn checkpointable(
    id: &str,
    submit: u64,
    nodes: u32,
    req: u64,
    run: u64,
    class: u8,
    minutes: Option<f64>,
) -> lattice_traces::TraceJob {
    let mut j = job(id, submit, nodes, req, run);
    j.spec_mut().preemption_class = PreemptionClass::new(class).unwrap();
    j.spec_mut().checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: minutes,
        ..Default::default()
    };
    j
}

fn run(w: &lattice_traces::Workload, outages: Vec<(Time, Time)>) -> SimResult {
    let mut cfg = weighted(Policy::EASY, CostWeights::default());
    cfg.storage_outages = outages;
    simulate(w, &nodes(4), &cfg, &mut |_, _| {}).unwrap()
}

/// A 24-hour, 4-node job with no estimate: write time 4 × 96 GB / 100 GB/s = 3.84 s, cost ≈ 57.6; the
/// value (GPU-seconds at risk × failure probability) passes it after about 3.2 h without a checkpoint, so
/// the broker checkpoints it roughly every 3.2 h: 7 times in 24 h, all successful.
#[test]
fn broker_checkpoints_when_value_exceeds_cost() {
    let w = workload(vec![checkpointable("J", 0, 4, 25 * H, 24 * H, 1, None)]);
    let r = run(&w, vec![]);
    assert!(
        (5..=9).contains(&r.summary.checkpoint_hints),
        "{}",
        r.summary.checkpoint_hints
    );
    assert_eq!(r.summary.checkpoint_success_rate, 1.0);
}

/// No checkpoint is hinted while storage is down (here: the whole run).
#[test]
fn storage_outage_stops_checkpoints() {
    let w = workload(vec![checkpointable("J", 0, 4, 25 * H, 24 * H, 1, None)]);
    let r = run(&w, vec![(Time::ZERO, Time::from_secs(30 * H))]);
    assert_eq!(r.summary.checkpoint_hints, 0);
}

/// During an outage, checkpointable allocations are effectively non-preemptible for priority, but a
/// sensitive claim still takes its nodes: the victim is killed (Failed, not Suspended).
#[test]
fn outage_blocks_priority_preemption_but_claims_kill() {
    let outage = vec![(Time::from_secs(100), Time::from_secs(10 * H))];
    let w = workload(vec![
        checkpointable("L", 0, 4, 10 * H, 5 * H, 1, Some(1.0)),
        checkpointable("H", 200, 4, H, H, 5, None),
    ]);
    let r = run(&w, outage.clone());
    assert_eq!(r.summary.preemptions, 0);
    assert_eq!(start_of(&r, "H"), (5 * H) as f64);

    let mut c = job("C", 200, 2, H, H);
    c.spec_mut().sensitive_claim = true;
    let w = workload(vec![checkpointable("L", 0, 4, 10 * H, 5 * H, 1, Some(1.0)), c]);
    let r = run(&w, outage);
    let l = &r.jobs[0];
    assert_eq!((l.state, l.reason), ("failed", "preemption_killed"));
    assert_eq!(start_of(&r, "C"), 230.0);
}

/// Walltime beats a checkpoint in progress: L's preemption checkpoint (10 min) starts at 3600 but its
/// walltime ends at 4000: it is killed at walltime (not suspended) and H starts then.
#[test]
fn walltime_wins_the_race_with_a_checkpoint() {
    let w = workload(vec![
        checkpointable("L", 0, 4, 4000, 5000, 1, Some(10.0)),
        checkpointable("H", H, 4, H, H, 5, None),
    ]);
    let r = run(&w, vec![]);
    let l = &r.jobs[0];
    assert_eq!((l.state, l.reason, l.preempted), ("failed", "walltime_exceeded", 0));
    assert_eq!(start_of(&r, "H"), 4000.0);
}

/// Checkpoints matter: a worked example of the broker's value. A 24-hour job on 4 of 5 nodes loses
/// node n00000 (hardware) at 10 h = 36,000 s and is requeued onto the 4 healthy nodes at the next cycle
/// (36,000.001 s).
///
/// - Without checkpoints the whole run is lost: 4 × 10 h = 40 node-hours, and the job runs its full
///   24 h again: it ends at 36,000.001 + 86,400 = 122,400.001 s.
/// - With the broker (no estimate: write time 4 × 96 GB / 100 GB/s = 3.84 s; cost = 3.84 + 4 × 3.84 +
///   384 GB × 0.1 = 57.6; value = e × 4 GPUs × (1 − exp(−1e-4 × 4 nodes × e / 3600)) for e seconds
///   since the last checkpoint), value passes cost at e* ≈ 11,387.8 s. The broker looks every 60 s, so
///   the first hint is at 11,400 s; it completes 3.84 s later, so the next is due after
///   11,403.84 + 11,387.8 = 22,791.6 → 22,800 s, then 22,803.84 + 11,387.8 = 34,191.6 → 34,200 s.
///   Only the work since 34,200 s is lost: 4 × 1,800 s = 2 node-hours; the restarted run resumes from
///   34,200 s of work and ends at 36,000.001 + 86,400 − 34,200 = 88,200.001 s — 34,200 s earlier.
#[test]
fn checkpoints_bound_the_work_a_failure_loses() {
    // e* from the cost model, by bisection (value is increasing in e).
    let value = |e: f64| e * 4.0 * (1.0 - (-1e-4 * 4.0 * e / 3600.0).exp());
    let cost = 3.84 + 4.0 * 3.84 + 384.0 * 0.1;
    let (mut lo, mut hi) = (0.0f64, 1e6f64);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if value(mid) > cost { hi = mid } else { lo = mid }
    }
    assert!((hi - 11_387.8).abs() < 0.1, "{hi}");
    let tick = |t: f64| (t / 60.0).ceil() * 60.0;
    let h1 = tick(hi);
    let h2 = tick(h1 + 3.84 + hi);
    let h3 = tick(h2 + 3.84 + hi);
    assert_eq!((h1, h2, h3), (11_400.0, 22_800.0, 34_200.0));

    let fail = |w: &mut lattice_traces::Workload| {
        w.events = vec![lattice_traces::TraceEvent {
            time: Time::from_secs(10 * H),
            kind: lattice_traces::TraceEventKind::NodeFail {
                node: "n00000".into(),
                heartbeat: false,
            },
            line: 0,
        }];
    };
    let sim = |w: &lattice_traces::Workload| {
        let mut cfg = weighted(Policy::EASY, CostWeights::default());
        cfg.decision_log = true;
        simulate(w, &nodes(5), &cfg, &mut |_, _| {}).unwrap()
    };
    let mut with = workload(vec![checkpointable("J", 0, 4, 40 * H, 24 * H, 1, None)]);
    fail(&mut with);
    let mut without = workload(vec![job("J", 0, 4, 40 * H, 24 * H)]);
    fail(&mut without);
    let (a, b) = (sim(&with), sim(&without));

    // Without: everything lost, a full rerun.
    assert_eq!(b.summary.lost_node_hours, 40.0);
    assert_eq!(b.jobs[0].end_s, Some(122_400.001));
    assert_eq!((b.summary.checkpoint_hints, b.summary.broker_checkpoints), (0, 0));

    // With: the three hints before the failure are where the cost model puts them, the restart
    // resumes from the third, and only the 1,800 s since it are lost.
    let hints: Vec<&String> = a.decisions.iter().filter(|d| d.ends_with("checkpoint 0")).collect();
    assert_eq!(
        &hints[..3],
        [
            "11400000 checkpoint 0",
            "22800000 checkpoint 0",
            "34200000 checkpoint 0"
        ]
    );
    assert!(
        a.decisions
            .iter()
            .any(|d| d == "36000001 launch 0 on [1,2,3,4] from 34200000ms"),
        "{:?}",
        a.decisions
    );
    assert_eq!(a.summary.lost_node_hours, 2.0);
    assert_eq!(a.jobs[0].end_s, Some(88_200.001));
    assert_eq!(b.summary.lost_node_hours - a.summary.lost_node_hours, 4.0 * h3 / 3600.0);
    assert_eq!(b.jobs[0].end_s.unwrap() - a.jobs[0].end_s.unwrap(), h3);
    // Every hint completed (storage up); no preemption checkpoints.
    assert_eq!(a.summary.broker_checkpoints, a.summary.checkpoint_hints);
    assert_eq!(a.summary.preemption_checkpoints, 0);
}

/// The broker's measured inputs as production's capture writes them: a slow store
/// (`checkpoint_bandwidth`) makes checkpoints too dear to hint; small GPUs (`gpu_memory`, what the
/// agents reported) make them cheaper, so they come more often than with the 96 GB setting. A
/// value that is not a positive number skips the line naming the field.
#[test]
fn measured_bandwidth_and_gpu_memory_feed_the_broker() {
    let run_with = |events: &[&str]| {
        let mut text = vec![
            r#"{"ts": 0, "type": "submit", "alloc": {"id": "J", "nodes": 4, "walltime": 90000, "duration": 86400, "preemption_class": 1, "checkpoint": {"strategy": "auto"}}}"#.to_string(),
        ];
        text.extend(events.iter().map(|e| e.to_string()));
        let w = lattice_traces::parse_jsonl("b.jsonl", &text.join("\n"));
        let inv = lattice_traces::parse_inventory(
            "i.yaml",
            "nodes:\n  - prefix: g\n    count: 4\n    gpu_count: 4\n    gpu_type: GH200\n",
        )
        .unwrap();
        let r = simulate(
            &w,
            &inv,
            &weighted(Policy::EASY, CostWeights::default()),
            &mut |_, _| {},
        )
        .unwrap();
        (w.problems.len(), r.summary.checkpoint_hints)
    };
    let (_, base) = run_with(&[]);
    assert!(base > 0, "{base}");
    let (problems, slow) = run_with(&[r#"{"ts": 0, "type": "checkpoint_bandwidth", "gbps": 0.001}"#]);
    assert_eq!((problems, slow), (0, 0));
    let small: Vec<String> = (0..4)
        .map(|i| format!(r#"{{"ts": 0, "type": "gpu_memory", "node": "g{i:04}", "gb": 1}}"#))
        .collect();
    let small: Vec<&str> = small.iter().map(String::as_str).collect();
    let (problems, cheap) = run_with(&small);
    assert_eq!(problems, 0);
    assert!(cheap > base, "{cheap} > {base}");
    let (problems, _) = run_with(&[
        r#"{"ts": 0, "type": "checkpoint_bandwidth", "gbps": -1}"#,
        r#"{"ts": 0, "type": "gpu_memory", "gb": 1}"#,
    ]);
    assert_eq!(problems, 2);
}
