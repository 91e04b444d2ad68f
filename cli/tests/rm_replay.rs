//! `rm-replay` as users run it: the output contract, determinism, and clear errors on bad input.

mod common;
use common::{rm_replay, text, tmp};
use std::path::Path;
use std::process::Command;

#[test]
fn default_run_writes_the_output_contract_deterministically() {
    let dir = tmp("contract");
    let (a, b) = (dir.join("a"), dir.join("b"));
    for d in [&a, &b] {
        let o = rm_replay(&["--output", d.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("=== RM-Replay Results"), "{}", text(&o));
    }
    let summary = std::fs::read_to_string(a.join("summary.json")).unwrap();
    // Byte-identical except the two keys that measure real CPU time.
    let strip = |s: &str| -> String {
        s.lines()
            .filter(|l| {
                !lattice_sim::metrics::TIMING_KEYS
                    .iter()
                    .any(|k| l.contains(&format!("\"{k}\"")))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(&summary),
        strip(&std::fs::read_to_string(b.join("summary.json")).unwrap())
    );
    assert_eq!(
        std::fs::read(a.join("jobs.csv")).unwrap(),
        std::fs::read(b.join("jobs.csv")).unwrap()
    );
    let v: serde_json::Value = serde_json::from_str(&summary).unwrap();
    for key in [
        "jobs",
        "skipped",
        "policy",
        "seed",
        "mean_wait_s",
        "p50_wait_s",
        "p95_wait_s",
        "p99_wait_s",
        "max_wait_s",
        "mean_bsld",
        "p95_bsld",
        "utilization",
        "makespan_s",
        "backfilled",
        "per_tenant",
        "per_vcluster",
    ] {
        assert!(v.get(key).is_some(), "summary.json lacks `{key}`");
    }
    assert_eq!(v["jobs"], 2000);
    assert_eq!(v["policy"], "easy");
    assert!(v["per_tenant"]["u1"]["mean_wait_s"].is_number());
    let csv = std::fs::read_to_string(a.join("jobs.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("id,submit_s,start_s,end_s,nodes,wait_s,bsld,backfilled,tenant,vcluster,state")
    );
    assert_eq!(lines.count(), 2000);
    assert!(a.join("engine_cost.json").exists());
}

#[test]
fn policies_and_weights_are_selectable() {
    let fcfs = rm_replay(&["--policy", "fcfs", "--quiet"]);
    assert!(fcfs.status.success(), "{}", text(&fcfs));
    let dir = tmp("weights");
    let o = rm_replay(&[
        "--weights",
        "profiles/hpc-batch.yaml",
        "--output",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["policy"], "easy", "hpc-batch.yaml sets policy easy");
    let o = rm_replay(&[
        "--policy",
        "backfill",
        "--depth",
        "3",
        "--output",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["policy"], "backfill(depth=3)");
    let o = rm_replay(&["--policy", "easy", "--compat", "pyss", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn bad_options_and_files_fail_with_clear_messages() {
    let o = rm_replay(&["--compat", "slurm"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--compat slurm"), "{}", text(&o));
    let o = rm_replay(&["--policy", "lottery"]);
    assert!(text(&o).contains("`lottery` is not one of"), "{}", text(&o));
    let dir = tmp("bad");
    let prof = dir.join("bad.yaml");
    std::fs::write(&prof, "hpc-batch:\n  priority: -1\n").unwrap();
    let o = rm_replay(&["--weights", prof.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("bad.yaml: hpc-batch.priority: weight must be >= 0"),
        "{}",
        text(&o)
    );
    let o = rm_replay(&["--trace", "/nonexistent/trace.swf"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("/nonexistent/trace.swf"), "{}", text(&o));
    // User errors: `error: <message>` and one line per cause, exit 1, no backtrace even with
    // RUST_BACKTRACE=1; usage errors exit 2.
    let o = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(["--trace", "/nonexistent/trace.swf"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.starts_with("error: reading trace /nonexistent/trace.swf"), "{e}");
    assert!(e.lines().skip(1).all(|l| l.starts_with("  caused by: ")), "{e}");
    assert!(e.lines().count() >= 2, "the cause is shown: {e}");
    assert!(!e.to_lowercase().contains("backtrace"), "{e}");
    assert_eq!(rm_replay(&["--no-such-flag"]).status.code(), Some(2));
}

#[test]
fn swf_skips_are_reported_with_line_and_counted() {
    let dir = tmp("skips");
    let t = dir.join("t.swf");
    std::fs::write(
        &t,
        "; MaxProcs: 4\n1 0 -1 10 1 -1 -1 1 20 -1 1 1 1 -1 1 -1 -1 -1\n2 0 -1 -1 1 -1 -1 1 20 -1 1 1 1 -1 1 -1 -1 -1\n3 oops\n",
    )
    .unwrap();
    let out = dir.join("out");
    let o = rm_replay(&["--trace", t.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("t.swf:3: field `run_time`"), "{err}");
    assert!(err.contains("t.swf:4:"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["jobs"], 1);
    assert_eq!(v["skipped"]["runtime_negative"], 1);
    assert_eq!(v["skipped"]["malformed_line"], 1);
}

#[test]
fn jsonl_trace_with_inventory() {
    let dir = tmp("jsonl");
    let inv = dir.join("inv.yaml");
    std::fs::write(
        &inv,
        "nodes:\n  - prefix: cpu\n    count: 4\n  - prefix: gh\n    count: 2\n    gpu_type: GH200\n    gpu_count: 4\n",
    )
    .unwrap();
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        r#"{"ts": "2026-03-01T00:00:00Z", "type": "submit", "alloc": {"id": "a", "nodes": 2, "gpu_type": "GH200", "walltime": "2h", "tenant": "ml"}}
{"ts": "2026-03-01T00:00:01Z", "type": "submit", "alloc": {"id": "b", "nodes": 1, "gpu_type": "GH200", "walltime": "1h", "tenant": "ml"}}
{"ts": "2026-03-01T00:00:02Z", "type": "submit", "alloc": {"id": "c", "nodes": 4, "walltime": "30m", "tenant": "physics"}}
{"ts": "2026-03-01T00:00:03Z", "type": "submit", "alloc": {"id": "d", "nodes": 8, "walltime": "30m", "tenant": "physics"}}
{"ts": "2026-03-01T01:00:00Z", "type": "complete", "alloc_id": "a", "duration": "1h", "exit": 0}
{"ts": "2026-03-01T01:00:00Z", "type": "complete", "alloc_id": "c", "duration": "10m", "exit": 1}
"#,
    )
    .unwrap();
    let out = dir.join("out");
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        inv.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let row = |id: &str| {
        csv.lines()
            .find(|l| l.starts_with(&format!("{id},")))
            .unwrap()
            .to_string()
    };
    // b waits for a's GPU nodes (the CPU nodes do not satisfy gpu_type), then runs to its walltime.
    assert!(row("b").starts_with("b,1,3600,7200,"), "{}", row("b"));
    assert!(row("c").contains(",failed,exit_failure,"), "{}", row("c"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["skipped"]["unsatisfiable"], 1, "d asks for 8 nodes of 6");
    assert_eq!(v["jobs"], 3);
    assert!(Path::new(&out.join("summary.json")).exists());
}

#[test]
fn profiles_must_cover_the_trace_vclusters_and_scores_are_written() {
    let dir = tmp("vcs");
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 1, "walltime": "1h", "vcluster": "ml-training"}}
{"ts": 1, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": "1h", "vcluster": "physics"}}
"#,
    )
    .unwrap();
    let inv = dir.join("inv.yaml");
    std::fs::write(&inv, "nodes:\n  - prefix: n\n    count: 2\n").unwrap();
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        inv.to_str().unwrap(),
        "--weights",
        "profiles/ml-training.yaml",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("the trace uses vCluster `physics`, which the profile does not define"),
        "{}",
        text(&o)
    );
    // The demo trace with a profile writes the per-allocation score breakdown.
    let out = dir.join("out");
    let o = rm_replay(&[
        "--weights",
        "profiles/hpc-batch.yaml",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let scores = std::fs::read_to_string(out.join("scores.csv")).unwrap();
    assert!(
        scores.starts_with("id,score,f_priority,f_wait_time,f_fair_share"),
        "{scores}"
    );
    assert_eq!(scores.lines().count(), 2001);
}

/// Without `--report` or `--tables`, `jobs.csv` is written as the records are built and none is
/// kept: every output file is byte for byte the one a replay keeping its records writes (the
/// summary less CPU time), `scores.csv` naming the same allocations.
#[test]
fn streamed_outputs_equal_the_outputs_of_a_replay_keeping_its_records() {
    let dir = tmp("streamed");
    let run = |out: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "--trace",
            "traces/library/sensitive-claim.jsonl",
            "--nodes",
            "traces/library/library-sensitive-128.yaml",
            "--tenants",
            "traces/library/tenants.yaml",
            "--weights",
            "traces/library/sensitive-claim.profile.yaml",
            "--quiet",
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = rm_replay(&args);
        assert!(o.status.success(), "{}", text(&o));
    };
    let (streamed, kept) = (dir.join("streamed"), dir.join("kept"));
    run(&streamed, &[]);
    run(&kept, &["--tables"]);
    for f in ["jobs.csv", "scores.csv", "audit.jsonl"] {
        let a = std::fs::read(streamed.join(f)).unwrap();
        assert!(a.len() > 1000, "{f} is written");
        assert!(a == std::fs::read(kept.join(f)).unwrap(), "{f} differs");
    }
    let summary = |d: &std::path::Path| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap();
        v.as_object_mut().unwrap().retain(|k, _| !k.contains("cpu"));
        v
    };
    assert_eq!(summary(&streamed), summary(&kept));
    let scores = std::fs::read_to_string(streamed.join("scores.csv")).unwrap();
    assert!(
        scores.lines().skip(1).all(|l| !l.starts_with(',')),
        "every score row names its allocation"
    );
}

#[test]
fn vcluster_by_queue_needs_only_the_vclusters_jobs_use() {
    // An SWF whose queue field is 1..5 and a profile defining q1..q5 (and no `default`): the
    // importer also registers `default`, which no job is in; that must not be required.
    let dir = tmp("by-queue");
    let mut swf = String::from("; MaxNodes: 8\n; MaxProcs: 8\n");
    for i in 0..10u32 {
        let q = i % 5 + 1;
        swf.push_str(&format!(
            "{} {} -1 60 2 -1 -1 2 120 -1 1 {} 1 -1 {q} -1 -1 -1\n",
            i + 1,
            i * 10,
            i % 3 + 1
        ));
    }
    let trace = dir.join("queues.swf");
    std::fs::write(&trace, swf).unwrap();
    let mut prof = String::new();
    for q in 1..=5 {
        prof.push_str(&format!(
            "q{q}:\n  priority: 0.2\n  wait_time: 0.4\n  fair_share: 0.4\n  topology: 0\n  data_readiness: 0\n  backlog: 0\n  energy: 0\n  checkpoint: 0\n  conformance: 0\n  policy: easy\n"
        ));
    }
    let profile = dir.join("queues.yaml");
    std::fs::write(&profile, prof).unwrap();
    let out = dir.join("out");
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--vcluster-by-queue",
        "--weights",
        profile.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["jobs"], 10);
    let per_vc = v["per_vcluster"].as_object().unwrap();
    for q in 1..=5 {
        assert_eq!(per_vc[&format!("q{q}")]["jobs"], 2, "{per_vc:?}");
    }
    // A queue the profile lacks is still refused, naming it.
    std::fs::write(
        &trace,
        "; MaxNodes: 8\n1 0 -1 60 2 -1 -1 2 120 -1 1 1 1 -1 6 -1 -1 -1\n",
    )
    .unwrap();
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--vcluster-by-queue",
        "--weights",
        profile.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("the trace uses vCluster `q6`"), "{}", text(&o));
}

#[test]
fn tenants_quotas_and_claims_end_to_end() {
    let dir = tmp("tenants");
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 3, "walltime": "1h", "duration": "1h", "tenant": "physics"}}
{"ts": 1, "type": "submit", "alloc": {"id": "b", "nodes": 3, "walltime": "1h", "duration": "1h", "tenant": "physics"}}
{"ts": 2, "type": "claim", "claim": {"id": "c", "nodes": 1, "tenant": "hospital", "user": "dr-x"}}
{"ts": 602, "type": "release", "alloc_id": "c"}
"#,
    )
    .unwrap();
    let tenants = dir.join("tenants.yaml");
    std::fs::write(&tenants, "physics:\n  max_nodes: 4\n").unwrap();
    let inv = dir.join("inv.yaml");
    std::fs::write(&inv, "nodes:\n  - prefix: n\n    count: 8\n").unwrap();
    let out = dir.join("out");
    let o = rm_replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        inv.to_str().unwrap(),
        "--tenants",
        tenants.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(v["sensitive_claims"], 1);
    assert_eq!(v["sensitive_wait_max_s"], 0.0);
    assert_eq!(v["audit_chain_valid"], true);
    let csv = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let b = csv.lines().find(|l| l.starts_with("b,")).unwrap();
    assert!(b.starts_with("b,1,3600,"), "max_nodes 4 holds b until a ends: {b}");
    let audit = std::fs::read_to_string(out.join("audit.jsonl")).unwrap();
    assert_eq!(audit.lines().count(), 4, "claim, start, release, wipe: {audit}");
    assert!(audit.lines().next().unwrap().contains("\"action\":\"claim\""));
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "physics:\n  max_gpus: 1\n").unwrap();
    let o = rm_replay(&["--tenants", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("max_gpus"), "{}", text(&o));
}

#[test]
fn validate_reports_every_problem_with_its_line() {
    let dir = tmp("validate");
    let good = dir.join("good.jsonl");
    std::fs::write(
        &good,
        "{\"ts\": 0, \"type\": \"submit\", \"alloc\": {\"nodes\": 1, \"walltime\": 60}}\n",
    )
    .unwrap();
    let o = rm_replay(&["validate", good.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let bad = dir.join("bad.jsonl");
    let mut lines = String::new();
    for i in 0..30 {
        lines.push_str(&format!("{{\"ts\": {i}, \"type\": \"explode\"}}\n"));
    }
    lines.push_str("{\"ts\": 40, \"type\": \"submit\", \"alloc\": {\"nodes\": 1}}\n");
    std::fs::write(&bad, lines).unwrap();
    let o = rm_replay(&["validate", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o);
    assert!(
        out.contains("bad.jsonl:30: field `type`: unknown event type `explode`"),
        "{out}"
    );
    assert!(out.contains("bad.jsonl:31: field `alloc.walltime`"), "{out}");
    assert!(out.contains("31 problems"), "{out}");
}

/// `--baseline`: the demo trace with hpc-batch against balanced prints the comparison block, writes the
/// baseline's outputs and `comparison.txt`; `compare DIR_A DIR_B` prints the same block from the folders;
/// a folder without a summary is a clear error.
#[test]
fn baseline_comparison_and_compare_command() {
    let dir = tmp("baseline");
    let out = dir.join("hpc-batch");
    let o = rm_replay(&[
        "--weights",
        "profiles/hpc-batch.yaml",
        "--baseline",
        "profiles/balanced.yaml",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("=== RM-Replay Results: hpc-batch (baseline: balanced) ==="),
        "{t}"
    );
    for section in [
        "p95: ",
        "(baseline: ",
        "Fairness (Jain's Index, demand-aware):",
        "Service Fairness",
        "Backfill jobs: ",
        "Preemptions:",
    ] {
        assert!(t.contains(section), "missing {section} in {t}");
    }
    let cmp = std::fs::read_to_string(out.join("comparison.txt")).unwrap();
    assert!(t.contains(&cmp));
    let (a, b) = (out.clone(), out.join("baseline"));
    assert!(b.join("summary.json").exists());
    let o = rm_replay(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("=== RM-Replay Results: hpc-batch (baseline: baseline) ==="),
        "{t}"
    );
    // Same numbers as the live comparison (only the header's names differ).
    let body = |s: &str| s.lines().skip(1).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(body(&t), body(&cmp));
    let o = rm_replay(&["compare", a.to_str().unwrap(), dir.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("summary.json"), "{}", text(&o));
}

/// `sweep`: a 2×2 grid on the demo trace writes one row and one profile per run, the table does not
/// depend on the thread count, `--emit-profile` writes the best run's profile (which replays), and bad
/// `--vary`/`--objective` are clear errors before anything runs.
#[test]
fn sweep_grid_is_deterministic_and_emits_the_best_profile() {
    let dir = tmp("sweep");
    let table = |threads: &str| {
        let out = dir.join(format!("t{threads}"));
        let best = dir.join(format!("best{threads}.yaml"));
        let o = rm_replay(&[
            "sweep",
            "--weights",
            "profiles/hpc-batch.yaml",
            "--vary",
            "fair_share=0.1:0.3:0.2",
            "--vary",
            "wait_time=0.1:0.3:0.2",
            "--objective",
            "minimize p95_wait subject to utilization >= 0.1",
            "--threads",
            threads,
            "--emit-profile",
            best.to_str().unwrap(),
            "--report",
            out.join("sweep.html").to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("4 runs"), "{}", text(&o));
        let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
        let parquet = std::fs::read(out.join("sweep.parquet")).unwrap();
        assert!(
            parquet.starts_with(b"PAR1") && parquet.ends_with(b"PAR1"),
            "sweep.parquet is Parquet"
        );
        // Without the profile path column (it names the output folder).
        let rows: Vec<String> = csv.lines().map(|l| l.rsplit_once(',').unwrap().0.to_string()).collect();
        (rows, std::fs::read_to_string(best).unwrap(), text(&o))
    };
    let (one, best1, out1) = table("1");
    let (two, best2, _) = table("2");
    // The sweep report (written by the 1-thread run): Pareto and sensitivity charts with data.
    let html = std::fs::read_to_string(dir.join("t1").join("sweep.html")).unwrap();
    for id in ["pareto", "sensitivity", "runs"] {
        assert!(html.contains(&format!("<section id=\"{id}\">")), "missing {id}");
    }
    let svgs: Vec<&str> = html.split("<svg").skip(1).collect();
    assert_eq!(svgs.len(), 2);
    assert!(svgs[0].matches("<circle").count() >= 5, "4 runs + the best ring");
    // One line per varied weight (plus its legend swatch).
    assert!(svgs[1].matches("<polyline").count() >= 2);
    assert!(svgs[1].contains("fair_share") && svgs[1].contains("wait_time"));
    assert!(html.contains("(best)"));
    assert_eq!(one.len(), 5);
    assert!(one[0].starts_with("run,priority,wait_time,fair_share"));
    assert_eq!(one, two);
    assert_eq!(best1, best2);
    assert!(best1.contains("fair_share:"), "{best1}");
    // The best row is the feasible one with the lowest p95 wait.
    let header: Vec<&str> = one[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let p95: Vec<f64> = one[1..]
        .iter()
        .map(|r| r.split(',').nth(col("p95_wait_s")).unwrap().parse().unwrap())
        .collect();
    let min = p95.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(out1.contains(&format!("p95_wait = {min}")), "{out1} {p95:?}");
    assert!(out1.contains("pareto front (utilization vs p95 wait): runs "), "{out1}");
    let sens = std::fs::read_to_string(dir.join("t1").join("sensitivity.csv")).unwrap();
    assert_eq!(sens.lines().next(), Some("weight,value,mean_p95_wait,runs"));
    // Two weights × two values, two runs each.
    assert_eq!(sens.lines().skip(1).filter(|l| l.ends_with(",2")).count(), 4, "{sens}");
    // The lowest-p95 run with the highest utilization among those is on the front.
    let field = |r: &str, c: &str| r.split(',').nth(col(c)).unwrap().parse::<f64>().unwrap();
    let best_row = one[1..]
        .iter()
        .filter(|r| field(r, "p95_wait_s") == min)
        .max_by(|a, b| field(a, "utilization").total_cmp(&field(b, "utilization")))
        .unwrap();
    assert_eq!(best_row.split(',').nth(col("pareto")), Some("true"), "{best_row}");
    // The emitted profile is a valid profile.
    let o = rm_replay(&["--weights", dir.join("best1.yaml").to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    for (args, want) in [
        (vec!["--vary", "fairshare=0:1:0.5"], "not a weight"),
        (vec!["--vary", "fair_share=0:1"], "needs a STEP"),
        (
            vec!["--vary", "fair_share=0:1:0.5", "--objective", "minimize p96_wait"],
            "p96_wait",
        ),
    ] {
        let mut a = vec![
            "sweep",
            "--weights",
            "profiles/hpc-batch.yaml",
            "--output",
            dir.to_str().unwrap(),
        ];
        a.extend(args);
        let o = rm_replay(&a);
        assert!(!o.status.success());
        assert!(text(&o).contains(want), "{}", text(&o));
    }
}

/// `--report`: one self-contained HTML file with every section, each chart an inline SVG with data
/// (both runs' curves when there is a baseline), no network fetches, and the same bytes on a rerun.
#[test]
fn report_is_self_contained_with_every_chart() {
    let dir = tmp("report");
    let path = dir.join("report.html");
    let args = [
        "--weights",
        "profiles/hpc-batch.yaml",
        "--baseline",
        "profiles/balanced.yaml",
        "--report",
        path.to_str().unwrap(),
        "--quiet",
    ];
    let o = rm_replay(&args);
    assert!(o.status.success(), "{}", text(&o));
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("RM-Replay report: hpc-batch vs balanced"));
    for id in [
        "config",
        "metrics",
        "classes",
        "utilization",
        "waits",
        "tenants",
        "gantt",
        "events",
        "bsld",
        "placement",
    ] {
        assert!(html.contains(&format!("<section id=\"{id}\">")), "missing section {id}");
    }
    // The fairness table, with its definitions one click away.
    let tenants = &html[html.find("<section id=\"tenants\">").unwrap()..];
    assert!(
        tenants.contains("<td>demand-aware Jain's index</td>")
            && tenants.contains("<td>tenant slowdown Jain's index</td>")
    );
    assert!(tenants.contains("<details><summary>How these are defined</summary>"));
    assert!(
        html.contains("<td>fairness (demand-aware Jain)</td>"),
        "in the headline metrics"
    );
    // Nine charts; line charts carry a curve per run (the utilization chart two per run, the tenant
    // chart one per top tenant and run, the events chart one per kind and run); the Gantt has one heat
    // map per run.
    let svgs: Vec<&str> = html.split("<svg").skip(1).collect();
    assert_eq!(svgs.len(), 9);
    let [util, waits, tenants, gantt_a, gantt_b, events, bsld, span, conf] = svgs[..] else {
        unreachable!()
    };
    // Placement histograms: every allocation of the demo machine spans one group and is fully
    // conformant, so each chart has at least one bar per run.
    assert!(span.matches("<rect").count() >= 2 && conf.matches("<rect").count() >= 2);
    assert!(util.matches("<polyline").count() >= 4);
    assert!(waits.matches("<polyline").count() >= 2);
    assert!(tenants.matches("<polyline").count() >= 4);
    assert!(bsld.matches("<rect").count() >= 4);
    // The demo machine is busy: its Gantt heat maps have shaded cells (48 node blocks, many shades).
    assert!(gantt_a.matches("<rect").count() >= 48 && gantt_b.matches("<rect").count() >= 48);
    assert!(events.matches("<polyline").count() >= 10, "5 event kinds × 2 runs");
    // Per-class and per-tenant tables (polars), one per run; the tenant table names targets.
    assert!(
        html.contains("<h3>hpc-batch</h3>") && html.contains("<h3>balanced</h3>"),
        "class tables"
    );
    assert!(html.contains("<th>share_minus_target</th>"), "tenant table");
    assert!(html.contains("<td class=\"better\">") || html.contains("<td class=\"worse\">"));
    // Nothing is fetched: no scripts, stylesheets or images by URL (the SVG namespace is not a fetch).
    for bad in ["<script", "<link", "src=\"http", "href=\"http", "url(http"] {
        assert!(!html.contains(bad), "report fetches something: {bad}");
    }
    let o = rm_replay(&args);
    assert!(o.status.success());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), html, "same inputs, same bytes");
}

/// The browser check: headless Chromium opens the report, takes a screenshot, and the page rendered —
/// a good share of non-white pixels and the charts' blue and orange curves — without console errors.
/// Runs where Chromium is installed (`.ci/run` installs it); elsewhere it says it skipped.
#[test]
fn report_renders_in_headless_chromium() {
    let Some(browser) = ["chromium", "chromium-browser", "google-chrome"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        eprintln!("skipped: no Chromium on this machine");
        return;
    };
    let dir = tmp("chromium");
    let report = dir.join("report.html");
    let o = rm_replay(&[
        "--weights",
        "profiles/hpc-batch.yaml",
        "--baseline",
        "profiles/balanced.yaml",
        "--report",
        report.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let shot = dir.join("shot.png");
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--window-size=1000,2000",
            &format!("--screenshot={}", shot.display()),
            &format!("file://{}", report.display()),
        ])
        .output()
        .expect("chromium runs");
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(
        !log.contains("Uncaught") && !log.contains(":CONSOLE("),
        "console errors: {log}"
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let px = &buf[..info.buffer_size()];
    let (mut ink, mut blue, mut orange, mut total) = (0usize, 0usize, 0usize, 0usize);
    for p in px.chunks(channels) {
        let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
        total += 1;
        if r < 240 || g < 240 || b < 240 {
            ink += 1;
        }
        // The two series colours (31,119,180) and (255,127,14), with anti-aliasing slack.
        if (r - 31).abs() < 30 && (g - 119).abs() < 30 && (b - 180).abs() < 30 {
            blue += 1;
        }
        if (r - 255).abs() < 30 && (g - 127).abs() < 30 && (b - 14).abs() < 40 {
            orange += 1;
        }
    }
    assert_eq!((info.width, info.height), (1000, 2000));
    assert!(ink * 100 > total * 5, "mostly blank: {ink} of {total} pixels drawn");
    assert!(
        blue > 500 && orange > 500,
        "series colours missing: blue {blue}, orange {orange}"
    );
}

/// `bench report` times the report of a replayed trace (a smoke test of the mode, not a timing).
#[test]
fn bench_report_mode_runs() {
    let o = rm_replay(&[
        "bench",
        "--runs",
        "1",
        "report",
        "--trace",
        "traces/library/demo-128n.swf",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("report best_ms="), "{}", text(&o));
}

/// `--tables`: the run's polars tables land in DIR/tables as Parquet and CSV; without --output it is a
/// clear error.
#[test]
fn tables_flag_exports_parquet_and_csv() {
    let dir = tmp("tables");
    let o = rm_replay(&["--output", dir.to_str().unwrap(), "--tables", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    for f in [
        "jobs.parquet",
        "intervals.parquet",
        "intervals.csv",
        "tenant_intervals.parquet",
        "tenants.parquet",
        "tenants.csv",
        "classes.csv",
    ] {
        let bytes = std::fs::read(dir.join("tables").join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        if f.ends_with(".parquet") {
            assert!(bytes.starts_with(b"PAR1"), "{f}");
        } else {
            assert!(bytes.len() > 40, "{f}");
        }
    }
    let o = rm_replay(&["--tables", "--quiet"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--tables needs --output DIR"), "{}", text(&o));
}

/// `--slo-wait`: per-class target waits; a tighter target can only lower compliance; a bad value is
/// refused naming the flag's problem.
#[test]
fn slo_wait_targets_set_compliance() {
    let dir = tmp("slo");
    let read = |out: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
    };
    let (a, b) = (dir.join("default"), dir.join("tight"));
    let o = rm_replay(&["--quiet", "--output", a.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = rm_replay(&["--quiet", "--slo-wait", "0-10=1s", "--output", b.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (x, y) = (read(&a), read(&b));
    let (cx, cy) = (
        x["slo_wait_compliance"].as_f64().unwrap(),
        y["slo_wait_compliance"].as_f64().unwrap(),
    );
    assert!(cy < cx && cx <= 1.0, "1 s is tighter than 1 h: {cy} vs {cx}");
    assert!(
        x["slo_wait_compliance_by_class"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
    );
    assert!(text(&rm_replay(&["--slo-wait", "0-10=1s"])).contains("SLO (wait <= class target):"));
    for bad in ["11=1h", "5-2=1h", "3=soon", "x"] {
        let o = rm_replay(&["--slo-wait", bad]);
        assert!(!o.status.success(), "{bad} accepted");
        assert!(text(&o).contains("--slo-wait"), "{bad}: {}", text(&o));
    }
}

/// `rm-replay fuzz`: a budget of a target, its last line, and an unknown target refused.
#[test]
fn fuzz_command_runs_a_target() {
    let o = rm_replay(&["fuzz", "--target", "tenants", "--cases", "50", "--seed", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("fuzz target=tenants cases=50 refused=") && last.contains(" panics=0 findings=0 "),
        "{last}"
    );
    let o = rm_replay(&["fuzz", "--target", "nope", "--cases", "1"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("unknown fuzz target `nope`"), "{}", text(&o));
}

/// `sweep --shard K/N` + `sweep merge`: three slices of a 2×2 grid merge into exactly the unsharded
/// sweep's table, sensitivity and best profile; an incomplete or mixed set of shards is refused
/// before anything is written.
#[test]
fn sharded_sweep_merges_to_the_unsharded_result() {
    let dir = tmp("sweep-shards");
    let sweep = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "sweep",
            "--weights",
            "profiles/hpc-batch.yaml",
            "--vary",
            "fair_share=0.1:0.3:0.2",
            "--vary",
            "wait_time=0.1:0.3:0.2",
            "--objective",
            "minimize p95_wait subject to utilization >= 0.1",
            "--threads",
            "1",
            "--output",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        let o = rm_replay(&a);
        assert!(o.status.success(), "{}", text(&o));
        o
    };
    let whole = dir.join("whole");
    let best_whole = dir.join("best-whole.yaml");
    sweep(&whole, &["--emit-profile", best_whole.to_str().unwrap()]);
    let shards: Vec<_> = (0..3).map(|k| dir.join(format!("s{k}"))).collect();
    for (k, s) in shards.iter().enumerate() {
        let o = sweep(s, &["--shard", &format!("{k}/3")]);
        assert!(text(&o).contains(&format!("shard {k}/3")), "{}", text(&o));
        assert!(!s.join("sweep.csv").exists(), "a shard writes no table of its own");
    }
    let merged = dir.join("merged");
    let best_merged = dir.join("best-merged.yaml");
    let merge = |dirs: &[&Path], out: &Path| {
        let mut a = vec!["sweep", "merge"];
        a.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        a.extend([
            "--output",
            out.to_str().unwrap(),
            "--emit-profile",
            best_merged.to_str().unwrap(),
        ]);
        rm_replay(&a)
    };
    // Refusals first: a missing slice, and a slice given twice; nothing is written.
    let refused = dir.join("refused");
    for (dirs, want) in [
        (vec![shards[0].as_path(), shards[1].as_path()], "missing"),
        (
            vec![shards[0].as_path(), shards[0].as_path(), shards[1].as_path()],
            "twice",
        ),
    ] {
        let o = merge(&dirs, &refused);
        assert!(!o.status.success());
        assert!(text(&o).contains(want), "{}", text(&o));
        assert!(!refused.exists(), "a refused merge writes nothing");
        assert!(!best_merged.exists());
    }
    let o = merge(&[&shards[0], &shards[1], &shards[2]], &merged);
    assert!(o.status.success(), "{}", text(&o));
    let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    // The profile column names each output folder; otherwise the tables are the same bytes.
    let whole_csv = read(&whole, "sweep.csv").replace(whole.to_str().unwrap(), "OUT");
    let merged_csv = read(&merged, "sweep.csv").replace(merged.to_str().unwrap(), "OUT");
    assert_eq!(whole_csv, merged_csv);
    assert_eq!(whole_csv.lines().count(), 5);
    assert_eq!(read(&whole, "sensitivity.csv"), read(&merged, "sensitivity.csv"));
    assert_eq!(
        std::fs::read(&best_whole).unwrap(),
        std::fs::read(&best_merged).unwrap()
    );
    for i in 0..4 {
        let f = format!("profiles/run-{i:04}.yaml");
        assert_eq!(read(&whole, &f), read(&merged, &f), "{f}");
    }
    assert!(merged.join("sweep.parquet").exists());
}

/// `bench scale` on a small site: generates the site once (reused on the second call), replays every
/// job in a fresh process, and ends with the `scale ...` line.
#[test]
fn bench_scale_reports_its_line_and_reuses_the_site() {
    let dir = tmp("bench-scale");
    let run = || {
        let o = rm_replay(&[
            "bench",
            "--runs",
            "1",
            "scale",
            "--jobs",
            "1500",
            "--nodes",
            "600",
            "--dir",
            dir.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let first = run();
    assert!(first.contains("generated"), "{first}");
    let last = first.lines().rfind(|l| l.starts_with("scale ")).unwrap().to_string();
    let field = |k: &str| -> f64 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(field("jobs="), 1500.0, "{last}");
    assert!(field("wall_s=") > 0.0 && field("peak_rss_mib=") > 0.0 && field("events_per_s=") > 0.0);
    let second = run();
    assert!(!second.contains("generated"), "the site is reused: {second}");
}
