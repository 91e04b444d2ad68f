//! Data staging on the simulated VAST (book: "Data Staging & Cache Lifecycle").

mod common;
use common::*;
use lattice_engine::{DataMount, Tier, Time};
use lattice_sim::{SimConfig, SimResult, simulate};

/// 300 GB of warm data the job wants hot; VAST writes 10 GB/s, staging may use 30 %: 3 GB/s, 100 s.
fn with_data(mut j: lattice_traces::TraceJob, gb: f64) -> lattice_traces::TraceJob {
    j.spec_mut().data = vec![DataMount {
        source: "s3://datasets/imagenet".into(),
        size_gb: gb,
        tier: Tier::Warm,
        tier_hint: Tier::Hot,
    }];
    j
}

fn run(jobs: Vec<lattice_traces::TraceJob>, outages: Vec<(Time, Time)>) -> SimResult {
    let mut inv = nodes(4);
    inv.storage_bandwidth_gbps = Some(10.0);
    let cfg = SimConfig {
        storage_outages: outages,
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(&workload(jobs), &inv, &cfg, &mut |_, _| {}).unwrap()
}

/// Staging overlaps the queue wait: D waits an hour behind R, its data is hot after 100 s, it starts the
/// moment R ends with no stall; the 100 s of staging were wait time put to use.
#[test]
fn staging_overlaps_queue_wait() {
    let r = run(
        vec![job("R", 0, 4, 3600, 3600), with_data(job("D", 0, 4, 100, 100), 300.0)],
        vec![],
    );
    assert_eq!(start_of(&r, "D"), 3600.0);
    assert_eq!(r.jobs[1].end_s, Some(3700.0));
    assert_eq!(r.summary.staged_allocations, 1);
    assert_eq!(r.summary.staging_overlap_s, 100.0);
    assert_eq!(r.summary.staging_stall_s, 0.0);
}

/// The >80 % rule: with free nodes, D is held until 80 % is staged (80 s), then starts and absorbs the
/// remaining 20 s as an I/O stall.
#[test]
fn eighty_percent_rule() {
    let r = run(
        vec![with_data(job("D", 0, 2, 1000, 100), 300.0), job("E", 0, 1, 10, 10)],
        vec![],
    );
    assert_eq!(start_of(&r, "D"), 80.0);
    assert_eq!(r.jobs[0].end_s, Some(80.0 + 100.0 + 20.0));
    assert_eq!(r.summary.staging_stall_s, 20.0);
    assert_eq!(start_of(&r, "E"), 0.0, "jobs without data are not held");
}

/// A storage outage pauses staging: down from 10 s to 110 s, D reaches 80 % at 180 s instead of 80 s.
#[test]
fn outage_pauses_staging() {
    let r = run(
        vec![with_data(job("D", 0, 2, 1000, 100), 300.0)],
        vec![(Time::from_secs(10), Time::from_secs(110))],
    );
    assert_eq!(start_of(&r, "D"), 180.0);
}
