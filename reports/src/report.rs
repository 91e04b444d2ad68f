//! The run report ([`render_html`]): one section per entry of [`SECTIONS`], each drawn by its own
//! function from the run (and the baseline, whose figures sit beside the run's).

use crate::charts;
use crate::html::{CSS, ReportError, esc, frame_html, section};
use crate::series::{self, Series, event_counts, gantt_cells, occupancy, tenant_shares, wait_cdf};
use crate::tables;
use lattice_sim::SimResult;
use std::fmt::Write;

/// One replayed run, with the name it is shown under.
pub struct Run<'a> {
    pub name: &'a str,
    pub result: &'a SimResult,
}

/// The chart sections, in report order (their ids are the HTML `id`s).
pub const SECTIONS: [(&str, &str); 10] = [
    ("config", "Run configuration"),
    ("metrics", "Headline metrics"),
    ("classes", "Wait percentiles per priority class"),
    ("utilization", "Utilization and queue depth over time"),
    ("waits", "Wait-time CDF"),
    ("tenants", "Tenant shares: actual vs target"),
    ("gantt", "Node occupancy (Gantt)"),
    ("events", "Preemptions, checkpoints, borrowing and failures over time"),
    ("bsld", "Bounded slowdown distribution"),
    ("placement", "Placement: dragonfly groups spanned and conformance"),
];

/// The report as one HTML document.
pub fn render_html(run: &Run, baseline: Option<&Run>) -> Result<String, ReportError> {
    let runs: Vec<&Run> = std::iter::once(run).chain(baseline).collect();
    let mut o = String::with_capacity(256 * 1024);
    head(&mut o, run, baseline);
    config_section(&mut o, &runs);
    metrics_section(&mut o, run, baseline, &runs);
    let frames: Vec<polars::prelude::DataFrame> = runs
        .iter()
        .map(|r| tables::jobs_frame(r.result))
        .collect::<Result<_, _>>()?;
    classes_section(&mut o, &runs, &frames)?;
    utilization_section(&mut o, &runs)?;
    waits_section(&mut o, &runs)?;
    tenants_section(&mut o, run, &runs, &frames)?;
    gantt_section(&mut o, &runs)?;
    events_section(&mut o, &runs)?;
    bsld_section(&mut o, &runs)?;
    placement_section(&mut o, &runs)?;
    o.push_str("</body></html>\n");
    Ok(o)
}

/// The document's head and title.
fn head(o: &mut String, run: &Run, baseline: Option<&Run>) {
    let title = match baseline {
        Some(b) => format!("RM-Replay report: {} vs {}", run.name, b.name),
        None => format!("RM-Replay report: {}", run.name),
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>{CSS}</style></head>\n<body><h1>{t}</h1>\n",
        t = esc(&title)
    );
}

/// Configuration and trace summary, a column per run.
fn config_section(o: &mut String, runs: &[&Run]) {
    // Configuration and trace summary.
    let _ = write!(
        o,
        "<section id=\"config\"><h2>Run configuration</h2><table><tr><th></th>"
    );
    for r in runs {
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
        for r in runs {
            let _ = write!(o, "<td>{}</td>", esc(&f(r.result)));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table></section>\n");
}

/// Headline metrics, a column per run, and the change against the baseline.
fn metrics_section(o: &mut String, run: &Run, baseline: Option<&Run>, runs: &[&Run]) {
    // Headline metrics.
    let _ = write!(
        o,
        "<section id=\"metrics\"><h2>Headline metrics</h2><table><tr><th>metric</th>"
    );
    for r in runs {
        let _ = write!(o, "<th>{}</th>", esc(r.name));
    }
    if baseline.is_some() {
        o.push_str("<th>change</th>");
    }
    o.push_str("</tr>");
    let metrics: [(&str, ValueOf, bool); 11] = [
        ("utilization %", |r| r.summary.utilization * 100.0, true),
        ("mean wait (h)", |r| r.summary.mean_wait_s / 3600.0, false),
        ("p50 wait (h)", |r| r.summary.p50_wait_s / 3600.0, false),
        ("p95 wait (h)", |r| r.summary.p95_wait_s / 3600.0, false),
        ("p99 wait (h)", |r| r.summary.p99_wait_s / 3600.0, false),
        ("mean bounded slowdown", |r| r.summary.mean_bsld, false),
        ("fairness (demand-aware Jain)", |r| r.summary.fair_share_jain, true),
        ("fair-share deviation (max)", |r| r.summary.fair_share_dev_max, false),
        ("tenant slowdown Jain", |r| r.summary.tenant_bsld_jain, true),
        ("backfilled jobs", |r| r.summary.backfilled as f64, true),
        ("preemptions", |r| r.summary.preemptions as f64, false),
    ];
    for (label, f, higher_better) in metrics {
        let _ = write!(o, "<tr><td>{label}</td>");
        for r in runs {
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
}

/// Wait percentiles per priority class of every run (polars group-by over the jobs table).
fn classes_section(o: &mut String, runs: &[&Run], frames: &[polars::prelude::DataFrame]) -> Result<(), ReportError> {
    // Per priority class: wait percentiles of every run (polars group-by over the jobs table).
    o.push_str("<section id=\"classes\"><h2>Wait percentiles per priority class</h2>");
    for (r, jobs) in runs.iter().zip(frames) {
        let _ = write!(o, "<h3>{}</h3>", esc(r.name));
        o.push_str(&frame_html(&tables::class_table(jobs)?)?);
    }
    o.push_str("</section>\n");
    Ok(())
}

/// Utilization and queue depth over time.
fn utilization_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
    // Charts.
    let occ: Vec<(String, Series, Series)> = runs
        .iter()
        .map(|r| {
            let (busy, queued) = occupancy(&r.result.jobs, &r.result.timeline.runs, r.result.summary.nodes, 200);
            (r.name.to_string(), busy, queued)
        })
        .collect();
    let svg = charts::utilization(&occ)?;
    section(
        o,
        "utilization",
        "Utilization and queue depth over time",
        &svg,
        "Busy nodes as a fraction of the cluster (left) and allocations waiting in the queue (right), each averaged over 200 equal intervals.",
    );
    Ok(())
}

/// The wait-time CDF.
fn waits_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
    let cdfs: Vec<(String, Series)> = runs
        .iter()
        .map(|r| (r.name.to_string(), wait_cdf(&r.result.jobs)))
        .collect();
    let svg = charts::wait_cdf(&cdfs)?;
    section(
        o,
        "waits",
        "Wait-time CDF",
        &svg,
        "Fraction of started allocations that waited at most x hours.",
    );
    Ok(())
}

/// Tenant shares against their targets, the fairness figures and the per-tenant table.
fn tenants_section(
    o: &mut String,
    run: &Run,
    runs: &[&Run],
    frames: &[polars::prelude::DataFrame],
) -> Result<(), ReportError> {
    let shares: Vec<(String, Vec<(String, Series)>)> = runs
        .iter()
        .map(|r| {
            (
                r.name.to_string(),
                tenant_shares(&r.result.jobs, &r.result.timeline.runs, 100, 6),
            )
        })
        .collect();
    let svg = charts::tenant_shares(&shares, &run.result.tenant_targets)?;
    let _ = write!(
        o,
        "<section id=\"tenants\"><h2>Tenant shares: actual vs target</h2><figure>{svg}<figcaption>Share of the busy node-time of the six tenants with the most node-hours, averaged over 100 intervals (the baseline's faded); dashed: each tenant's target share (configured, or an equal split of the rest).</figcaption></figure>"
    );
    // The fairness figures, with their definitions one click away.
    o.push_str("<h3>Fairness</h3><table><tr><th>metric</th>");
    for r in runs {
        let _ = write!(o, "<th>{}</th>", esc(r.name));
    }
    o.push_str("</tr>");
    let fairness: [(&str, ValueOf); 10] = [
        ("windows with contention", |r| r.summary.fair_share_windows as f64),
        ("demand-aware Jain's index", |r| r.summary.fair_share_jain),
        ("max deviation from fair share", |r| r.summary.fair_share_dev_max),
        ("mean deviation from fair share", |r| r.summary.fair_share_dev_mean),
        ("tenant slowdown Jain's index", |r| r.summary.tenant_bsld_jain),
        ("worst / median tenant slowdown", |r| {
            r.summary.tenant_bsld_worst_to_median
        }),
        ("p95 wait spread (h)", |r| r.summary.tenant_p95_wait_spread_s / 3600.0),
        ("SLO compliance (wait <= class target)", |r| {
            r.summary.slo_wait_compliance
        }),
        ("whole-run Jain's index", |r| r.summary.jain_index),
        ("whole-run max share deviation", |r| r.summary.max_share_deviation),
    ];
    for (label, f) in fairness {
        let _ = write!(o, "<tr><td>{label}</td>");
        for r in runs {
            let _ = write!(o, "<td>{:.3}</td>", f(r.result));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    o.push_str(FAIRNESS_DEFINITIONS);
    for (r, jobs) in runs.iter().zip(frames) {
        let _ = write!(o, "<h3>{}: whole run</h3>", esc(r.name));
        o.push_str(&frame_html(
            &tables::tenant_table(jobs, &r.result.tenant_targets)?.head(Some(12)),
        )?);
    }
    o.push_str("</section>\n");
    Ok(())
}

/// Node occupancy: node blocks × intervals, one heat map per run.
fn gantt_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
    // Gantt: node blocks × intervals, one heat map per run.
    o.push_str("<section id=\"gantt\"><h2>Node occupancy (Gantt)</h2>");
    for (i, r) in runs.iter().enumerate() {
        let nodes = r.result.summary.nodes;
        let (t0, t1) = series::time_span(&r.result.jobs).unwrap_or((0.0, 1.0));
        let rows = (nodes as usize).min(GANTT_ROWS);
        let cells = gantt_cells(&r.result.timeline, nodes, t0, t1, rows, GANTT_BINS);
        let svg = charts::gantt("gantt", i, &cells, nodes, (t1 - t0) / 3600.0)?;
        let per_row = (nodes as usize).div_ceil(rows.max(1));
        let _ = write!(
            o,
            "<figure>{svg}<figcaption>{}: busy fraction of each block of {} node{} in each of {GANTT_BINS} intervals (darker = busier; {} runs on nodes).</figcaption></figure>",
            esc(r.name),
            if per_row > 1 {
                format!("≈{per_row}")
            } else {
                "1".into()
            },
            if per_row > 1 { "s" } else { "" },
            r.result.timeline.runs.len()
        );
    }
    o.push_str("</section>\n");
    Ok(())
}

/// Preemptions, checkpoints, borrowing and failures over time.
fn events_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
    // Point events over time.
    let events: Vec<(String, Vec<(&'static str, Series)>)> = runs
        .iter()
        .map(|r| {
            let (t0, t1) = series::time_span(&r.result.jobs).unwrap_or((0.0, 1.0));
            (r.name.to_string(), event_counts(&r.result.timeline, t0, t1, 100))
        })
        .collect();
    let svg = charts::events(&events)?;
    let totals: Vec<String> = runs
        .iter()
        .map(|r| {
            let s = &r.result.summary;
            format!(
                "{}: {} preemptions, checkpoint success {:.0}% ({} broker and {} preemption checkpoints kept), \
                 {:.1} borrowed node-hours, {} node failures ({:.1} node-hours of work lost since the last checkpoint)",
                esc(r.name),
                s.preemptions,
                s.checkpoint_success_rate * 100.0,
                s.broker_checkpoints,
                s.preemption_checkpoints,
                s.borrowed_node_hours,
                s.node_failures,
                s.lost_node_hours
            )
        })
        .collect();
    section(
        o,
        "events",
        "Preemptions, checkpoints, borrowing and failures over time",
        &svg,
        &format!(
            "Events per interval (100 intervals; the baseline's faded). {}.",
            totals.join("; ")
        ),
    );
    Ok(())
}

/// The bounded-slowdown distribution.
fn bsld_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
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
        o,
        "bsld",
        "Bounded slowdown distribution",
        &svg,
        "Allocations per bounded-slowdown bucket (τ = 10 s), log₂ buckets.",
    );
    Ok(())
}

/// Dragonfly groups spanned and conformance fitness.
fn placement_section(o: &mut String, runs: &[&Run]) -> Result<(), ReportError> {
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
    Ok(())
}

/// Rows and intervals of the Gantt heat map.
const GANTT_ROWS: usize = 48;
const GANTT_BINS: usize = 120;

/// What the fairness figures mean (docs/rm-replay.md, "Fairness"), folded under the table.
const FAIRNESS_DEFINITIONS: &str = "<details><summary>How these are defined</summary><p><b>Demand-aware fairness.</b> In each window (24 h) where work waited and at least two tenants wanted the machine, the node-time it delivered is divided among the tenants with demand (what they ran plus what waited) by max-min with their targets: each gets its target share but never more than its demand, and what a capped tenant leaves goes to the others by target. The <i>deviation</i> of a tenant is |delivered &minus; fair| / delivered total; <i>Jain's index</i> is over delivered / fair. Windows are averaged weighted by the node-time that waited in them. 1 and 0 are perfectly fair.</p><p><b>Service fairness.</b> Jain's index of the tenants' mean bounded slowdowns; the worst tenant's mean slowdown over the median tenant's; the worst tenant's p95 wait minus the median's.</p><p><b>SLO compliance.</b> The fraction of allocations whose wait was at most their class's target (`--slo-wait`, else 1 h); one that never started counts by how long it had waited at the end.</p><p><b>Whole run.</b> Each tenant's share of all node-hours against its target: fixed by the trace when every job eventually runs, so it does not move with the weights.</p></details>";
/// A configuration row's text, a metric row's value.
type TextOf = fn(&SimResult) -> String;
type ValueOf = fn(&SimResult) -> f64;
