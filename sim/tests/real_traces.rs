//! End-to-end replays of the real Parallel Workloads Archive traces in `../shared/traces/`
//! (Feitelson, Tsafrir, Krakov, JPDC 2014). They are required: CI has `../shared` beside the clone.

use lattice_engine::Policy;
use lattice_sim::{SimConfig, SimResult, simulate};
use lattice_traces::{SwfOptions, Workload, homogeneous, read_swf};
use std::path::PathBuf;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(name)
}

fn load(name: &str, pyss: bool) -> Workload {
    let p = trace(name);
    read_swf(
        &p,
        &SwfOptions {
            pyss,
            ..SwfOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{} is required (../shared/traces beside the clone): {e}", p.display()))
}

fn replay(w: &Workload, policy: Policy, check: bool) -> SimResult {
    let n = w.cluster_nodes.expect("header declares the size");
    let cfg = SimConfig {
        policy,
        check_invariants: check,
        ..SimConfig::default()
    };
    simulate(w, &homogeneous(n), &cfg, &mut |_, _| {}).unwrap()
}

fn bytes(r: &SimResult) -> (String, String) {
    let mut csv = String::new();
    for j in &r.jobs {
        j.csv_row(&mut csv);
    }
    // Everything but the real-time cycle cost must be byte-identical.
    let mut s = r.summary.clone();
    s.cycle_cpu_ms_mean = 0.0;
    s.cycle_cpu_ms_p99 = 0.0;
    (serde_json::to_string_pretty(&s).unwrap(), csv)
}

/// KTH-SP2 (28,476 jobs, 100 nodes; the site ran EASY) under EASY with the invariant checker on every
/// event: sane metrics, and two runs give identical bytes.
#[test]
fn kth_sp2_easy_is_sane_and_deterministic() {
    let w = load("KTH-SP2-1996-2.1-cln.swf.gz", false);
    assert_eq!(w.cluster_nodes, Some(100));
    assert_eq!(
        w.jobs.len() as u64 + w.skipped_total(),
        28_476,
        "every line is a job or a counted skip"
    );
    let a = replay(&w, Policy::EASY, true);
    let s = &a.summary;
    assert_eq!(s.jobs, w.jobs.len() as u64);
    assert_eq!(s.unfinished, 0);
    assert_eq!(s.completed + s.failed, s.jobs);
    assert!((0.5..0.8).contains(&s.utilization), "utilization {}", s.utilization);
    assert!(s.mean_wait_s > 0.0 && s.p50_wait_s <= s.p95_wait_s && s.p95_wait_s <= s.p99_wait_s);
    assert!(s.p99_wait_s <= s.max_wait_s && s.mean_bsld >= 1.0);
    assert!(s.backfilled > 1000, "EASY backfills on KTH: {}", s.backfilled);
    // Makespan covers the trace's 332.9 days of submissions.
    assert!(s.makespan_s > 332.0 * 86400.0);
    let b = replay(&w, Policy::EASY, false);
    assert_eq!(bytes(&a), bytes(&b), "EASY replay must be byte-identical run to run");

    // Backfilling helps: FCFS on the same trace waits far longer.
    let f = replay(&w, Policy::Fcfs, false);
    assert_eq!(f.summary.backfilled, 0);
    assert!(
        f.summary.mean_wait_s > 2.0 * s.mean_wait_s,
        "fcfs {} vs easy {}",
        f.summary.mean_wait_s,
        s.mean_wait_s
    );
    assert!(f.summary.mean_bsld > s.mean_bsld);
}

/// The pyss reading of KTH drops what pyss drops and replays with the checker on.
#[test]
fn kth_sp2_pyss_compat() {
    let w = load("KTH-SP2-1996-2.1-cln.swf.gz", true);
    let r = replay(&w, Policy::PyssEasy, true);
    assert_eq!(r.summary.walltime_kills, 0, "pyss clamps run time to the request");
    assert_eq!(r.summary.unfinished, 0);
    assert!(r.summary.backfilled > 1000);
}

/// Every SWF trace in ../shared/traces replays under EASY without a panic; skipped lines are counted by
/// reason (hpc2n has jobs with missing run time; KTH one).
#[test]
fn all_five_swf_traces_replay() {
    for (name, min_jobs) in [
        ("KTH-SP2-1996-2.1-cln.swf.gz", 28_000),
        ("LANL-CM5-1994-4.1-cln.swf.gz", 120_000),
        ("NASA-iPSC-1993-3.1-cln.swf.gz", 18_000),
        ("LCG.swf.gz", 188_000),
        ("hpc2n.swf", 3_100),
    ] {
        let w = load(name, false);
        let r = replay(&w, Policy::EASY, false);
        assert!(r.summary.jobs >= min_jobs, "{name}: {} jobs", r.summary.jobs);
        assert_eq!(r.summary.unfinished, 0, "{name}");
        assert_eq!(r.summary.skipped, w.skipped, "{name}: skips reported by reason");
        assert!(r.summary.utilization > 0.0 && r.summary.utilization <= 1.0, "{name}");
    }
    let h = load("hpc2n.swf", false);
    assert_eq!(h.skipped.get("runtime_negative"), Some(&25));
}
