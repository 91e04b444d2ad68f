//! Imports of real site data: a Slurm sacct dump with every awkward line the format has, the real
//! Alibaba GPU-cluster trace, and SWF → JSONL round trips.

use lattice_traces::import::{self, CompatMapping};
use lattice_traces::{SwfOptions, parse_jsonl, read_swf};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn shared(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(name)
}

/// Steps fold into their job, array elements and het-job parts are allocations, pending arrays,
/// cancelled-before-start, still-running, `Unknown` submits, `None` nodes and short lines are skipped and
/// counted by reason — 17 data lines = 7 allocations + 10 skipped.
#[test]
fn sacct_awkward_lines_import_with_correct_counts() {
    let imp = import::sacct_file(&fixture("sacct-awkward.txt"), &CompatMapping::default()).unwrap();
    assert_eq!(imp.lines, 17);
    assert_eq!(imp.allocations, 7, "{}", imp.summary());
    let want: Vec<(&str, u64)> = vec![
        ("bad_submit", 1),
        ("cancelled_before_start", 1),
        ("job_step", 3),
        ("malformed_line", 1),
        ("no_nodes", 2),
        ("not_finished", 1),
        ("pending_array", 1),
    ];
    assert_eq!(
        imp.skipped.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(),
        want
    );
    // Problems name the line and field (steps are expected, not problems).
    let p = imp.problems.iter().find(|p| p.reason == "malformed_line").unwrap();
    assert_eq!((p.line, p.field.as_deref()), (17, Some("line")));
    let p = imp
        .problems
        .iter()
        .find(|p| p.reason == "cancelled_before_start")
        .unwrap();
    assert_eq!((p.line, p.field.as_deref()), (9, Some("Start")));
    assert!(imp.notes.iter().any(|n| n.contains("mystery (1)")), "{:?}", imp.notes);
    assert!(
        imp.notes.iter().any(|n| n.contains("1 jobs had no usable Timelimit")),
        "{:?}",
        imp.notes
    );

    // The JSONL reads back cleanly with the mapped fields.
    let w = parse_jsonl("site.jsonl", &imp.jsonl);
    assert_eq!(w.skipped_total(), 0, "{:?}", w.problems);
    let ids: Vec<&str> = w.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["1001", "1002_1", "1002_2", "1007", "1008+0", "1008+1", "1009"]);
    let job = |id: &str| w.jobs.iter().find(|j| j.id == id).unwrap();
    let a = job("1001");
    assert_eq!((a.submit.as_secs_f64(), a.spec.nodes.min), (0.0, 4));
    assert_eq!(a.runtime.unwrap().as_secs_f64(), 3600.0);
    assert_eq!(a.spec.lifecycle.walltime().unwrap().as_secs_f64(), 7200.0);
    assert_eq!(a.spec.preemption_class.get(), 4, "QOS normal → 4");
    assert_eq!(w.tenants.names()[a.spec.tenant.0 as usize], "physics");
    assert_eq!(a.user(), Some("alice"));
    let g = job("1002_1");
    assert_eq!(
        (g.spec.constraints.gpu_count, g.spec.constraints.gpu_type.as_deref()),
        (Some(4), Some("a100"))
    );
    assert_eq!(g.spec.preemption_class.get(), 7, "QOS high → 7");
    assert!(!job("1002_2").exit_ok, "FAILED keeps its failure");
    let t = job("1007");
    assert!(!t.exit_ok, "TIMEOUT is a failure");
    assert_eq!(t.spec.preemption_class.get(), 9);
    assert_eq!(job("1008+1").spec.constraints.gpu_count, Some(4));
    assert!(job("1009").exit_ok, "cancelled after it started: ran its elapsed time");
    // Without a partition mapping, everything runs in vCluster `default`.
    assert_eq!(w.vclusters.names(), ["default"]);
}

#[test]
fn sacct_partition_and_qos_mappings() {
    let map = CompatMapping {
        partition_mapping: [("normal", "hpc-batch"), ("gpu", "ml-training")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        qos_mapping: [("normal".to_string(), 3), ("high".to_string(), 8)]
            .into_iter()
            .collect(),
    };
    let imp = import::sacct_file(&fixture("sacct-awkward.txt"), &map).unwrap();
    let w = parse_jsonl("site.jsonl", &imp.jsonl);
    let mut vcs = w.vclusters.names().to_vec();
    vcs.sort();
    assert_eq!(vcs, ["hpc-batch", "ml-training"]);
    let g = w.jobs.iter().find(|j| j.id == "1002_1").unwrap();
    assert_eq!(g.spec.preemption_class.get(), 8);
    // A header without the needed columns is one clear problem, not a panic.
    let bad = import::sacct("x", "JobID|User\n1|a\n", &CompatMapping::default());
    assert_eq!(bad.allocations, 0);
    assert_eq!(bad.problems[0].reason, "bad_header");
    assert!(bad.problems[0].message.contains("Submit"));
    assert!(
        import::sacct("x", "", &CompatMapping::default())
            .skipped
            .contains_key("no_header")
    );
}

/// The real Alibaba OpenB pod list: every line is accounted for, and the JSONL reads back cleanly.
#[test]
fn alibaba_pod_list_imports_completely() {
    let imp = import::alibaba_file(&shared("openb_pod_list_default.csv")).unwrap();
    assert_eq!(imp.lines, 8152);
    assert_eq!(
        imp.allocations + imp.skipped.values().sum::<u64>(),
        8152,
        "{}",
        imp.summary()
    );
    assert!(imp.allocations > 7000, "{}", imp.summary());
    let w = parse_jsonl("openb.jsonl", &imp.jsonl);
    assert_eq!(w.skipped_total(), 0, "{:?}", w.problems.first());
    assert_eq!(w.jobs.len() as u64, imp.allocations);
    let gpus: u32 = w.jobs.iter().filter_map(|j| j.spec.constraints.gpu_count).sum();
    assert!(gpus > 6000, "{gpus}");
    // This pod list leaves gpu_spec empty: no pod is tied to a GPU model.
    assert!(w.jobs.iter().all(|j| j.spec.constraints.gpu_type.is_none()));
    // Each pod asks for one node and runs its observed time.
    assert!(w.jobs.iter().all(|j| j.spec.nodes.min == 1 && j.runtime.is_some()));
}

/// SWF → JSONL keeps every job's submit time, size, walltime, run time, outcome and tenant.
#[test]
fn swf_to_jsonl_round_trips() {
    let swf = read_swf(&shared("hpc2n.swf"), &SwfOptions::default()).unwrap();
    let jsonl = import::workload_to_jsonl(&swf);
    let back = parse_jsonl("hpc2n.jsonl", &jsonl);
    assert_eq!(back.skipped_total(), 0, "{:?}", back.problems.first());
    assert_eq!(back.jobs.len(), swf.jobs.len());
    for (a, b) in swf.jobs.iter().zip(&back.jobs) {
        assert_eq!(a.id, b.id);
        assert_eq!(
            (a.submit, a.spec.nodes, a.runtime, a.exit_ok),
            (b.submit, b.spec.nodes, b.runtime, b.exit_ok)
        );
        assert_eq!(a.spec.lifecycle.walltime(), b.spec.lifecycle.walltime());
        assert_eq!(
            swf.tenants.names()[a.spec.tenant.0 as usize],
            back.tenants.names()[b.spec.tenant.0 as usize]
        );
    }
}
