//! The sweep report: the Pareto front of utilization against p95 wait over every run, and the
//! objective's sensitivity to each varied weight.

use crate::charts;
pub use crate::charts::{Sensitivity, SweepPoint};
use crate::html::{CSS, ReportError, esc};
use std::fmt::Write;

/// The sweep report as one HTML document.
pub fn render_sweep_html(
    title: &str,
    metric: &str,
    points: &[SweepPoint],
    sensitivity: &Sensitivity,
) -> Result<String, ReportError> {
    let mut o = String::new();
    let t = esc(title);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>{}</style></head>\n<body><h1>{t}</h1>\n",
        CSS
    );
    let svg = charts::pareto(points)?;
    let _ = writeln!(
        o,
        "<section id=\"pareto\"><h2>Utilization against p95 wait</h2><figure>{svg}<figcaption>Every run; the Pareto front (no run has both higher utilization and lower p95 wait) in orange, the best run under the objective ringed.</figcaption></figure></section>"
    );
    let svg = charts::sensitivity(metric, sensitivity)?;
    let _ = writeln!(
        o,
        "<section id=\"sensitivity\"><h2>Sensitivity of {}</h2><figure>{svg}<figcaption>Mean {} over the runs at each value of a varied weight.</figcaption></figure></section>",
        esc(metric),
        esc(metric)
    );
    o.push_str("<section id=\"runs\"><h2>Pareto-optimal runs</h2><table><tr><th>run</th><th>weights</th><th>utilization %</th><th>p95 wait (h)</th></tr>");
    for p in points.iter().filter(|p| p.pareto) {
        let _ = write!(
            o,
            "<tr><td>{}{}</td><td>{}</td><td>{:.2}</td><td>{:.3}</td></tr>",
            p.run,
            if p.best { " (best)" } else { "" },
            esc(&p.label),
            p.utilization * 100.0,
            p.p95_wait_h
        );
    }
    o.push_str("</table></section>\n</body></html>\n");
    Ok(o)
}
