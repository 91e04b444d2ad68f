//! `lattice-reports` — the site-review report of an `rm-replay` run: one self-contained HTML file (charts
//! embedded as inline SVG, no network fetches) with the run configuration and trace summary, headline
//! metrics (against a baseline when given), wait percentiles per priority class, utilization and queue
//! depth over time, the wait-time CDF, tenant shares over time, the bounded-slowdown distribution and
//! group-span/conformance histograms; a baseline's curves overlay the run's on every chart.
//!
//! Text in the charts is laid out with a bundled font (DejaVu Sans, `assets/`), so a fresh machine
//! needs no system fonts. A sweep gets its own report: the Pareto front of utilization against p95
//! wait and the objective's sensitivity per weight. Still to come: polars tables and Parquet export, a
//! Gantt and event charts.

mod charts;
mod series;
mod sweep;

use lattice_sim::SimResult;
use std::fmt::Write;

pub use series::{Series, occupancy, tenant_shares, wait_cdf};
pub use sweep::{Sensitivity, SweepPoint, render_sweep_html};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("drawing chart `{chart}`: {message}")]
    Chart { chart: &'static str, message: String },
}

/// One replayed run, with the name it is shown under.
pub struct Run<'a> {
    pub name: &'a str,
    pub result: &'a SimResult,
}

/// The chart sections, in report order (their ids are the HTML `id`s).
pub const SECTIONS: [(&str, &str); 8] = [
    ("config", "Run configuration"),
    ("metrics", "Headline metrics"),
    ("classes", "Wait percentiles per priority class"),
    ("utilization", "Utilization and queue depth over time"),
    ("waits", "Wait-time CDF"),
    ("tenants", "Tenant shares over time"),
    ("bsld", "Bounded slowdown distribution"),
    ("placement", "Placement: dragonfly groups spanned and conformance"),
];

/// The report as one HTML document.
pub fn render_html(run: &Run, baseline: Option<&Run>) -> Result<String, ReportError> {
    let runs: Vec<&Run> = std::iter::once(run).chain(baseline).collect();
    let mut o = String::with_capacity(256 * 1024);
    let title = match baseline {
        Some(b) => format!("RM-Replay report: {} vs {}", run.name, b.name),
        None => format!("RM-Replay report: {}", run.name),
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>{CSS}</style></head>\n<body><h1>{t}</h1>\n",
        t = esc(&title)
    );
    // Configuration and trace summary.
    let _ = write!(
        o,
        "<section id=\"config\"><h2>Run configuration</h2><table><tr><th></th>"
    );
    for r in &runs {
        let _ = write!(o, "<th>{}</th>", esc(r.name));
    }
    o.push_str("</tr>");
    let rows: [(&str, TextOf); 6] = [
        ("trace", |r| r.summary.trace.clone()),
        ("policy", |r| r.summary.policy.clone()),
        ("nodes", |r| r.summary.nodes.to_string()),
        ("jobs replayed", |r| r.summary.jobs.to_string()),
        ("skipped lines", |r| r.summary.skipped.values().sum::<u64>().to_string()),
        ("seed", |r| r.summary.seed.to_string()),
    ];
    for (label, f) in rows {
        let _ = write!(o, "<tr><td>{label}</td>");
        for r in &runs {
            let _ = write!(o, "<td>{}</td>", esc(&f(r.result)));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table></section>\n");
    // Headline metrics.
    let _ = write!(
        o,
        "<section id=\"metrics\"><h2>Headline metrics</h2><table><tr><th>metric</th>"
    );
    for r in &runs {
        let _ = write!(o, "<th>{}</th>", esc(r.name));
    }
    if baseline.is_some() {
        o.push_str("<th>change</th>");
    }
    o.push_str("</tr>");
    let metrics: [(&str, ValueOf, bool); 9] = [
        ("utilization %", |r| r.summary.utilization * 100.0, true),
        ("mean wait (h)", |r| r.summary.mean_wait_s / 3600.0, false),
        ("p50 wait (h)", |r| r.summary.p50_wait_s / 3600.0, false),
        ("p95 wait (h)", |r| r.summary.p95_wait_s / 3600.0, false),
        ("p99 wait (h)", |r| r.summary.p99_wait_s / 3600.0, false),
        ("mean bounded slowdown", |r| r.summary.mean_bsld, false),
        ("Jain's index", |r| r.summary.jain_index, true),
        ("backfilled jobs", |r| r.summary.backfilled as f64, true),
        ("preemptions", |r| r.summary.preemptions as f64, false),
    ];
    for (label, f, higher_better) in metrics {
        let _ = write!(o, "<tr><td>{label}</td>");
        for r in &runs {
            let _ = write!(o, "<td>{:.3}</td>", f(r.result));
        }
        if let Some(b) = baseline {
            let (x, y) = (f(run.result), f(b.result));
            let (text, class) = if x == y {
                ("=".to_string(), "same")
            } else {
                let arrow = if x > y { '↑' } else { '↓' };
                let pct = if y != 0.0 {
                    format!(" {:.0}%", ((x - y) / y * 100.0).abs())
                } else {
                    String::new()
                };
                let good = (x > y) == higher_better;
                (format!("{arrow}{pct}"), if good { "better" } else { "worse" })
            };
            let _ = write!(o, "<td class=\"{class}\">{text}</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</table></section>\n");
    // Per priority class: wait percentiles of every run.
    let _ = write!(
        o,
        "<section id=\"classes\"><h2>Wait percentiles per priority class</h2><table><tr><th>class</th><th>run</th><th>jobs</th><th>p50 wait (h)</th><th>p95 wait (h)</th><th>p99 wait (h)</th><th>mean bsld</th></tr>"
    );
    let classes: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.result.summary.per_class.keys()).collect();
    for c in classes {
        for r in &runs {
            if let Some(g) = r.result.summary.per_class.get(c) {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}</td></tr>",
                    esc(c),
                    esc(r.name),
                    g.jobs,
                    g.p50_wait_s / 3600.0,
                    g.p95_wait_s / 3600.0,
                    g.p99_wait_s / 3600.0,
                    g.mean_bsld
                );
            }
        }
    }
    o.push_str("</table></section>\n");
    // Charts.
    let occ: Vec<(String, Series, Series)> = runs
        .iter()
        .map(|r| {
            let (busy, queued) = occupancy(&r.result.jobs, r.result.summary.nodes, 200);
            (r.name.to_string(), busy, queued)
        })
        .collect();
    let svg = charts::utilization(&occ)?;
    section(
        &mut o,
        "utilization",
        "Utilization and queue depth over time",
        &svg,
        "Busy nodes as a fraction of the cluster (left) and allocations waiting in the queue (right), each averaged over 200 equal intervals.",
    );
    let cdfs: Vec<(String, Series)> = runs
        .iter()
        .map(|r| (r.name.to_string(), wait_cdf(&r.result.jobs)))
        .collect();
    let svg = charts::wait_cdf(&cdfs)?;
    section(
        &mut o,
        "waits",
        "Wait-time CDF",
        &svg,
        "Fraction of started allocations that waited at most x hours.",
    );
    let shares: Vec<(String, Vec<(String, Series)>)> = runs
        .iter()
        .map(|r| (r.name.to_string(), tenant_shares(&r.result.jobs, 100, 6)))
        .collect();
    let svg = charts::tenant_shares(&shares)?;
    section(
        &mut o,
        "tenants",
        "Tenant shares over time",
        &svg,
        "Share of the busy node-time of the six tenants with the most node-hours, averaged over 100 intervals (the baseline's faded).",
    );
    let bslds: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            (
                r.name.to_string(),
                r.result.jobs.iter().filter_map(|j| j.bsld).collect(),
            )
        })
        .collect();
    let svg = charts::bsld_histogram(&bslds)?;
    section(
        &mut o,
        "bsld",
        "Bounded slowdown distribution",
        &svg,
        "Allocations per bounded-slowdown bucket (τ = 10 s), log₂ buckets.",
    );
    let spans: Vec<(String, Vec<u64>)> = runs
        .iter()
        .map(|r| {
            let g: Vec<u32> = r.result.jobs.iter().filter_map(|j| j.groups).collect();
            (r.name.to_string(), charts::span_buckets(&g))
        })
        .collect();
    let conf: Vec<(String, Vec<u64>)> = runs
        .iter()
        .map(|r| {
            let c: Vec<f64> = r.result.jobs.iter().filter_map(|j| j.conformance).collect();
            (r.name.to_string(), charts::conformance_buckets(&c))
        })
        .collect();
    let span_svg = charts::bars(
        "span",
        "dragonfly groups spanned (x + 1; the last bar is 9 or more)",
        &spans,
    )?;
    let conf_svg = charts::bars("conformance", "conformance fitness (tenths: x/10 to (x+1)/10)", &conf)?;
    let _ = writeln!(
        o,
        "<section id=\"placement\"><h2>Placement: dragonfly groups spanned and conformance</h2><figure>{span_svg}<figcaption>Allocations by the number of dragonfly groups their nodes span.</figcaption></figure><figure>{conf_svg}<figcaption>Allocations by conformance fitness (largest same-fingerprint share of their nodes).</figcaption></figure></section>"
    );
    o.push_str("</body></html>\n");
    Ok(o)
}

fn section(o: &mut String, id: &str, title: &str, svg: &str, caption: &str) {
    let _ = writeln!(
        o,
        "<section id=\"{id}\"><h2>{title}</h2><figure>{svg}<figcaption>{caption}</figcaption></figure></section>"
    );
}

/// A configuration row's text, a metric row's value.
type TextOf = fn(&SimResult) -> String;
type ValueOf = fn(&SimResult) -> f64;

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(crate) const CSS: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}\
td:first-child{text-align:left}.better{color:#11772d}.worse{color:#b3261e}figure{margin:0}\
figcaption{color:#555;font-size:0.9em}section{margin-bottom:2em}";
