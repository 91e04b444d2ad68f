//! Prometheus `/metrics` in the text exposition format, with the seed's metric names.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Histogram bucket upper bounds, seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// A gauge: name, help, and values with their label set (`{state="ready"}`, or empty).
pub type Gauge<'a> = (&'a str, &'a str, Vec<(String, f64)>);

#[derive(Default)]
pub struct Metrics {
    cycles: Mutex<Histogram>,
    commits: Mutex<Histogram>,
    pub started: AtomicU64,
    pub rejected: AtomicU64,
    pub submitted: AtomicU64,
    pub fabric_errors: AtomicU64,
    pub staging_failures: AtomicU64,
}

impl Metrics {
    pub fn cycle(&self, d: std::time::Duration) {
        self.cycles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(d.as_secs_f64());
    }

    pub fn commit(&self, d: std::time::Duration) {
        self.commits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(d.as_secs_f64());
    }

    /// The exposition text with the given gauges.
    pub fn render(&self, gauges: &[Gauge]) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        self.cycles.lock().unwrap_or_else(|p| p.into_inner()).render(
            "lattice_scheduling_cycle_duration_seconds",
            "Wall time of one scheduling pass.",
            &mut out,
        );
        self.commits.lock().unwrap_or_else(|p| p.into_inner()).render(
            "lattice_raft_commit_latency_seconds",
            "Time from proposing an ownership change to its commit.",
            &mut out,
        );
        for (name, help, value) in [
            (
                "lattice_allocations_submitted_total",
                "Allocations accepted by the API.",
                &self.submitted,
            ),
            (
                "lattice_allocations_started_total",
                "Allocations whose nodes the quorum committed.",
                &self.started,
            ),
            (
                "lattice_quorum_rejections_total",
                "Proposals the quorum rejected.",
                &self.rejected,
            ),
            (
                "lattice_fabric_errors_total",
                "Fabric manager calls that failed after their retries (the allocation was retried).",
                &self.fabric_errors,
            ),
            (
                "lattice_staging_failures_total",
                "VAST prefetches that failed (the staging restarts, up to 3 retries).",
                &self.staging_failures,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
        for (name, help, values) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, v) in values {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.cycle(std::time::Duration::from_millis(3));
        m.cycle(std::time::Duration::from_millis(30));
        let text = m.render(&[("lattice_nodes", "Nodes.", vec![("{state=\"ready\"}".into(), 4.0)])]);
        assert!(text.contains("lattice_scheduling_cycle_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("lattice_scheduling_cycle_duration_seconds_bucket{le=\"0.05\"} 2"));
        assert!(text.contains("lattice_scheduling_cycle_duration_seconds_count 2"));
        assert!(text.contains("lattice_nodes{state=\"ready\"} 4"));
    }
}
