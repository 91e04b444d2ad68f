//! Preemption: classes only move down, the PreemptionDecision cost ranking, the checkpoint/suspend
//! sequence and near-completion protection (book: "Preemption Policy", "Checkpoint Broker").

mod common;
use common::*;
use lattice_engine::{CheckpointKind, CheckpointSpec, CostWeights, Policy, PreemptionClass};
use lattice_sim::{SimResult, simulate};
use proptest::prelude::*;

const H: u64 = 3600;

fn classed(
    id: &str,
    submit: u64,
    nodes: u32,
    req: u64,
    run: u64,
    class: u8,
    ckpt: Option<f64>,
) -> lattice_traces::TraceJob {
    let mut j = job(id, submit, nodes, req, run);
    j.spec_mut().preemption_class = PreemptionClass::new(class).unwrap();
    j.spec_mut().checkpoint = CheckpointSpec {
        kind: if ckpt.is_some() {
            CheckpointKind::Auto
        } else {
            CheckpointKind::None
        },
        estimated_minutes: ckpt,
        mechanism: Default::default(),
    };
    j
}

fn run_scored(w: &lattice_traces::Workload, n: u32) -> SimResult {
    let cfg = weighted(Policy::EASY, CostWeights::default());
    // Streamed records give the same preemption counts, scores and node-time.
    replay_streamed_and_kept(w, &nodes(n), &cfg)
}

fn rec<'a>(r: &'a SimResult, id: &str) -> &'a lattice_sim::JobRecord {
    r.jobs.iter().find(|j| j.id == id).unwrap()
}

/// The preemption sequence. L (class 1, auto checkpoint of 2 min, 5 h of work, 10 h walltime) holds all
/// 4 nodes from 0. At 1 h, H (class 5, 4 nodes, 1 h) arrives: L costs 2·4 + 0.1·60·4 = 32 GPU-minutes
/// (1/10 of its walltime used), H is worth 240: L gets a checkpoint hint at 1 h, is suspended at 1 h 2 min,
/// H runs 1 h 2 min → 2 h 2 min, and L resumes with its 4 h of remaining work, ending at 6 h 2 min. L keeps
/// its submit time (0) and its first start.
#[test]
fn higher_class_preempts_with_checkpoint_and_victim_resumes() {
    let w = workload(vec![
        classed("L", 0, 4, 10 * H, 5 * H, 1, Some(2.0)),
        classed("H", H, 4, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!(start_of(&r, "H"), (H + 120) as f64);
    let l = rec(&r, "L");
    assert_eq!((l.submit_s, l.start_s, l.preempted), (0.0, Some(0.0), 1));
    assert_eq!(l.end_s, Some((2 * H + 120 + 4 * H) as f64));
    assert_eq!(l.state, "completed");
    assert_eq!(r.summary.preemptions, 1);
    assert_eq!(r.summary.preemptions_by_reason.get("priority"), Some(&1));
    assert_eq!(r.summary.checkpoint_success_rate, 1.0);
    assert_eq!(r.summary.suspended_requeues, 1);
    // Node-time counts the runs only: L held its 4 nodes 1 h 2 min + 4 h, not its 6 h 2 min span.
    assert_eq!(l.run_s, Some((5 * H + 120) as f64));
    assert_eq!(r.timeline.runs.len(), 3, "L twice, H once");
    // Without the timeline (no report asks for it) the records and the summary are the same, and
    // no run is kept.
    let mut cfg = weighted(Policy::EASY, CostWeights::default());
    cfg.keep_timeline = false;
    let lean = simulate(&w, &nodes(4), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(lean.jobs, r.jobs);
    let untimed = |r: &SimResult| {
        let mut v = serde_json::to_value(&r.summary).unwrap();
        for k in lattice_sim::metrics::TIMING_KEYS {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    };
    assert_eq!(untimed(&lean), untimed(&r));
    assert!(lean.timeline.runs.is_empty() && lean.timeline.events.is_empty());
    assert!(
        (r.summary.node_hours - 4.0 * (5.0 + 120.0 / 3600.0 + 1.0)).abs() < 1e-5,
        "{}",
        r.summary.node_hours
    );
    // The timeline: L ran twice on all 4 nodes (0 → 1 h 2 min, 2 h 2 min → 6 h 2 min), H once between;
    // the preemption at 1 h and the checkpoint done 2 min later.
    use lattice_sim::TimelineKind::*;
    let run = |job, start_s, end_s| lattice_sim::RunSpan {
        job,
        start_s,
        end_s: Some(end_s),
        nodes: vec![(0, 3)],
    };
    let (t1, t2) = ((H + 120) as f64, (2 * H + 120) as f64);
    assert_eq!(
        r.timeline.runs,
        vec![run(0, 0.0, t1), run(1, t1, t2), run(0, t2, (6 * H + 120) as f64)]
    );
    let events: Vec<(f64, lattice_sim::TimelineKind)> = r.timeline.events.iter().map(|e| (e.time_s, e.kind)).collect();
    assert_eq!(events, vec![(H as f64, Preemption("priority")), (t1, CheckpointDone)]);
}

/// Preemption only moves down: an equal class waits.
#[test]
fn equal_class_does_not_preempt() {
    let w = workload(vec![
        classed("L", 0, 4, 10 * H, 5 * H, 5, Some(2.0)),
        classed("H", H, 4, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!(start_of(&r, "H"), (5 * H) as f64);
    assert_eq!(r.summary.preemptions, 0);
}

/// Near-completion protection: within 5 minutes of its walltime end, L is left to finish.
#[test]
fn near_completion_is_protected() {
    let w = workload(vec![
        classed("L", 0, 4, H, H, 1, Some(2.0)),
        classed("H", H - 200, 4, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!(r.summary.preemptions, 0);
    assert_eq!(start_of(&r, "H"), H as f64);
}

/// A checkpoint slower than the timeout (10 min, extended by 50 % once) gets the victim killed: Failed
/// (not Suspended), reason preemption_killed, at hint + 15 min.
#[test]
fn checkpoint_timeout_kills_the_victim() {
    let w = workload(vec![
        classed("L", 0, 4, 10 * H, 5 * H, 1, Some(20.0)),
        classed("H", H, 4, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    let l = rec(&r, "L");
    assert_eq!((l.state, l.reason), ("failed", "preemption_killed"));
    assert_eq!(l.end_s, Some((H + 900) as f64));
    assert_eq!(start_of(&r, "H"), (H + 900) as f64);
    assert_eq!(r.summary.checkpoint_success_rate, 0.0);
    assert_eq!(r.summary.preemption_kills, 1);
    let failed: Vec<f64> = r
        .timeline
        .events
        .iter()
        .filter(|e| e.kind == lattice_sim::TimelineKind::CheckpointFailed)
        .map(|e| e.time_s)
        .collect();
    assert_eq!(
        failed,
        vec![(H + 900) as f64],
        "the checkpoint fails when the extended timeout ends"
    );
}

/// Without checkpoint support the victim gets SIGTERM and a 30 s grace, then restarts from scratch.
#[test]
fn no_checkpoint_restarts_from_scratch() {
    let w = workload(vec![
        classed("L", 0, 4, 10 * H, 5 * H, 1, None),
        classed("H", 600, 4, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!(start_of(&r, "H"), 630.0);
    // L restarts at 630 + 3600 with its full 5 h.
    assert_eq!(rec(&r, "L").end_s, Some((630 + H + 5 * H) as f64));
}

/// Non-preemptible: checkpoint none and class ≥ 7 is never a victim.
#[test]
fn non_preemptible_allocations_are_skipped() {
    let w = workload(vec![
        classed("L", 0, 4, 10 * H, 5 * H, 7, None),
        classed("H", H, 4, H, H, 9, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!(r.summary.preemptions, 0);
}

/// The cheapest victim goes first: two 2-node class-1 jobs, one with a 1-minute checkpoint, one with 8;
/// a 2-node class-5 job preempts the cheap one only.
#[test]
fn cheapest_victim_first() {
    let w = workload(vec![
        classed("slow", 0, 2, 10 * H, 5 * H, 1, Some(8.0)),
        classed("fast", 0, 2, 10 * H, 5 * H, 1, Some(1.0)),
        classed("H", H, 2, H, H, 5, None),
    ]);
    let r = run_scored(&w, 4);
    assert_eq!((rec(&r, "fast").preempted, rec(&r, "slow").preempted), (1, 0));
    assert_eq!(start_of(&r, "H"), (H + 60) as f64);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Preemption never targets an equal-or-higher class or a sensitive allocation (the simulator checks
    /// every Preempt command), hard invariants hold throughout, and every allocation still finishes.
    #[test]
    fn preemption_only_moves_down(
        jobs in prop::collection::vec((0u64..600, 1u32..5, 60u64..4000, 30u64..4000, 0u8..11, proptest::option::of(0.5f64..20.0)), 1..30),
    ) {
        let mut t = 0;
        let trace = jobs.iter().enumerate().map(|(i, &(gap, k, req, run, class, ck))| {
            t += gap;
            classed(&format!("j{i}"), t, k, req, run, class, ck)
        }).collect();
        let w = workload(trace);
        let cfg = weighted(Policy::EASY, CostWeights { priority: 0.9, ..CostWeights::default() });
        let r = simulate(&w, &nodes(4), &cfg, &mut |_, _| {}).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(r.summary.unfinished, 0);
    }
}
