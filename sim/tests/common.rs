//! Shared helpers: build small workloads by hand and read back start times.
#![allow(dead_code)]

use lattice_engine::{AllocSpec, Duration, Policy, ProjectId, TenantId, Time, VClusterId};
#[allow(unused_imports)]
pub use lattice_sim::SimConfig as Cfg;
use lattice_sim::{SimConfig, SimResult, simulate};
use lattice_traces::{TraceJob, Workload};

/// A job: id, submit (s), nodes, requested walltime (s), actual run time (s).
pub fn job(id: &str, submit_s: u64, nodes: u32, req_s: u64, run_s: u64) -> TraceJob {
    let mut spec = AllocSpec::simple(TenantId(0), VClusterId(0), nodes, Duration::from_secs(req_s));
    spec.project = ProjectId(0);
    TraceJob {
        id: id.to_string(),
        submit: Time::from_secs(submit_s),
        runtime: Some(Duration::from_secs(run_s)),
        exit_ok: true,
        spec: spec.into(),
        deps: Vec::new(),
        line: 0,
        names: None,
    }
}

pub fn workload(jobs: Vec<TraceJob>) -> Workload {
    let mut w = Workload {
        source: "scenario".into(),
        jobs,
        ..Workload::default()
    };
    w.tenants.intern("t");
    w.intern_project("t", "default");
    w.vclusters.intern("default");
    w
}

pub fn nodes(n: u32) -> lattice_traces::Inventory {
    lattice_traces::homogeneous(n)
}

pub fn run(w: &Workload, n: u32, policy: Policy) -> SimResult {
    let cfg = SimConfig {
        policy,
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(w, &nodes(n), &cfg, &mut |_, _| {}).unwrap_or_else(|e| panic!("{policy}: {e}"))
}

/// `(id, start_s)` for every job, in trace order.
pub fn starts(r: &SimResult) -> Vec<(String, Option<f64>)> {
    r.jobs.iter().map(|j| (j.id.clone(), j.start_s)).collect()
}

pub fn start_of(r: &SimResult, id: &str) -> f64 {
    r.jobs
        .iter()
        .find(|j| j.id == id)
        .and_then(|j| j.start_s)
        .unwrap_or_else(|| panic!("job {id} never started"))
}

/// `groups` dragonfly groups of `per_group` plain nodes (conformance = group % fingerprints).
pub fn grouped(groups: u32, per_group: u32, fingerprints: u64) -> lattice_traces::Inventory {
    let mut inv = lattice_traces::homogeneous(groups * per_group);
    for (i, n) in inv.nodes.iter_mut().enumerate() {
        let g = i as u32 / per_group;
        n.group = lattice_engine::GroupId(g);
        n.conformance = lattice_engine::ConformanceFingerprint(g as u64 % fingerprints.max(1));
    }
    inv
}

/// A scored vCluster config for the single vCluster `default`.
pub fn weighted(policy: Policy, w: lattice_engine::CostWeights) -> SimConfig {
    let mut c = lattice_engine::VClusterConfig::new(policy);
    c.weights = Some(w);
    SimConfig {
        policy,
        vclusters: [("default".to_string(), c)].into(),
        check_invariants: true,
        ..SimConfig::default()
    }
}

/// All-zero weights except those set by the caller.
pub fn zero_weights() -> lattice_engine::CostWeights {
    lattice_engine::CostWeights {
        priority: 0.0,
        wait_time: 0.0,
        fair_share: 0.0,
        topology: 0.0,
        data_readiness: 0.0,
        backlog: 0.0,
        energy: 0.0,
        checkpoint: 0.0,
        conformance: 0.0,
    }
}

pub fn run_inv(w: &Workload, inv: &lattice_traces::Inventory, policy: Policy) -> SimResult {
    let cfg = SimConfig {
        policy,
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(w, inv, &cfg, &mut |_, _| {}).unwrap_or_else(|e| panic!("{policy}: {e}"))
}

/// Replays `w` twice, keeping the records and streaming them ([`lattice_sim::simulate_streaming`]):
/// the streamed records are the kept ones in the same order, and the summary computed from the
/// compact facts is the kept records' summary (less CPU time). Returns the kept replay.
pub fn replay_streamed_and_kept(w: &Workload, inv: &lattice_traces::Inventory, cfg: &SimConfig) -> SimResult {
    let kept = simulate(w, inv, cfg, &mut |_, _| {}).unwrap();
    let mut streamed = Vec::new();
    let (r, _) =
        lattice_sim::simulate_streaming(w, inv, cfg, &mut |_, _| {}, &mut |j| streamed.push(j.clone())).unwrap();
    assert!(r.jobs.is_empty(), "a streaming replay keeps no records");
    assert_eq!(streamed, kept.jobs);
    let summary = |r: &SimResult| {
        let mut v = serde_json::to_value(&r.summary).unwrap();
        v.as_object_mut()
            .unwrap()
            .retain(|k, _| !lattice_sim::metrics::TIMING_KEYS.contains(&k.as_str()));
        v
    };
    assert_eq!(summary(&r), summary(&kept));
    assert_eq!(r.scores.len(), kept.scores.len());
    kept
}
