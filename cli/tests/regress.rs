//! `rm-replay regress`, `import` and `anonymise` end to end (run from the repository root, as CI does).

mod common;
use common::{rm_replay, root, text, tmp};
use std::path::{Path, PathBuf};
use std::process::Command;

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The whole library — the six generated traces with the seed's key metrics and the real traces pinned
/// to today's behaviour — passes, and the JSON result names every check with its value.
#[test]
fn regression_suite_passes() {
    let dir = tmp("suite");
    let out = dir.join("regress.json");
    let o = rm_replay(&["regress", "--json", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 failed"), "{}", text(&o));
    let v = json(&out);
    assert_eq!(v["pass"], true);
    let traces = v["traces"].as_array().unwrap();
    let names: Vec<&str> = traces.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in [
        "steady-state",
        "burst",
        "unfair",
        "sensitive-claim",
        "preemption-heavy",
        "empty-to-full",
        "kth-sp2",
        "lanl-cm5",
        "nasa-ipsc",
        "hpc2n",
        "lcg",
        "alibaba-openb",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    for t in traces {
        assert!(t["error"].is_null(), "{t}");
        for c in t["checks"].as_array().unwrap() {
            assert!(c["value"].is_number() && c["pass"] == true, "{c}");
        }
    }
}

/// Deliberately bad profiles fail the threshold they should (so the suite can fail):
/// - `steady-state` under FCFS (no backfill) with a 30-minute cycle: holes stay idle and freed nodes
///   wait for the next tick, utilization drops under 85 % (FCFS alone still reaches ~87 % at this load);
/// - `burst` under FCFS: the spike queues behind wide jobs, p99 wait passes 4 h;
/// - `unfair` under FCFS with fair_share 0: the flooding tenant takes its submission share;
/// - `sensitive-claim` with the sensitive pool lending its nodes (lend_cap 1.0): claims must first
///   reclaim them, so they wait;
/// - `preemption-heavy` with preemption off: the trace no longer exercises preemption, which its
///   `preemptions >= 50` guard catches (the checkpoint threshold alone would pass vacuously);
/// - `empty-to-full` with a 30-minute cycle: the machine fills only at the first tick.
#[test]
fn bad_profiles_fail_the_thresholds_they_should() {
    let dir = tmp("bad");
    let lib = root().join("traces/library").canonicalize().unwrap();
    let profiles = root().join("profiles");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).unwrap();
    };
    let balanced = read(profiles.join("balanced.yaml"));
    let fcfs = balanced
        .replace("policy: backfill", "policy: fcfs")
        .replace("  backfill_depth: 10\n", "");
    write("fcfs.yaml", fcfs.clone());
    write(
        "fcfs-slow.yaml",
        fcfs.replace("cycle_interval: 15s", "cycle_interval: 30m"),
    );
    write("nofair.yaml", fcfs.replace("fair_share: 0.20", "fair_share: 0.00"));
    write(
        "lending.yaml",
        read(lib.join("sensitive-claim.profile.yaml")).replace("lend_cap: 0.0", "lend_cap: 1.0"),
    );
    write(
        "nopreempt.yaml",
        read(profiles.join("ml-training.yaml"))
            .replace("  policy: backfill", "  preemption: false\n  policy: backfill"),
    );
    write(
        "slow.yaml",
        read(profiles.join("hpc-batch.yaml")).replace("cycle_interval: 15s", "cycle_interval: 30m"),
    );
    let l = lib.display();
    let entry = |name: &str, trace: &str, inv: &str, weights: &str, extra: &str, threshold: &str| {
        format!(
            "  - {{name: {name}, trace: {l}/{trace}.jsonl, inventory: {l}/{inv}, tenants: {l}/tenants.yaml, weights: {weights}{extra}, thresholds: [\"{threshold}\"]}}\n"
        )
    };
    let manifest = format!(
        "traces:\n{}{}{}{}{}{}",
        entry(
            "steady-fcfs",
            "steady-state",
            "library-128.yaml",
            "fcfs-slow.yaml",
            "",
            "utilization > 0.85"
        ),
        entry(
            "burst-fcfs",
            "burst",
            "library-128.yaml",
            "fcfs.yaml",
            "",
            "p99_wait_s < 4h"
        ),
        entry(
            "unfair-nofair",
            "unfair",
            "library-128.yaml",
            "nofair.yaml",
            ", horizon: 4d",
            "max_share_deviation < 0.10"
        ),
        entry(
            "sensitive-lending",
            "sensitive-claim",
            "library-sensitive-128.yaml",
            "lending.yaml",
            "",
            "sensitive_wait_max_s == 0"
        ),
        entry(
            "preemption-off",
            "preemption-heavy",
            "library-128.yaml",
            "nopreempt.yaml",
            "",
            "preemptions >= 50"
        ),
        entry(
            "slow-cycle",
            "empty-to-full",
            "library-128.yaml",
            "slow.yaml",
            "",
            "ramp_up_s < 10min"
        ),
    );
    write("manifest.yaml", manifest);
    let out = dir.join("r.json");
    let o = rm_replay(&[
        "regress",
        "--library",
        dir.join("manifest.yaml").to_str().unwrap(),
        "--json",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("6 failed"), "{}", text(&o));
    let v = json(&out);
    assert_eq!(v["pass"], false);
    for t in v["traces"].as_array().unwrap() {
        assert!(t["error"].is_null(), "{t}");
        assert_eq!(t["checks"][0]["pass"], false, "{} should fail: {t}", t["name"]);
    }
}

/// A threshold that does not parse is an error naming the manifest and the trace, before any replay.
#[test]
fn manifest_errors_name_the_trace() {
    let dir = tmp("badmanifest");
    let m = dir.join("manifest.yaml");
    std::fs::write(
        &m,
        "traces:\n  - {name: x, trace: t.swf, thresholds: [\"utilization >> 1\"]}\n",
    )
    .unwrap();
    let o = rm_replay(&[
        "regress",
        "--library",
        m.to_str().unwrap(),
        "--json",
        dir.join("r.json").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("trace `x`") && t.contains("utilization >> 1"), "{t}");
    std::fs::write(
        &m,
        "traces:\n  - {name: x, trace: t.swf, colour: red, thresholds: []}\n",
    )
    .unwrap();
    let o = rm_replay(&["regress", "--library", m.to_str().unwrap()]);
    assert!(text(&o).contains("colour"), "{}", text(&o));
}

/// A Slurm site goes from its sacct dump to a report in two commands (docs/traces.md's).
#[test]
fn sacct_dump_to_report_in_two_commands() {
    let dir = tmp("sacct");
    let jsonl = dir.join("site.jsonl");
    let o = rm_replay(&[
        "import",
        "sacct",
        "traces/tests/fixtures/sacct-awkward.txt",
        "--output",
        jsonl.to_str().unwrap(),
        "--cluster-nodes",
        "16",
        "--gpus-per-node",
        "4",
        "--gpu-type",
        "a100",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("17 lines read, 7 allocations written, 10 skipped"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains(":17: field `line`"),
        "problems name their line: {}",
        text(&o)
    );
    let inv = dir.join("site.inventory.yaml");
    let report = dir.join("report.html");
    let o = rm_replay(&[
        "--trace",
        jsonl.to_str().unwrap(),
        "--nodes",
        inv.to_str().unwrap(),
        "--weights",
        "profiles/hpc-batch.yaml",
        "--output",
        dir.join("out").to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let s = json(&dir.join("out/summary.json"));
    assert_eq!(s["jobs"], 7);
    assert_eq!(s["unfinished"], 0);
    assert!(
        std::fs::read_to_string(report)
            .unwrap()
            .contains("<section id=\"gantt\">")
    );
}

/// SWF → JSONL replays exactly like the SWF itself; anonymising the JSONL changes names only.
#[test]
fn swf_import_and_anonymise_replay_the_same() {
    let dir = tmp("swf");
    let jsonl = dir.join("hpc2n.jsonl");
    let o = rm_replay(&[
        "import",
        "swf",
        "../shared/traces/hpc2n.swf",
        "--output",
        jsonl.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let inv = dir.join("hpc2n.inventory.yaml");
    assert!(inv.exists());
    let anon = dir.join("hpc2n-anon.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(["anonymise", jsonl.to_str().unwrap(), "--output", anon.to_str().unwrap()])
        .env("LATTICE_ANON_KEY", "test-key")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("tenant 3145"), "{}", text(&o));
    let summary = |args: &[&str], name: &str| {
        let out = dir.join(name);
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--policy", "easy", "--quiet", "--output", out.to_str().unwrap()]);
        let o = rm_replay(&a);
        assert!(o.status.success(), "{}", text(&o));
        json(&out.join("summary.json"))
    };
    let swf = summary(&["--trace", "../shared/traces/hpc2n.swf"], "swf");
    let via_jsonl = summary(
        &["--trace", jsonl.to_str().unwrap(), "--nodes", inv.to_str().unwrap()],
        "jsonl",
    );
    let via_anon = summary(
        &["--trace", anon.to_str().unwrap(), "--nodes", inv.to_str().unwrap()],
        "anon",
    );
    for key in [
        "jobs",
        "utilization",
        "mean_bsld",
        "p95_wait_s",
        "backfilled",
        "jain_index",
    ] {
        assert_eq!(swf[key], via_jsonl[key], "{key}");
        assert_eq!(via_jsonl[key], via_anon[key], "{key}");
    }
    let anon_text = std::fs::read_to_string(&anon).unwrap();
    assert!(anon_text.contains("\"tenant\":\"tenant-"));
    // No key, no anonymisation.
    let o = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(["anonymise", jsonl.to_str().unwrap(), "--output", anon.to_str().unwrap()])
        .env_remove("LATTICE_ANON_KEY")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// `regress --shard K/N` + `regress-merge`: two slices of three library entries merge into the
/// unsharded run's JSON (but for measured times); a missing slice is refused and writes nothing.
#[test]
fn sharded_regress_merges_to_the_unsharded_result() {
    let dir = tmp("regress-shards");
    let only = [
        "--only",
        "burst",
        "--only",
        "empty-to-full",
        "--only",
        "sensitive-claim",
    ];
    let run = |json_path: &Path, extra: &[&str]| {
        let mut a = vec!["regress", "--threads", "1", "--json", json_path.to_str().unwrap()];
        a.extend_from_slice(&only);
        a.extend_from_slice(extra);
        let o = rm_replay(&a);
        assert!(o.status.success(), "{}", text(&o));
    };
    let whole = dir.join("whole.json");
    run(&whole, &[]);
    let (s0, s1) = (dir.join("s0.json"), dir.join("s1.json"));
    run(&s0, &["--shard", "0/2"]);
    run(&s1, &["--shard", "1/2"]);
    assert_eq!(json(&s0)["traces"].as_array().unwrap().len(), 2);
    assert_eq!(json(&s1)["traces"].as_array().unwrap().len(), 1);
    let merged = dir.join("merged.json");
    let refused = rm_replay(&[
        "regress-merge",
        s0.to_str().unwrap(),
        "--json",
        merged.to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("missing"), "{}", text(&refused));
    assert!(!merged.exists(), "a refused merge writes nothing");
    let o = rm_replay(&[
        "regress-merge",
        s1.to_str().unwrap(),
        s0.to_str().unwrap(),
        "--json",
        merged.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("3 traces"), "{}", text(&o));
    let strip = |mut v: serde_json::Value| {
        // Wall times and the engine's CPU time per cycle are measured, not replayed.
        for t in v["traces"].as_array_mut().unwrap() {
            t["wall_s"] = serde_json::Value::Null;
            for c in t["checks"].as_array_mut().unwrap() {
                if c["metric"].as_str().unwrap().starts_with("cycle_cpu") {
                    c["value"] = serde_json::Value::Null;
                }
            }
        }
        v
    };
    assert_eq!(strip(json(&whole)), strip(json(&merged)));
}
