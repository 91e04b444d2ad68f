//! Every CSV `rm-replay` writes, read by its header with a real CSV reader (the `csv` crate) and
//! checked column by column on a hand-worked scenario — so a header that does not name every column a
//! row carries (what pandas or polars would read misaligned) fails here.
//!
//! The scenario (EASY on 4 nodes, times in seconds):
//! - j1: submitted 0, 3 nodes, runs 100 (requested 100): starts at once, ends 100.
//! - j2: submitted 10, 4 nodes, runs 50 (requested 60): the head, blocked until j1 ends; starts 100.
//! - j3: submitted 20, 1 node, runs 30 (requested 40): 20 + 40 <= 100, so it is backfilled onto the
//!   idle node at 20 without delaying j2, ends 50.

mod common;
use common::{rm_replay, text, tmp};
use std::collections::BTreeMap;
use std::path::Path;

const SWF: &str = "; MaxNodes: 4\n; MaxProcs: 4\n\
1 0 -1 100 3 -1 -1 3 100 -1 1 1 1 -1 1 -1 -1 -1\n\
2 10 -1 50 4 -1 -1 4 60 -1 1 2 1 -1 1 -1 -1 -1\n\
3 20 -1 30 1 -1 -1 1 40 -1 1 1 1 -1 1 -1 -1 -1\n";

type Row = BTreeMap<String, String>;

/// Reads `path` by its header: one map column → value per row. Fails on a row whose field count
/// differs from the header's (the csv crate's default, `flexible(false)`).
fn read(path: &Path) -> (Vec<String>, Vec<Row>) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|rec| {
            let rec = rec.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            header.iter().cloned().zip(rec.iter().map(String::from)).collect()
        })
        .collect();
    (header, rows)
}

fn f(row: &Row, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|_| panic!("{col} = `{}` is not a number", row[col]))
}

fn scenario(dir: &Path) -> std::path::PathBuf {
    let trace = dir.join("three.swf");
    std::fs::write(&trace, SWF).unwrap();
    trace
}

#[test]
fn jobs_csv_names_every_column_and_each_means_what_it_says() {
    let dir = tmp("csv-jobs");
    let trace = scenario(&dir);
    let out = dir.join("out");
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--tables",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (header, rows) = read(&out.join("jobs.csv"));
    assert_eq!(
        header,
        [
            "id",
            "submit_s",
            "start_s",
            "end_s",
            "nodes",
            "wait_s",
            "bsld",
            "backfilled",
            "tenant",
            "vcluster",
            "state",
            "reason",
            "groups",
            "conformance",
            "class",
            "score",
            "preempted"
        ]
    );
    assert_eq!(rows.len(), 3);
    let by_id: BTreeMap<&str, &Row> = rows.iter().map(|r| (r["id"].as_str(), r)).collect();
    // (id, submit, start, end, nodes, wait, bsld, backfilled, tenant)
    let expect = [
        ("1", 0.0, 0.0, 100.0, 3, 0.0, 1.0, "false", "u1"),
        ("2", 10.0, 100.0, 150.0, 4, 90.0, (90.0 + 50.0) / 50.0, "false", "u2"),
        ("3", 20.0, 20.0, 50.0, 1, 0.0, 1.0, "true", "u1"),
    ];
    for (id, submit, start, end, nodes, wait, bsld, backfilled, tenant) in expect {
        let r = by_id[id];
        assert_eq!(f(r, "submit_s"), submit, "{id}");
        assert_eq!(f(r, "start_s"), start, "{id}");
        assert_eq!(f(r, "end_s"), end, "{id}");
        assert_eq!(f(r, "nodes") as u32, nodes, "{id}");
        assert_eq!(f(r, "wait_s"), wait, "{id}");
        assert!((f(r, "bsld") - bsld).abs() < 1e-6, "{id}");
        assert_eq!(r["backfilled"], backfilled, "{id}");
        assert_eq!(r["tenant"], tenant, "{id}");
        assert_eq!(r["vcluster"], "default", "{id}");
        assert_eq!(r["state"], "completed", "{id}");
        assert_eq!(r["reason"], "success", "{id}");
        // One dragonfly group, one conformance group: a perfectly fitting placement.
        assert_eq!(r["groups"], "1", "{id}");
        assert_eq!(f(r, "conformance"), 1.0, "{id}");
        // SWF carries no priority: the default class 0.
        assert_eq!(r["class"], "0", "{id}");
        // EASY orders by arrival: no score.
        assert_eq!(r["score"], "", "{id}");
        assert_eq!(r["preempted"], "0", "{id}");
    }

    // The report's tables (polars) read back the same way.
    let tables = out.join("tables");
    let (h, classes) = read(&tables.join("classes.csv"));
    assert_eq!(
        h,
        [
            "class",
            "jobs",
            "started",
            "p50_wait_h",
            "p95_wait_h",
            "p99_wait_h",
            "mean_bsld"
        ]
    );
    assert_eq!(classes.len(), 1);
    assert_eq!(classes[0]["class"], "0");
    assert_eq!(f(&classes[0], "jobs"), 3.0);
    assert_eq!(f(&classes[0], "started"), 3.0);
    assert!((f(&classes[0], "p95_wait_h") - 90.0 / 3600.0).abs() < 1e-9);
    assert!((f(&classes[0], "mean_bsld") - (1.0 + 2.8 + 1.0) / 3.0).abs() < 1e-9);
    let (h, tenants) = read(&tables.join("tenants.csv"));
    assert_eq!(
        h,
        [
            "tenant",
            "jobs",
            "node_hours",
            "share",
            "target",
            "share_minus_target",
            "mean_wait_h",
            "p95_wait_h"
        ]
    );
    let t: BTreeMap<&str, &Row> = tenants.iter().map(|r| (r["tenant"].as_str(), r)).collect();
    // u1: 3 nodes × 100 s + 1 × 30 s = 330 node-s; u2: 4 × 50 = 200 node-s.
    assert!((f(t["u1"], "node_hours") - 330.0 / 3600.0).abs() < 1e-9);
    assert!((f(t["u2"], "node_hours") - 200.0 / 3600.0).abs() < 1e-9);
    assert!((f(t["u1"], "share") - 330.0 / 530.0).abs() < 1e-9);
    assert_eq!(f(t["u1"], "jobs"), 2.0);
    let (h, intervals) = read(&tables.join("intervals.csv"));
    for col in ["utilization", "queue_depth"] {
        assert!(h.iter().any(|c| c == col), "intervals.csv lacks {col}: {h:?}");
    }
    assert!(!intervals.is_empty());
    for r in &intervals {
        let u = f(r, "utilization");
        assert!((0.0..=1.0 + 1e-9).contains(&u), "utilization {u}");
    }
}

#[test]
fn scores_sweep_and_sensitivity_csvs_read_by_header() {
    let dir = tmp("csv-scores");
    let trace = scenario(&dir);
    let out = dir.join("out");
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--weights",
        "profiles/hpc-batch.yaml",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (header, scores) = read(&out.join("scores.csv"));
    let names = lattice_engine::CostWeights::NAMES;
    let mut want = vec!["id".to_string(), "score".to_string()];
    want.extend(names.iter().map(|n| format!("f_{n}")));
    want.extend(names.iter().map(|n| format!("w_{n}")));
    assert_eq!(header, want);
    assert!(!scores.is_empty());
    let (_, jobs) = read(&out.join("jobs.csv"));
    for s in &scores {
        // The score is the sum of its weighted components, and it is the allocation's start score.
        let sum: f64 = names.iter().map(|n| f(s, &format!("w_{n}"))).sum();
        assert!((sum - f(s, "score")).abs() < 1e-5, "{s:?}");
        let j = jobs.iter().find(|j| j["id"] == s["id"]).expect("a scored id is a job");
        assert!((f(j, "score") - f(s, "score")).abs() < 1e-5, "{s:?} vs {j:?}");
    }

    let sweep = dir.join("sweep");
    let o = rm_replay(&[
        "sweep",
        "--trace",
        trace.to_str().unwrap(),
        "--weights",
        "profiles/hpc-batch.yaml",
        "--vary",
        "fair_share=0.1:0.3:0.2",
        "--objective",
        "minimize p95_wait_s",
        "--output",
        sweep.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (header, runs) = read(&sweep.join("sweep.csv"));
    assert_eq!(header[0], "run");
    for n in names {
        assert!(header.iter().any(|h| h == n), "sweep.csv lacks weight {n}");
    }
    for m in [
        "p95_wait_s",
        "utilization",
        "jain_index",
        "feasible",
        "pareto",
        "profile",
    ] {
        assert!(header.iter().any(|h| h == m), "sweep.csv lacks {m}: {header:?}");
    }
    assert_eq!(runs.len(), 2);
    let fair: Vec<f64> = runs.iter().map(|r| f(r, "fair_share")).collect();
    assert!((fair[0] - 0.1).abs() < 1e-9 && (fair[1] - 0.3).abs() < 1e-9, "{fair:?}");
    for r in &runs {
        // The weights keep the profile's total; the profile written is the row's.
        let total: f64 = names.iter().map(|n| f(r, n)).sum();
        assert!((total - 1.0).abs() < 1e-6, "{r:?}");
        let profile = std::path::Path::new(&r["profile"]);
        let p = if profile.is_absolute() {
            profile.to_path_buf()
        } else {
            common::root().join(profile)
        };
        assert!(p.exists(), "{}", p.display());
        assert!(["true", "false"].contains(&r["feasible"].as_str()));
        // j2 waits for j1 at least 90 s (longer when the 15 s cycle ticks round it up).
        assert!(f(r, "p95_wait_s") >= 90.0, "{r:?}");
    }
    // 3 jobs on a 4-node machine: the fair-share weight cannot change the order.
    assert_eq!(runs[0]["p95_wait_s"], runs[1]["p95_wait_s"]);
    let (header, sens) = read(&sweep.join("sensitivity.csv"));
    assert_eq!(header, ["weight", "value", "mean_p95_wait_s", "runs"]);
    assert_eq!(sens.len(), 2);
    assert!(sens.iter().all(|r| r["weight"] == "fair_share" && r["runs"] == "1"));
}
