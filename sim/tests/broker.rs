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
    j.spec.preemption_class = PreemptionClass::new(class).unwrap();
    j.spec.checkpoint = CheckpointSpec {
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
    c.spec.sensitive_claim = true;
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
