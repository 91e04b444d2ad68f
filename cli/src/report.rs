//! The text summary, in the spirit of the seed's "RM-Replay Results" block.

use lattice_sim::SimResult;
use std::fmt::Write;

/// `90 s`, `12 min`, `2.1 hr`, `3.4 d`.
pub fn human_duration(secs: f64) -> String {
    if secs < 90.0 {
        format!("{secs:.0} s")
    } else if secs < 90.0 * 60.0 {
        format!("{:.0} min", secs / 60.0)
    } else if secs < 48.0 * 3600.0 {
        format!("{:.1} hr", secs / 3600.0)
    } else {
        format!("{:.1} d", secs / 86400.0)
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn render(name: &str, r: &SimResult) -> String {
    let s = &r.summary;
    let mut o = String::new();
    let _ = writeln!(o, "=== RM-Replay Results: {name} ===");
    let skipped: Vec<String> = s
        .skipped
        .iter()
        .map(|(k, v)| format!("{k} {}", thousands(*v)))
        .collect();
    let _ = writeln!(
        o,
        "Trace: {} ({} jobs replayed; {} skipped{})",
        s.trace,
        thousands(s.jobs),
        thousands(s.skipped.values().sum()),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(": {}", skipped.join(", "))
        }
    );
    let _ = writeln!(
        o,
        "Policy: {}   Nodes: {}   Seed: {}",
        s.policy,
        thousands(s.nodes as u64),
        s.seed
    );
    let _ = writeln!(o, "Utilization:");
    let available = s.nodes as f64 * s.makespan_s / 3600.0;
    let _ = writeln!(
        o,
        "  Node-hours consumed: {} / {} available ({:.1}%)",
        thousands(s.node_hours.round() as u64),
        thousands(available.round() as u64),
        s.utilization * 100.0
    );
    if s.gpu_hours > 0.0 {
        let _ = writeln!(o, "  GPU-hours consumed: {}", thousands(s.gpu_hours.round() as u64));
    }
    let _ = writeln!(o, "Wait Time:");
    let _ = writeln!(
        o,
        "  mean: {}   p50: {}   p95: {}   p99: {}   max: {}",
        human_duration(s.mean_wait_s),
        human_duration(s.p50_wait_s),
        human_duration(s.p95_wait_s),
        human_duration(s.p99_wait_s),
        human_duration(s.max_wait_s)
    );
    let _ = writeln!(o, "Bounded slowdown (tau = 10 s):");
    let _ = writeln!(o, "  mean: {:.2}   p95: {:.2}", s.mean_bsld, s.p95_bsld);
    let by_class: Vec<String> = s
        .slo_wait_compliance_by_class
        .iter()
        .rev()
        .map(|(c, v)| format!("class {c} {:.1}%", v * 100.0))
        .collect();
    let _ = writeln!(
        o,
        "SLO (wait <= class target): {:.1}% met ({})",
        s.slo_wait_compliance * 100.0,
        by_class.join(", ")
    );
    let _ = writeln!(o, "Backfill:");
    let _ = writeln!(o, "  Backfill jobs: {}", thousands(s.backfilled));
    let _ = writeln!(
        o,
        "Outcome: {} completed, {} failed ({} walltime kills), {} unfinished; makespan {}",
        thousands(s.completed),
        thousands(s.failed),
        thousands(s.walltime_kills),
        thousands(s.unfinished),
        human_duration(s.makespan_s)
    );
    if s.per_tenant.len() > 1 {
        let _ = writeln!(
            o,
            "Fairness (demand-aware, {} windows with contention of {}):",
            thousands(s.fair_share_windows),
            human_duration(s.fairness_window_s)
        );
        let _ = writeln!(
            o,
            "  Jain's index: {:.2}   max deviation: {:.1}%   mean deviation: {:.1}%",
            s.fair_share_jain,
            s.fair_share_dev_max * 100.0,
            s.fair_share_dev_mean * 100.0
        );
        let _ = writeln!(
            o,
            "  Service: slowdown Jain's index {:.2}, worst/median tenant {:.2}, p95 wait spread {}",
            s.tenant_bsld_jain,
            s.tenant_bsld_worst_to_median,
            human_duration(s.tenant_p95_wait_spread_s)
        );
        let worst = s
            .per_tenant
            .iter()
            .max_by(|a, b| a.1.mean_wait_s.total_cmp(&b.1.mean_wait_s))
            .expect("non-empty");
        let _ = writeln!(
            o,
            "Tenants: {} (longest mean wait: {} at {})",
            s.per_tenant.len(),
            worst.0,
            human_duration(worst.1.mean_wait_s)
        );
    }
    let _ = writeln!(
        o,
        "Engine: {} passes, mean {:.3} ms, p99 {:.3} ms CPU per pass",
        thousands(r.cost.passes),
        r.cost.cycle_cpu_ms_mean,
        r.cost.cycle_cpu_ms_p99
    );
    for n in &s.notes {
        let _ = writeln!(o, "Note: {n}");
    }
    o
}

/// An inventory as YAML (one entry per node), e.g. to edit an imported node list.
pub fn inventory_yaml(inv: &lattice_traces::Inventory) -> String {
    let mut o = String::from("nodes:\n");
    for n in &inv.nodes {
        let c = &n.capabilities;
        let _ = write!(
            o,
            "  - {{name: {}, cpu_cores: {}, memory_gb: {}, gpu_count: {}",
            n.name, c.cpu_cores, c.memory_gb, c.gpu_count
        );
        if let Some(t) = &c.gpu_type {
            let _ = write!(o, ", gpu_type: {t}, conformance: {t}");
        }
        let _ = writeln!(o, ", group: {}}}", n.group.0);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(human_duration(30.0), "30 s");
        assert_eq!(human_duration(720.0), "12 min");
        assert_eq!(human_duration(7560.0), "2.1 hr");
        assert_eq!(human_duration(3.0 * 86400.0), "3.0 d");
    }
}
