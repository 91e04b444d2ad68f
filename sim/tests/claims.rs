//! Sensitive claims (the integration table's "Sensitive claim" row): node claim by a user identity,
//! audit logging at the quorum, wipe on release, quarantine on wipe failure.

mod common;
use common::*;
use lattice_engine::{CheckpointKind, CheckpointSpec, Duration, Policy, PreemptionClass};
use lattice_sim::{SimConfig, SimResult, WipeModel, audit::AuditLog, simulate};

fn claim(id: &str, submit: u64, nodes: u32, hold: u64) -> lattice_traces::TraceJob {
    let mut j = job(id, submit, nodes, hold, hold);
    j.spec_mut().sensitive_claim = true;
    j.spec_mut().lifecycle = lattice_engine::Lifecycle::Unbounded;
    j.names_mut().user = Some("dr-x".into());
    j
}

fn run_with(w: &lattice_traces::Workload, n: u32, wipe: WipeModel) -> SimResult {
    let cfg = SimConfig {
        policy: Policy::EASY,
        wipe,
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(w, &nodes(n), &cfg, &mut |_, _| {}).unwrap()
}

fn fixed_wipe(minutes: u64, failure_probability: f64) -> WipeModel {
    WipeModel {
        min: Duration::from_mins(minutes),
        max: Duration::from_mins(minutes),
        failure_probability,
        timeout: None,
    }
}

/// With free nodes a claim starts at once (sensitive wait 0), ahead of jobs queued before it.
#[test]
fn claim_starts_at_once_when_the_pool_has_capacity() {
    let w = workload(vec![
        job("R", 0, 2, 1000, 1000),
        job("Q", 1, 4, 100, 100), // waits for R
        claim("C", 2, 2, 300),
    ]);
    let r = run_with(&w, 4, fixed_wipe(20, 0.0));
    assert_eq!(start_of(&r, "C"), 2.0);
    assert_eq!(r.summary.sensitive_wait_max_s, 0.0);
    assert_eq!(r.summary.sensitive_claims, 1);
}

/// A claim on a full pool takes its nodes from non-sensitive occupants: L (class 3, 1-minute
/// checkpoint) is preempted with reason `sensitive` and the claim starts when L's checkpoint is written.
#[test]
fn claim_preempts_non_sensitive_occupants() {
    let mut l = job("L", 0, 4, 10_000, 5_000);
    l.spec_mut().preemption_class = PreemptionClass::new(9).unwrap();
    l.spec_mut().checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: Some(1.0),
        mechanism: Default::default(),
    };
    let w = workload(vec![l, claim("C", 100, 2, 300)]);
    let r = run_with(&w, 4, fixed_wipe(20, 0.0));
    assert_eq!(start_of(&r, "C"), 160.0);
    assert_eq!(r.summary.preemptions_by_reason.get("sensitive"), Some(&1));
}

/// Release: the nodes are wiped (20 min here) before they return; the audit log records claim,
/// release and wipe with the user, hash-chained.
#[test]
fn release_wipes_nodes_and_audits() {
    let w = workload(vec![claim("C", 0, 2, 300), job("J", 10, 4, 100, 100)]);
    let r = run_with(&w, 4, fixed_wipe(20, 0.0));
    // J needs all 4 nodes: the claim's 2 come back at 300 + 1200.
    assert_eq!(start_of(&r, "J"), 1500.0);
    let events: Vec<&str> = r.audit.entries().iter().map(|e| e.action.as_str()).collect();
    assert_eq!(events, ["claim", "start", "release", "wipe"]);
    assert!(r.audit.entries().iter().all(|e| e.user == "dr-x" && e.alloc == "C"));
    // The nodes by name, as the quorum's log names them.
    assert_eq!(
        r.audit.entries()[0].detail.split(',').count(),
        2,
        "{:?}",
        r.audit.entries()[0]
    );
    assert_eq!(AuditLog::verify(r.audit.entries()), Ok(()));
    assert!(r.summary.audit_chain_valid);
    assert_eq!(r.summary.wipes, 1);
}

/// A claim that checkpoints (book: the audit trail holds checkpoint events): the broker's requests
/// and their outcomes are audited between its start and its release, on its nodes, in the chain.
#[test]
fn a_claims_checkpoints_are_audited() {
    // A day on 3 nodes with no estimate: the broker checkpoints it every few hours (tests/broker.rs).
    let mut c = claim("C", 1, 3, 24 * 3600);
    c.spec_mut().lifecycle = lattice_engine::Lifecycle::Bounded {
        walltime: Duration::from_secs(25 * 3600),
    };
    c.spec_mut().checkpoint = CheckpointSpec {
        kind: CheckpointKind::Auto,
        estimated_minutes: None,
        mechanism: Default::default(),
    };
    // A job scheduled before it: the scheduler scored (the broker runs once it has).
    let w = workload(vec![job("Q", 0, 1, 100, 100), c]);
    let mut cfg = weighted(Policy::EASY, lattice_engine::CostWeights::default());
    cfg.wipe = fixed_wipe(20, 0.0);
    let r = simulate(&w, &nodes(4), &cfg, &mut |_, _| {}).unwrap();
    let events: Vec<&str> = r.audit.entries().iter().map(|e| e.action.as_str()).collect();
    let asked = events.iter().filter(|e| **e == "checkpoint").count();
    let done = events.iter().filter(|e| **e == "checkpoint_done").count();
    assert!(
        asked >= 1 && done >= 1,
        "{events:?} hints {}",
        r.summary.checkpoint_hints
    );
    assert_eq!(r.summary.broker_checkpoints as usize, done, "{events:?}");
    let start = events.iter().position(|e| *e == "start").unwrap();
    let release = events.iter().position(|e| *e == "release").unwrap();
    let first = events.iter().position(|e| *e == "checkpoint").unwrap();
    assert!(start < first && first < release, "{events:?}");
    let e = r
        .audit
        .entries()
        .iter()
        .find(|e| e.action == "checkpoint_done")
        .unwrap();
    assert_eq!(e.detail.split(',').count(), 3, "{e:?}");
    assert_eq!(AuditLog::verify(r.audit.entries()), Ok(()));
}

/// A failed wipe quarantines the nodes (treated as Down): they never return to the pool.
#[test]
fn failed_wipe_quarantines() {
    let w = workload(vec![
        claim("C", 0, 2, 300),
        job("J", 10, 4, 100, 100),
        job("K", 20, 2, 100, 100),
    ]);
    let r = run_with(&w, 4, fixed_wipe(20, 1.0));
    assert_eq!(r.summary.quarantined_nodes, 2);
    assert_eq!(r.jobs[1].start_s, None, "J needs the quarantined nodes");
    assert_eq!(start_of(&r, "K"), 20.0);
    assert_eq!(r.audit.entries().last().unwrap().action, "quarantine");
}

/// A wipe slower than the controller's wipe timeout fails at the deadline: the nodes are
/// quarantined then (not when the late report comes), and the late success changes nothing.
#[test]
fn a_wipe_not_confirmed_in_time_quarantines_at_the_deadline() {
    let w = workload(vec![
        claim("C", 0, 2, 300),
        job("J", 10, 4, 100, 100),
        job("K", 20, 2, 100, 100),
    ]);
    let slow = WipeModel {
        timeout: Some(Duration::from_mins(30)),
        ..fixed_wipe(40, 0.0)
    };
    let r = run_with(&w, 4, slow);
    assert_eq!((r.summary.wipe_timeouts, r.summary.quarantined_nodes), (2, 2));
    assert_eq!(r.summary.wipes, 0, "the late success is not a wipe");
    assert_eq!(r.jobs[1].start_s, None, "J needs the quarantined nodes");
    let q = r.audit.entries().last().unwrap();
    assert_eq!((q.action.as_str(), q.at_ms), ("quarantine", (300 + 1800) * 1000));
    // In time, the same wipe returns the nodes.
    let in_time = WipeModel {
        timeout: Some(Duration::from_mins(30)),
        ..fixed_wipe(20, 0.0)
    };
    let r = run_with(&w, 4, in_time);
    assert_eq!((r.summary.wipe_timeouts, r.summary.wipes), (0, 1));
    assert_eq!(start_of(&r, "J"), 1500.0);
}

/// Sensitive allocations are never preempted, not even by another claim; and a claim never
/// queues (book: "they are immediate or rejected"): C2, submitted while C1 holds every node, is
/// refused at once — it never runs, even after C1's nodes return — and the refusal is audited with
/// the nodes C1 holds.
#[test]
fn claims_never_preempt_claims_and_a_claim_without_nodes_is_refused_at_once() {
    let w = workload(vec![claim("C1", 0, 4, 300), claim("C2", 10, 2, 300)]);
    let r = run_with(&w, 4, fixed_wipe(10, 0.0));
    assert_eq!(r.summary.preemptions, 0);
    let c2 = r.jobs.iter().find(|j| j.id == "C2").unwrap();
    assert_eq!((c2.start_s, c2.state, c2.reason), (None, "cancelled", "claim_refused"));
    assert_eq!(r.summary.claims_refused, 1);
    let refusal: Vec<_> = r
        .audit
        .entries()
        .iter()
        .filter(|e| e.action == "claim_refused")
        .collect();
    assert_eq!(refusal.len(), 1);
    assert_eq!((refusal[0].alloc.as_str(), refusal[0].at_ms), ("C2", 10_000));
    let claimed = r.audit.entries().iter().find(|e| e.action == "claim").unwrap();
    assert_eq!(refusal[0].detail, claimed.detail, "the nodes C1 holds");
    assert!(r.summary.audit_chain_valid);
}

/// A refused claim blocks nobody: C1 (3 nodes) cannot have them while J holds 2 of 4 nodes at
/// class 10 (not preemptible); C2 (2 nodes), submitted at the same second behind it, takes the two
/// free ones at once. A job behind both starts when it fits, as before.
#[test]
fn a_refused_claim_does_not_hold_up_the_claims_behind_it() {
    let mut j = job("J", 0, 2, 1000, 1000);
    j.spec_mut().preemption_class = PreemptionClass::new(10).unwrap();
    let w = workload(vec![
        j,
        claim("C1", 5, 3, 300),
        claim("C2", 5, 2, 300),
        job("K", 6, 1, 50, 50),
    ]);
    let r = run_with(&w, 4, fixed_wipe(10, 0.0));
    let c1 = r.jobs.iter().find(|j| j.id == "C1").unwrap();
    assert_eq!((c1.start_s, c1.reason), (None, "claim_refused"));
    assert_eq!(start_of(&r, "C2"), 5.0);
    assert_eq!(r.summary.claims_refused, 1);
    assert_eq!(r.summary.sensitive_wait_max_s, 0.0);
}

/// A claim is immediate even where the pool schedules on a cycle tick: with a 5 s cycle, a job
/// submitted at 12 s starts at the 15 s tick, a claim submitted at 22 s starts at 22 s.
#[test]
fn claims_do_not_wait_for_the_cycle_tick() {
    let w = workload(vec![job("J", 12, 1, 100, 100), claim("C", 22, 2, 300)]);
    let mut vc = lattice_engine::VClusterConfig::new(Policy::EASY);
    vc.cycle_interval = Duration::from_secs(5);
    let cfg = SimConfig {
        policy: Policy::EASY,
        vclusters: [("default".to_string(), vc)].into_iter().collect(),
        check_invariants: true,
        ..SimConfig::default()
    };
    let r = simulate(&w, &nodes(4), &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(start_of(&r, "J"), 15.0);
    assert_eq!(start_of(&r, "C"), 22.0);
    assert_eq!(r.summary.sensitive_wait_max_s, 0.0);
}

fn hardened(minutes: u64, failure_probability: f64) -> lattice_sim::BootModel {
    lattice_sim::BootModel {
        min: Duration::from_mins(minutes),
        max: Duration::from_mins(minutes),
        failure_probability,
        timeout: Duration::from_mins(10),
    }
}

fn run_hardened(w: &lattice_traces::Workload, n: u32, boot: lattice_sim::BootModel) -> SimResult {
    let cfg = SimConfig {
        policy: Policy::EASY,
        wipe: fixed_wipe(20, 0.0),
        hardened_boot: Some(boot),
        check_invariants: true,
        ..SimConfig::default()
    };
    simulate(w, &nodes(n), &cfg, &mut |_, _| {}).unwrap()
}

/// With a hardened image the claim's nodes boot it first (5 min here): the claim's work runs from
/// 300 to 600 s, then the 20-minute wipe; the boot is audited between claim and release. A later
/// claim on the same (still hardened) nodes does not boot again.
#[test]
fn a_claim_boots_the_hardened_image_before_its_work_runs() {
    let w = workload(vec![
        claim("C", 0, 2, 300),
        job("J", 10, 2, 100, 100),
        claim("D", 5000, 2, 300),
    ]);
    let r = run_hardened(&w, 2, hardened(5, 0.0));
    // J needs both nodes: back at 300 (boot) + 300 (work) + 1200 (wipe).
    assert_eq!(start_of(&r, "J"), 1800.0);
    let events: Vec<(&str, &str)> = r
        .audit
        .entries()
        .iter()
        .map(|e| (e.alloc.as_str(), e.action.as_str()))
        .collect();
    assert_eq!(
        events,
        [
            ("C", "claim"),
            ("C", "boot"),
            ("C", "start"),
            ("C", "release"),
            ("C", "wipe"),
            ("D", "claim"),
            ("D", "start"),
            ("D", "release"),
            ("D", "wipe")
        ]
    );
    assert_eq!((r.summary.hardened_boots, r.summary.boot_failures), (2, 0));
}

/// A hardened boot that fails (or exceeds the 10-minute boot timeout) fails the claim: its work never
/// runs, it is not requeued, the nodes that did not boot stay Down (out for an operator) and the
/// others are wiped and return. Failed: the first node's failure ends the claim at 300 s; the other
/// node is wiped (20 min) and J runs on it. Timed out: both nodes are out at 600 s; J never runs.
#[test]
fn a_failed_or_slow_hardened_boot_fails_the_claim() {
    for (boot, what, failures, j_start) in [
        (hardened(5, 1.0), "failed", 1, Some(1500.0)),
        (hardened(15, 0.0), "timed out", 2, None),
    ] {
        let w = workload(vec![claim("C", 0, 2, 300), job("J", 10, 1, 100, 100)]);
        let r = run_hardened(&w, 2, boot);
        let c = r.jobs.iter().find(|j| j.id == "C").unwrap();
        assert_eq!((c.state, c.run_s), ("failed", Some(0.0)), "{what}: {c:?}");
        assert_eq!(
            (r.summary.hardened_boots, r.summary.boot_failures),
            (0, failures),
            "{what}"
        );
        let events: Vec<&str> = r.audit.entries().iter().map(|e| e.action.as_str()).collect();
        assert_eq!(events[..2], ["claim", "release"], "{what}: {events:?}");
        let j = r.jobs.iter().find(|j| j.id == "J").unwrap();
        assert_eq!(j.start_s, j_start, "{what}");
    }
}

/// An operator's `wipe_retry` of a quarantined node (trace event): audited, and the node is wiped
/// again on its own (this model's wipes always fail, so it stays quarantined and J never runs); a
/// retry of a node that is not quarantined is counted as skipped, not applied.
#[test]
fn a_wipe_retry_in_the_trace_wipes_a_quarantined_node_again() {
    let w = workload(vec![claim("C", 0, 2, 300), job("J", 10, 4, 100, 100)]);
    let first = run_with(&w, 4, fixed_wipe(20, 1.0));
    let claimed: Vec<String> = first.audit.entries()[0].detail.split(',').map(str::to_string).collect();
    let free = (0..4)
        .map(|i| format!("n{i:05}"))
        .find(|n| !claimed.contains(n))
        .unwrap();
    let mut w = w.clone();
    for (at, node) in [(5000, &claimed[0]), (5100, &free)] {
        w.events.push(lattice_traces::TraceEvent {
            time: lattice_engine::Time::from_secs(at),
            kind: lattice_traces::TraceEventKind::WipeRetry { node: node.clone() },
            line: 0,
        });
    }
    let r = run_with(&w, 4, fixed_wipe(20, 1.0));
    let events: Vec<(&str, &str)> = r
        .audit
        .entries()
        .iter()
        .map(|e| (e.action.as_str(), e.detail.as_str()))
        .collect();
    assert_eq!(
        events[4..],
        [("wipe_retry", claimed[0].as_str()), ("quarantine", claimed[0].as_str())],
        "{events:?}"
    );
    assert_eq!(r.summary.skipped.get("wipe_retry_not_quarantined"), Some(&1));
    assert_eq!(r.jobs[1].start_s, None);
}
