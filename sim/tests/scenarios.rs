//! Hand-checked schedules. Each scenario lists its jobs and, per policy, the start time of every job as
//! worked out by hand under DESIGN.md §3's rules; the comments show the working.

mod common;
use common::*;
use lattice_engine::{Depth, Policy};

const H: u64 = 3600;

fn expect(policy: Policy, w: &lattice_traces::Workload, n: u32, want: &[(&str, u64)]) {
    let r = run(w, n, policy);
    for (id, s) in want {
        assert_eq!(start_of(&r, id), *s as f64, "{policy}: start of job {id}");
    }
}

/// The seed tutorial's job mix (002_*.txt): 123 and 124 (2 h, 2 nodes each), 125 (1 h, 1 node), 126
/// (4 h, 4 nodes), submitted together in that order on 4 nodes, run times equal to requested times.
///
/// The tutorial's own tables are illustrative and not self-consistent (its "FCFS" runs one job at a time,
/// 9 h at 56.25 %; its backfill table draws 126 on three nodes at hour 3 and the fourth at hour 4). Under
/// DESIGN.md's rules the schedule is the same for every policy, because nothing can jump the queue:
/// - t=0: 123 and 124 start (4 nodes busy). 125 cannot start; EASY's shadow for 125 is 2 h and nothing
///   else fits now (0 nodes free).
/// - t=2h: 123 and 124 end; 125 starts (3 free). 126 needs 4: shadow = 3 h, extra = 0.
/// - t=3h: 125 ends; 126 starts and runs to 7 h.
///
/// Makespan 7 h, utilization (2·2 + 2·2 + 1·1 + 4·4) / (4·7) = 25/28 — the tutorial's backfill figure
/// (89 %), reached here by plain FCFS because the mix has no hole a later job could fill.
#[test]
fn tutorial_job_mix_under_every_policy() {
    let w = workload(vec![
        job("123", 0, 2, 2 * H, 2 * H),
        job("124", 0, 2, 2 * H, 2 * H),
        job("125", 0, 1, H, H),
        job("126", 0, 4, 4 * H, 4 * H),
    ]);
    let want = [("123", 0), ("124", 0), ("125", 2 * H), ("126", 3 * H)];
    for p in [
        Policy::Fcfs,
        Policy::EASY,
        Policy::CONSERVATIVE,
        Policy::Backfill {
            depth: Depth::Limited(0),
        },
        Policy::PyssEasy,
    ] {
        expect(p, &w, 4, &want);
        let r = run(&w, 4, p);
        assert_eq!(r.summary.makespan_s, (7 * H) as f64, "{p}");
        assert_eq!(r.summary.utilization, ((25.0 / 28.0) * 1e6f64).round() / 1e6, "{p}");
        assert_eq!(r.summary.backfilled, 0, "{p}");
    }
}

/// The same four jobs, but the 4-node job 126 is submitted second (order 123, 126, 124, 125).
/// - FCFS: t=0 123 starts; 126 blocks the queue. t=2h 126 starts (to 6 h). t=6h 124 and 125 start.
/// - EASY: t=0 123 starts; 126 is blocked, shadow = 2 h (123's walltime), extra = 4 − 4 = 0. 124 (2 nodes,
///   2 h) fits on the 2 free nodes and ends at 2 h ≤ shadow: backfilled. 125 finds no free node.
///   t=2h 126 starts. t=6h 125 starts. Makespan 7 h instead of FCFS's 8 h.
/// - conservative: as EASY (126 reserved [2h, 6h), 124 fits before it, 125 reserved at 6 h).
#[test]
fn tutorial_mix_reordered_shows_backfill() {
    let w = workload(vec![
        job("123", 0, 2, 2 * H, 2 * H),
        job("126", 0, 4, 4 * H, 4 * H),
        job("124", 0, 2, 2 * H, 2 * H),
        job("125", 0, 1, H, H),
    ]);
    expect(
        Policy::Fcfs,
        &w,
        4,
        &[("123", 0), ("126", 2 * H), ("124", 6 * H), ("125", 6 * H)],
    );
    let backfilled = [("123", 0), ("126", 2 * H), ("124", 0), ("125", 6 * H)];
    for p in [Policy::EASY, Policy::CONSERVATIVE, Policy::PyssEasy] {
        expect(p, &w, 4, &backfilled);
        assert_eq!(run(&w, 4, p).summary.backfilled, 1, "{p}");
    }
    assert_eq!(run(&w, 4, Policy::Fcfs).summary.makespan_s, (8 * H) as f64);
    assert_eq!(run(&w, 4, Policy::EASY).summary.makespan_s, (7 * H) as f64);
}

/// EASY protects only the head; conservative protects everyone. 4 nodes:
/// R (2 nodes, 10 s) runs from 0. At t=1: H (3 nodes, 10 s), B (4 nodes, 20 s), C (1 node, 100 s).
/// - EASY: H is the head, shadow = 10 (R ends), extra = 4 − 3 = 1. B does not fit now. C (1 node) ends
///   at 101 > shadow but uses ≤ extra: backfilled at 1. t=10: H starts (3 free). t=20: B needs 4 but C holds
///   one until 101: B starts at 101.
/// - conservative: H reserved [10, 20), B reserved [20, 40); C would overlap B's reservation, so C is
///   reserved at 40. Starts: H 10, B 20, C 40.
/// - backfill depth 2: H and B both get reservations: as conservative.
/// - first fit (depth 0): C starts at 1 (it fits), H at 10 (3 free beside C), B at 101.
/// - FCFS: H 10, B 20, C 40.
#[test]
fn easy_versus_conservative() {
    let w = workload(vec![
        job("R", 0, 2, 10, 10),
        job("H", 1, 3, 10, 10),
        job("B", 1, 4, 20, 20),
        job("C", 1, 1, 100, 100),
    ]);
    let easy = [("R", 0), ("H", 10), ("C", 1), ("B", 101)];
    let conservative = [("R", 0), ("H", 10), ("B", 20), ("C", 40)];
    expect(Policy::EASY, &w, 4, &easy);
    expect(Policy::PyssEasy, &w, 4, &easy);
    expect(Policy::CONSERVATIVE, &w, 4, &conservative);
    expect(
        Policy::Backfill {
            depth: Depth::Limited(2),
        },
        &w,
        4,
        &conservative,
    );
    expect(
        Policy::Backfill {
            depth: Depth::Limited(0),
        },
        &w,
        4,
        &easy,
    );
    expect(Policy::Fcfs, &w, 4, &conservative);
}

/// Walltime: a job is killed at start + walltime (state failed, reason walltime_exceeded), and
/// reservations use the requested walltime, not the run time. 2 nodes:
/// A (2 nodes, req 10, run 50) is killed at 10; B (2 nodes, submitted at 1) starts at 10.
#[test]
fn walltime_kill_frees_nodes_at_the_requested_time() {
    let w = workload(vec![job("A", 0, 2, 10, 50), job("B", 1, 2, 10, 5)]);
    for p in [Policy::Fcfs, Policy::EASY, Policy::CONSERVATIVE] {
        let r = run(&w, 2, p);
        let a = &r.jobs[0];
        assert_eq!(
            (a.end_s, a.state, a.reason),
            (Some(10.0), "failed", "walltime_exceeded"),
            "{p}"
        );
        assert_eq!(start_of(&r, "B"), 10.0, "{p}");
        assert_eq!(r.summary.walltime_kills, 1);
    }
}

/// Event order (DESIGN.md §3): at one timestamp, completions are applied before arrivals and one pass
/// runs after both. A (2 nodes) ends at 10 exactly when B (2 nodes) arrives: B starts at 10, wait 0.
#[test]
fn completions_before_arrivals_at_one_timestamp() {
    let w = workload(vec![job("A", 0, 2, 10, 10), job("B", 10, 2, 10, 10)]);
    let r = run(&w, 2, Policy::EASY);
    assert_eq!(start_of(&r, "B"), 10.0);
    assert_eq!(r.jobs[1].wait_s, Some(0.0));
}

/// Early completion: reservations are recomputed at every pass. 4 nodes: R (4 nodes, req 100, run 10);
/// H (4 nodes) waits with shadow 100 but starts at 10 when R ends early.
#[test]
fn early_completion_pulls_reservations_earlier() {
    let w = workload(vec![
        job("R", 0, 4, 100, 10),
        job("H", 1, 4, 10, 10),
        job("S", 2, 1, 5, 5),
    ]);
    for p in [Policy::EASY, Policy::CONSERVATIVE, Policy::PyssEasy] {
        let r = run(&w, 4, p);
        assert_eq!(start_of(&r, "H"), 10.0, "{p}");
        assert_eq!(start_of(&r, "S"), 20.0, "{p}");
    }
}

// ----- pyss compatibility: each rule has a scenario that the classic implementation gets wrong ---------

/// Rule: submissions before terminations at one timestamp (a submission runs a pass only if the new job
/// fits in free(t)). 4 nodes. A (2 nodes, req 100, run 10) and, from t=0, X (3 nodes, req 10) waiting
/// (shadow 100, extra 1). At t=10, B (2 nodes, req 5) is submitted and A terminates (early).
/// - pyss: B's submission is handled first: free(10) = 2 (A's estimated end 100 > 10), B fits, so a pass
///   runs. X still does not fit; shadow 100, extra = 2 + 2 − 3 = 1, nonextra = 1; B is short (5 ≤ 90) and
///   2 ≤ extra + nonextra: B starts at 10. Then A's termination: free = 2, X waits for B's end: X at 15.
/// - classic (completions first): A ends, X starts at 10, B waits for X: B at 20.
#[test]
fn pyss_submission_before_termination() {
    let w = workload(vec![
        job("A", 0, 2, 100, 10),
        job("X", 0, 3, 10, 10),
        job("B", 10, 2, 5, 5),
    ]);
    expect(Policy::PyssEasy, &w, 4, &[("A", 0), ("B", 10), ("X", 15)]);
    expect(Policy::EASY, &w, 4, &[("A", 0), ("X", 10), ("B", 20)]);
}

/// Rule: processors count as free at a job's estimated end, before its termination event is handled.
/// 4 nodes. C (2 nodes, req 100, run 10 — ends early) and A (2 nodes, req 10, run 10) start at 0, C first
/// (so C's termination is handled before A's at t=10). X (4 nodes, req 10) waits from t=1. At t=10, B
/// (2 nodes, req 5) is submitted.
/// - pyss: B's submission first: free(10) = 4 − 2 (only C's estimated end 100 is > 10) = 2, so B fits and a
///   pass runs: X (4) does not fit; shadow = 100, extra = 0, nonextra = 2; B is short: starts at 10. The
///   terminations find 2 free nodes, X waits for B: X at 15.
/// - without the rule (A's processors busy until its termination event): free = 0 at B's submission, no
///   pass; C's termination pass: shadow = 10 = now, B is long and extra = 0: no start; A's termination:
///   X starts at 10, B at 20 — which is also the classic schedule.
#[test]
fn pyss_processors_free_at_estimated_end() {
    let w = workload(vec![
        job("C", 0, 2, 100, 10),
        job("A", 0, 2, 10, 10),
        job("X", 1, 4, 10, 10),
        job("B", 10, 2, 5, 5),
    ]);
    expect(Policy::PyssEasy, &w, 4, &[("C", 0), ("A", 0), ("B", 10), ("X", 15)]);
    expect(Policy::EASY, &w, 4, &[("C", 0), ("A", 0), ("X", 10), ("B", 20)]);
}

/// Rule: extra/non-extra accounting. 8 nodes. R (4 nodes, req 100) and Q (4 nodes, req 10) start at 0.
/// At t=1, H (6 nodes, req 10), S (3 nodes, req 50), L (2 nodes, req 200), L2 (1 node, req 200) queue
/// (no pass: nothing fits free(1) = 0). At t=10 Q terminates: free = 4; H blocked, shadow = 100,
/// extra = 4 + 4 − 6 = 2, nonextra = 2.
/// - S is short: 3 ≤ extra + nonextra; nonextra = 2 − 3 = −1 → extra = 1, nonextra = 0.
/// - L is long: 2 > extra = 1, it waits. (Forgetting the `extra += nonextra` rule would start L on one
///   free node: the engine's node selection would find the overcommit.)
/// - L2 is long: 1 ≤ extra: starts at 10.
/// - t=60 S ends: free(60) = 3, shadow 100, extra = 3 + 4 − 6 = 1: L still waits.
/// - t=100 R ends: H starts (free 7 → 1). t=110 H ends: L starts.
///
/// Classic EASY reaches the same schedule (min(free, extra) bookkeeping is equivalent); both run here.
#[test]
fn pyss_extra_nonextra_accounting() {
    let w = workload(vec![
        job("R", 0, 4, 100, 100),
        job("Q", 0, 4, 10, 10),
        job("H", 1, 6, 10, 10),
        job("S", 1, 3, 50, 50),
        job("L", 1, 2, 200, 200),
        job("L2", 1, 1, 200, 200),
    ]);
    let want = [("R", 0), ("Q", 0), ("S", 10), ("L2", 10), ("H", 100), ("L", 110)];
    expect(Policy::PyssEasy, &w, 8, &want);
    expect(Policy::EASY, &w, 8, &want);
}

/// The initial clamp: when extra exceeds free(t), nonextra < 0 and extra := free. 8 nodes. R (6 nodes,
/// req 100) runs; H (4 nodes, req 10) waits: free = 2, shadow = 100, extra = 2 + 6 − 4 = 4 > free, so
/// extra = 2, nonextra = 0. L (3 nodes, long) must wait (3 > 2) although 3 ≤ the unclamped extra; L2
/// (2 nodes, long) starts. (L's own submission at t=2 runs no pass: 3 > free(2) = 2.)
#[test]
fn pyss_extra_is_clamped_to_free() {
    let w = workload(vec![
        job("R", 0, 6, 100, 100),
        job("H", 1, 4, 10, 10),
        job("L", 2, 3, 500, 500),
        job("L2", 3, 2, 500, 500),
    ]);
    let r = run(&w, 8, Policy::PyssEasy);
    assert_eq!(start_of(&r, "L2"), 3.0);
    assert_eq!(start_of(&r, "H"), 100.0);
    // t=100: R ends, free = 6, H starts (free 2, L still waits); t=110: H ends, free 6, L starts.
    assert_eq!(start_of(&r, "L"), 110.0);
}

/// pyss reads SWF input its own way: run = min(run, requested), run <= 0 or requested <= 0 dropped.
#[test]
fn pyss_input_rules() {
    let text = "; MaxProcs: 2\n\
        1 0 -1 30 1 -1 -1 1 20 -1 1 1 1 -1 1 -1 -1 -1\n\
        2 0 -1 0 1 -1 -1 1 20 -1 1 1 1 -1 1 -1 -1 -1\n\
        3 0 -1 5 1 -1 -1 1 -1 -1 1 1 1 -1 1 -1 -1 -1\n";
    let pyss = lattice_traces::parse_swf(
        "t",
        text,
        &lattice_traces::SwfOptions {
            pyss: true,
            ..Default::default()
        },
    );
    assert_eq!(pyss.jobs.len(), 1);
    let r = run(&pyss, 2, Policy::PyssEasy);
    // Clamped to its requested time: completes (not killed) at 20.
    assert_eq!((r.jobs[0].end_s, r.jobs[0].state), (Some(20.0), "completed"));
    let classic = lattice_traces::parse_swf("t", text, &Default::default());
    assert_eq!(classic.jobs.len(), 3);
    let r = run(&classic, 2, Policy::EASY);
    assert_eq!((r.jobs[0].end_s, r.jobs[0].reason), (Some(20.0), "walltime_exceeded"));
}

/// The fake quorum's commit latency delays every start by that much; nodes stay held meanwhile, so a job
/// arriving during the commit window cannot take them.
#[test]
fn commit_latency_delays_starts_and_holds_nodes() {
    use lattice_sim::{SimConfig, simulate};
    let w = workload(vec![job("A", 0, 2, 10, 10), job("B", 1, 1, 10, 10)]);
    let cfg = SimConfig {
        policy: Policy::EASY,
        commit_latency: lattice_engine::Duration::from_secs(3),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(2), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "A"), 3.0);
    assert_eq!(r.jobs[0].end_s, Some(13.0));
    // B is proposed when A ends (13) and committed 3 s later.
    assert_eq!(start_of(&r, "B"), 16.0);
    assert_eq!(r.summary.quorum_commits, 2);
    assert_eq!(r.summary.quorum_rejections, 0);
}

/// Zero-length jobs (SWF run time 0 and no requested time) still hold their nodes for the instant they
/// start: a backfill pass must not hand the same nodes to a later job. 3 nodes: R (2 nodes) runs; H
/// (3 nodes) blocks; Z (1 node, walltime 0) takes the free node; Y (1 node) must wait for Z's end (t=1).
#[test]
fn zero_walltime_jobs_hold_their_nodes_in_the_pass() {
    let w = workload(vec![
        job("R", 0, 2, 100, 100),
        job("H", 1, 3, 10, 10),
        job("Z", 1, 1, 0, 0),
        job("Y", 1, 1, 5, 5),
    ]);
    for p in [Policy::EASY, Policy::CONSERVATIVE, Policy::PyssEasy] {
        let r = run(&w, 3, p);
        assert_eq!(start_of(&r, "Z"), 1.0, "{p}");
        assert_eq!(
            start_of(&r, "Y"),
            1.0,
            "{p}: Z ends at once, Y starts after it at the same instant"
        );
        assert_eq!(r.jobs.iter().find(|j| j.id == "Y").unwrap().nodes, 1);
    }
}
