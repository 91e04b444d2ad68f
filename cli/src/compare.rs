//! The seed's "RM-Replay Results" block against a baseline (Performance Tuning Guide, step 4): every
//! headline metric with the baseline's value and the relative change with an arrow, overall and per
//! vCluster. Works on `summary.json` values, so a live run and two output folders compare the same way.

use crate::report::{human_duration, thousands};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Reads `DIR/summary.json` (a previous `rm-replay --output DIR`).
pub fn read_summary(dir: &Path) -> Result<Value> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    for key in [
        "utilization",
        "p50_wait_s",
        "p95_wait_s",
        "p99_wait_s",
        "jain_index",
        "backfilled",
    ] {
        if !v.get(key).is_some_and(Value::is_number) {
            bail!(
                "{}: field `{key}` is missing or not a number (is this an rm-replay summary?)",
                path.display()
            );
        }
    }
    Ok(v)
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// `↑ 20%`, `↓ 16%`, `= 0%`; against a zero baseline the change is not a ratio (`↑ new`).
pub fn change(value: f64, baseline: f64) -> String {
    if value == baseline {
        return "= 0%".into();
    }
    let arrow = if value > baseline { '↑' } else { '↓' };
    if baseline == 0.0 {
        return format!("{arrow} from 0");
    }
    format!("{arrow} {:.0}%", ((value - baseline) / baseline * 100.0).abs())
}

/// Utilization moves in percentage points (the seed's example: 82.3 % vs 84.4 % is "↓ 2.1%").
fn points(value: f64, baseline: f64) -> String {
    let d = (value - baseline) * 100.0;
    if d.abs() < 0.05 {
        "= 0.0 points".into()
    } else {
        format!("{} {:.1} points", if d > 0.0 { '↑' } else { '↓' }, d.abs())
    }
}

/// The comparison block: `name` against `baseline_name`.
pub fn render(name: &str, run: &Value, baseline_name: &str, base: &Value) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "=== RM-Replay Results: {name} (baseline: {baseline_name}) ===");
    let _ = writeln!(
        o,
        "Trace: {} ({} jobs; baseline {} jobs)   Policy: {} (baseline: {})",
        run.get("trace").and_then(Value::as_str).unwrap_or("?"),
        thousands(num(run, "jobs") as u64),
        thousands(num(base, "jobs") as u64),
        run.get("policy").and_then(Value::as_str).unwrap_or("?"),
        base.get("policy").and_then(Value::as_str).unwrap_or("?"),
    );
    let (u, bu) = (num(run, "utilization"), num(base, "utilization"));
    let (gpu, bgpu) = (num(run, "gpu_hours"), num(base, "gpu_hours"));
    let _ = writeln!(o, "Utilization:");
    if gpu > 0.0 || bgpu > 0.0 {
        let _ = writeln!(
            o,
            "  GPU-hours consumed: {} (baseline: {}) {}",
            thousands(gpu.round() as u64),
            thousands(bgpu.round() as u64),
            change(gpu, bgpu)
        );
    }
    let _ = writeln!(
        o,
        "  Node-hours consumed: {} ({:.1}%)",
        thousands(num(run, "node_hours").round() as u64),
        u * 100.0
    );
    let _ = writeln!(o, "  {} vs baseline ({:.1}%)", points(u, bu), bu * 100.0);
    let _ = writeln!(o, "Wait Time:");
    for (label, key) in [("p50", "p50_wait_s"), ("p95", "p95_wait_s"), ("p99", "p99_wait_s")] {
        let (v, b) = (num(run, key), num(base, key));
        let _ = writeln!(
            o,
            "  {label}: {} (baseline: {}) {}",
            human_duration(v),
            human_duration(b),
            change(v, b)
        );
    }
    // Demand-aware: against each tenant's target capped by its demand, in windows with contention
    // (summaries written before these keys existed fall back to the whole-run figures, said so).
    let demand_aware = run.get("fair_share_jain").is_some() && base.get("fair_share_jain").is_some();
    let (jk, dk) = if demand_aware {
        ("fair_share_jain", "fair_share_dev_max")
    } else {
        ("jain_index", "max_share_deviation")
    };
    let (j, bj) = (num(run, jk), num(base, jk));
    let _ = writeln!(
        o,
        "Fairness (Jain's Index{}):",
        if demand_aware { ", demand-aware" } else { ", whole run" }
    );
    let _ = writeln!(o, "  {j:.2} (baseline: {bj:.2}) {}", change(j, bj));
    let (d, bd) = (num(run, dk), num(base, dk));
    let _ = writeln!(o, "Tenant Share Deviation:");
    let _ = writeln!(
        o,
        "  Max deviation: {:.1}% (baseline: {:.1}%) {}",
        d * 100.0,
        bd * 100.0,
        change(d, bd)
    );
    if demand_aware {
        let (m, bm) = (num(run, "fair_share_dev_mean"), num(base, "fair_share_dev_mean"));
        let _ = writeln!(
            o,
            "  Mean deviation: {:.1}% (baseline: {:.1}%) {}",
            m * 100.0,
            bm * 100.0,
            change(m, bm)
        );
        let (s, bs) = (num(run, "tenant_bsld_jain"), num(base, "tenant_bsld_jain"));
        let (w, bw) = (
            num(run, "tenant_bsld_worst_to_median"),
            num(base, "tenant_bsld_worst_to_median"),
        );
        let _ = writeln!(o, "Service Fairness (tenants' mean bounded slowdown):");
        let _ = writeln!(o, "  Jain's index: {s:.2} (baseline: {bs:.2}) {}", change(s, bs));
        let _ = writeln!(
            o,
            "  Worst / median tenant: {w:.2} (baseline: {bw:.2}) {}",
            change(w, bw)
        );
    }
    if run.get("slo_wait_compliance").is_some() && base.get("slo_wait_compliance").is_some() {
        let (c, bc) = (num(run, "slo_wait_compliance"), num(base, "slo_wait_compliance"));
        let _ = writeln!(o, "SLO Compliance (wait <= class target):");
        let _ = writeln!(
            o,
            "  {:.1}% met (baseline: {:.1}%) {}",
            c * 100.0,
            bc * 100.0,
            points(c, bc)
        );
    }
    let (bf, bbf) = (num(run, "backfilled"), num(base, "backfilled"));
    let _ = writeln!(o, "Backfill:");
    let _ = writeln!(
        o,
        "  Backfill jobs: {} (baseline: {}) {}",
        thousands(bf as u64),
        thousands(bbf as u64),
        change(bf, bbf)
    );
    let (p, bp) = (num(run, "preemptions"), num(base, "preemptions"));
    let _ = writeln!(o, "Preemptions:");
    let _ = writeln!(
        o,
        "  Total: {} (baseline: {}) {}",
        thousands(p as u64),
        thousands(bp as u64),
        change(p, bp)
    );
    // Per vCluster: the union of both runs' vClusters, in name order.
    let empty = serde_json::Map::new();
    let vcs = |v: &Value| {
        v.get("per_vcluster")
            .and_then(Value::as_object)
            .unwrap_or(&empty)
            .clone()
    };
    let (a, b) = (vcs(run), vcs(base));
    let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    // One vCluster on each side is the overall block again (even when the profiles name it differently).
    if a.len() > 1 || b.len() > 1 {
        let _ = writeln!(o, "Per vCluster:");
        for n in names {
            let (x, y) = match (a.get(n), b.get(n)) {
                (Some(x), Some(y)) => (x, y),
                (Some(_), None) => {
                    let _ = writeln!(o, "  {n}: only in this run");
                    continue;
                }
                _ => {
                    let _ = writeln!(o, "  {n}: only in the baseline");
                    continue;
                }
            };
            let _ = writeln!(
                o,
                "  {n}: utilization {:.1}% {}; wait p50 {} {}, p95 {} {}, p99 {} {}; backfill {} {}",
                num(x, "utilization") * 100.0,
                points(num(x, "utilization"), num(y, "utilization")),
                human_duration(num(x, "p50_wait_s")),
                change(num(x, "p50_wait_s"), num(y, "p50_wait_s")),
                human_duration(num(x, "p95_wait_s")),
                change(num(x, "p95_wait_s"), num(y, "p95_wait_s")),
                human_duration(num(x, "p99_wait_s")),
                change(num(x, "p99_wait_s"), num(y, "p99_wait_s")),
                thousands(num(x, "backfilled") as u64),
                change(num(x, "backfilled"), num(y, "backfilled")),
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrows_and_relative_changes() {
        assert_eq!(change(720.0, 600.0), "↑ 20%");
        assert_eq!(change(2.1, 2.5), "↓ 16%");
        assert_eq!(change(15.0, 15.0), "= 0%");
        assert_eq!(change(3.0, 0.0), "↑ from 0");
        assert_eq!(points(0.823, 0.844), "↓ 2.1 points");
    }

    #[test]
    fn block_has_every_metric_with_its_baseline() {
        let run = serde_json::json!({"trace": "t", "jobs": 10, "policy": "easy", "utilization": 0.823,
            "node_hours": 100.0, "p50_wait_s": 720.0, "p95_wait_s": 7560.0, "p99_wait_s": 29880.0,
            "jain_index": 0.94, "max_share_deviation": 0.032, "backfilled": 342, "preemptions": 15,
            "per_vcluster": {"hpc-batch": {"utilization": 0.8, "p50_wait_s": 720.0, "p95_wait_s": 7560.0,
                "p99_wait_s": 29880.0, "backfilled": 342}}});
        let base = serde_json::json!({"trace": "t", "jobs": 10, "policy": "easy", "utilization": 0.844,
            "node_hours": 110.0, "p50_wait_s": 600.0, "p95_wait_s": 9000.0, "p99_wait_s": 43560.0,
            "jain_index": 0.87, "max_share_deviation": 0.087, "backfilled": 367, "preemptions": 12,
            "per_vcluster": {"hpc-batch": {"utilization": 0.85, "p50_wait_s": 600.0, "p95_wait_s": 9000.0,
                "p99_wait_s": 43560.0, "backfilled": 367}, "ml": {"utilization": 0.5}}});
        let text = render("fairness-boost", &run, "hpc-batch", &base);
        for want in [
            "=== RM-Replay Results: fairness-boost (baseline: hpc-batch) ===",
            "↓ 2.1 points vs baseline (84.4%)",
            "p50: 12 min (baseline: 10 min) ↑ 20%",
            "p95: 2.1 hr (baseline: 2.5 hr) ↓ 16%",
            "p99: 8.3 hr (baseline: 12.1 hr) ↓ 31%",
            "Fairness (Jain's Index, whole run):",
            "0.94 (baseline: 0.87) ↑ 8%",
            "Max deviation: 3.2% (baseline: 8.7%) ↓ 63%",
            "Backfill jobs: 342 (baseline: 367) ↓ 7%",
            "Total: 15 (baseline: 12) ↑ 25%",
            "hpc-batch: utilization 80.0% ↓ 5.0 points; wait p50 12 min ↑ 20%",
            "ml: only in the baseline",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Summaries with the demand-aware keys compare those, with service fairness.
        let mut run2 = run.clone();
        let mut base2 = base.clone();
        for (v, j, d, m, sj, sw) in [
            (&mut run2, 0.62, 0.374, 0.12, 0.9, 1.5),
            (&mut base2, 0.5, 0.499, 0.2, 0.8, 2.0),
        ] {
            v["fair_share_jain"] = j.into();
            v["fair_share_dev_max"] = d.into();
            v["fair_share_dev_mean"] = m.into();
            v["tenant_bsld_jain"] = sj.into();
            v["tenant_bsld_worst_to_median"] = sw.into();
            v["slo_wait_compliance"] = (j + 0.3).into();
        }
        let text = render("fs", &run2, "base", &base2);
        for want in [
            "Fairness (Jain's Index, demand-aware):",
            "0.62 (baseline: 0.50) ↑ 24%",
            "Max deviation: 37.4% (baseline: 49.9%) ↓ 25%",
            "Mean deviation: 12.0% (baseline: 20.0%) ↓ 40%",
            "Jain's index: 0.90 (baseline: 0.80) ↑ 12%",
            "Worst / median tenant: 1.50 (baseline: 2.00) ↓ 25%",
            "92.0% met (baseline: 80.0%) ↑ 12.0 points",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // One vCluster each: no per-vCluster section (it would repeat the overall block).
        let mut one = base.clone();
        one["per_vcluster"].as_object_mut().unwrap().remove("ml");
        assert!(!render("a", &run, "b", &one).contains("Per vCluster"));
    }
}
