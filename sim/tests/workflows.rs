//! DAGs and task groups (book: "DAG Scheduling"), from JSONL traces through the simulator.

mod common;
use common::*;
use lattice_sim::{SimConfig, SimResult};
use lattice_traces::parse_jsonl;
use proptest::prelude::*;

fn replay(text: &str, n: u32) -> SimResult {
    let w = parse_jsonl("t.jsonl", text);
    assert!(w.problems.is_empty(), "{:?}", w.problems);
    let cfg = SimConfig {
        check_invariants: true,
        ..SimConfig::default()
    };
    // Every workflow replay also checks that streamed records give the same DAG and task-group
    // metrics.
    replay_streamed_and_kept(&w, &nodes(n), &cfg)
}

fn state<'a>(r: &'a SimResult, id: &str) -> &'a str {
    r.jobs.iter().find(|j| j.id == id).map(|j| j.state).unwrap_or("missing")
}

const TRAIN_FAILS: &str = concat!(
    r#"{"ts": 0, "type": "dag", "dag": {"id": "d", "allocations": ["#,
    r#"{"id": "train", "nodes": 1, "walltime": 100, "duration": 50},"#,
    r#"{"id": "evaluate", "nodes": 1, "walltime": 100, "duration": 10, "depends_on": [{"ref": "train", "condition": "success"}]},"#,
    r#"{"id": "deploy", "nodes": 1, "walltime": 100, "duration": 10, "depends_on": [{"ref": "evaluate", "condition": "success"}]},"#,
    r#"{"id": "notify", "nodes": 1, "walltime": 100, "duration": 5, "depends_on": [{"ref": "train", "condition": "failure"}]},"#,
    r#"{"id": "cleanup", "nodes": 1, "walltime": 100, "duration": 5, "depends_on": [{"ref": "train", "condition": "any"}]}"#,
    "]}}\n"
);

/// The seed's error-handling workflow. When train fails: evaluate and deploy are cancelled (cascading),
/// notify_failure runs, cleanup (any) runs. When train succeeds: evaluate and deploy run, notify is
/// cancelled, cleanup runs.
#[test]
fn dag_failure_propagation_table() {
    // Make train exit non-zero: a complete event with exit 1.
    let fails = format!(
        "{}{}",
        TRAIN_FAILS, "{\"ts\": 60, \"type\": \"complete\", \"alloc_id\": \"d/train\", \"duration\": 50, \"exit\": 1}\n"
    );
    let r = replay(&fails, 4);
    assert_eq!(state(&r, "d/train"), "failed");
    assert_eq!(
        (state(&r, "d/evaluate"), state(&r, "d/deploy")),
        ("cancelled", "cancelled")
    );
    assert_eq!(
        (state(&r, "d/notify"), state(&r, "d/cleanup")),
        ("completed", "completed")
    );
    assert_eq!(r.summary.dags["d"].state, "failed");

    let ok = replay(TRAIN_FAILS, 4);
    assert_eq!(
        (state(&ok, "d/evaluate"), state(&ok, "d/deploy")),
        ("completed", "completed")
    );
    assert_eq!(state(&ok, "d/notify"), "cancelled");
    assert_eq!(state(&ok, "d/cleanup"), "completed");
    let d = &ok.summary.dags["d"];
    // Critical path train → evaluate → deploy = 70 s; the makespan is the same (one node each, no wait).
    assert_eq!((d.critical_path_s, d.makespan_s, d.stretch), (70.0, 70.0, 1.0));
}

/// Validation at submit: cycles, unknown references, duplicates and the size limit are rejected with
/// the seed's wording, and the rest of the trace still replays.
#[test]
fn dag_validation() {
    let text = r#"{"ts": 0, "type": "dag", "dag": {"id": "cyc", "allocations": [{"id": "a", "nodes": 1, "walltime": 10, "depends_on": [{"ref": "b"}]}, {"id": "b", "nodes": 1, "walltime": 10, "depends_on": [{"ref": "a"}]}]}}
{"ts": 0, "type": "dag", "dag": {"id": "ref", "allocations": [{"id": "a", "nodes": 1, "walltime": 10, "depends_on": [{"ref": "ghost"}]}]}}
{"ts": 0, "type": "dag", "dag": {"id": "dup", "allocations": [{"id": "a", "nodes": 1, "walltime": 10}, {"id": "a", "nodes": 1, "walltime": 10}]}}
{"ts": 1, "type": "submit", "alloc": {"id": "fine", "nodes": 1, "walltime": 10}}
"#;
    let w = parse_jsonl("t.jsonl", text);
    let msgs: Vec<String> = w.problems.iter().map(|p| p.to_string()).collect();
    assert!(
        msgs[0].contains("t.jsonl:1") && msgs[0].contains("DAG cyc: dependency cycle among a, b"),
        "{msgs:?}"
    );
    assert!(
        msgs[1].contains("`ghost`, which is not an allocation of the DAG"),
        "{msgs:?}"
    );
    assert!(msgs[2].contains("duplicate allocation id `a`"), "{msgs:?}");
    assert_eq!(w.jobs.len(), 1);
    let big: Vec<String> = (0..1001)
        .map(|i| format!("{{\"id\": \"j{i}\", \"nodes\": 1, \"walltime\": 10}}"))
        .collect();
    let w = parse_jsonl(
        "t.jsonl",
        &format!(
            "{{\"ts\": 0, \"type\": \"dag\", \"dag\": {{\"id\": \"big\", \"allocations\": [{}]}}}}\n",
            big.join(",")
        ),
    );
    assert!(
        w.problems[0]
            .message
            .contains("DAG exceeds maximum size (1001 allocations, limit: 1000)"),
        "{:?}",
        w.problems
    );
}

/// Corresponding with mismatched sizes: train[i] waits for preprocess[i] for i in 0..=2; train[3] and
/// train[4] have no predecessor element and start at once, like roots.
#[test]
fn corresponding_with_mismatched_sizes() {
    let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "pre", "nodes": 1, "walltime": 100, "duration": 100, "task_group": {"range": {"start": 0, "end": 2}}}}
{"ts": 0, "type": "submit", "alloc": {"id": "train", "nodes": 1, "walltime": 50, "duration": 50, "task_group": {"range": {"start": 0, "end": 4}}, "depends_on": [{"ref": "pre", "condition": "corresponding"}]}}
"#;
    let r = replay(text, 8);
    for i in 0..3 {
        assert_eq!(start_of(&r, &format!("train[{i}]")), 100.0, "train[{i}] after pre[{i}]");
    }
    for i in 3..5 {
        assert_eq!(
            start_of(&r, &format!("train[{i}]")),
            0.0,
            "train[{i}] has no predecessor element"
        );
    }
    let g = &r.summary.task_groups["train"];
    assert_eq!((g.elements, g.completed), (5, 5));
}

/// Task-group concurrency: 6 elements, concurrency 2, on 8 nodes: two at a time.
#[test]
fn task_group_concurrency_limit() {
    let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "sweep", "nodes": 1, "walltime": 10, "duration": 10, "task_group": {"range": {"start": 0, "end": 5}, "concurrency": 2}}}
"#;
    let r = replay(text, 8);
    let starts: Vec<f64> = (0..6).map(|i| start_of(&r, &format!("sweep[{i}]"))).collect();
    assert_eq!(starts, vec![0.0, 0.0, 10.0, 10.0, 20.0, 20.0]);
    assert_eq!(r.summary.task_groups["sweep"].throughput_per_h, 6.0 / (30.0 / 3600.0));
}

/// Mutex (singleton): jobs sharing a mutex name never overlap, even with free nodes.
#[test]
fn mutex_is_a_singleton() {
    let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": 10, "duration": 10, "mutex": "db-migration"}}
{"ts": 0, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": 10, "duration": 10, "depends_on": [{"ref": "db-migration", "condition": "mutex"}]}}
{"ts": 0, "type": "submit", "alloc": {"id": "c", "nodes": 1, "walltime": 10, "duration": 10}}
"#;
    let r = replay(text, 4);
    assert_eq!(
        (start_of(&r, "a"), start_of(&r, "b"), start_of(&r, "c")),
        (0.0, 10.0, 0.0)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A DAG member never starts before its dependencies are satisfied: every `success` predecessor has
    /// completed, and every `any` predecessor has ended, by the time it starts.
    #[test]
    fn dag_members_wait_for_their_dependencies(
        edges in prop::collection::vec((1usize..12, 0usize..12, any::<bool>()), 0..25),
        runs in prop::collection::vec(1u64..100, 12),
        fail in prop::collection::vec(any::<bool>(), 12),
    ) {
        let mut allocs = Vec::new();
        for i in 0..12 {
            let deps: Vec<String> = edges.iter().filter(|e| e.0 == i && e.1 < i)
                .map(|e| format!("{{\"ref\": \"j{}\", \"condition\": \"{}\"}}", e.1, if e.2 { "success" } else { "any" }))
                .collect();
            allocs.push(format!("{{\"id\": \"j{i}\", \"nodes\": 1, \"walltime\": 200, \"depends_on\": [{}]}}", deps.join(",")));
        }
        let mut text = format!("{{\"ts\": 0, \"type\": \"dag\", \"dag\": {{\"id\": \"p\", \"allocations\": [{}]}}}}\n", allocs.join(","));
        for i in 0..12 {
            text.push_str(&format!("{{\"ts\": 1, \"type\": \"complete\", \"alloc_id\": \"p/j{i}\", \"duration\": {}, \"exit\": {}}}\n", runs[i], fail[i] as u8));
        }
        let r = replay(&text, 3);
        let rec = |i: usize| r.jobs.iter().find(|j| j.id == format!("p/j{i}")).unwrap();
        for &(i, j, success) in &edges {
            if j >= i { continue; }
            if let Some(s) = rec(i).start_s {
                let up = rec(j);
                if success {
                    prop_assert_eq!(up.state, "completed");
                }
                // A cancelled predecessor never ran (it ended when it was cancelled); otherwise it ended first.
                if up.state != "cancelled" {
                    prop_assert!(up.end_s.is_some_and(|e| e <= s), "p/j{} started at {} before p/j{} ended", i, s, j);
                }
            }
        }
    }
}
