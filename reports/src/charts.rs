//! The charts, drawn with plotters into SVG strings. The first run is drawn in blue, a baseline in
//! orange (dashed where it shares an axis with the run's second series).

use crate::html::ReportError;
use crate::series::Series;
use plotters::prelude::*;
use std::sync::Once;

/// One run of a sweep, as the report shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPoint {
    pub run: usize,
    pub utilization: f64,
    pub p95_wait_h: f64,
    pub pareto: bool,
    pub best: bool,
    /// `name=value` of the varied weights.
    pub label: String,
}

/// The sensitivity rows: weight, value, mean objective metric, runs.
pub type Sensitivity<'a> = [(&'a str, f64, f64, usize)];

const W: u32 = 900;
const H: u32 = 380;
const COLORS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];

/// Registers the bundled font for plotters' `sans-serif` (once per process).
fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        // The font is bundled and valid; a failure here would be a build defect, so it is ignored
        // (plotters then reports every text draw as an error, which `chart` turns into a clear one).
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

fn err<E: std::fmt::Debug>(chart: &'static str) -> impl Fn(E) -> ReportError {
    move |e| ReportError::Chart {
        chart,
        message: format!("{e:?}"),
    }
}

/// The series legend, in the report's style.
fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .position(at)
        .draw()
}

fn max_x(series: &[&Series]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-6)
}

/// Utilization (left axis, 0-1) and queue depth (right axis) against hours.
pub fn utilization(runs: &[(String, Series, Series)]) -> Result<String, ReportError> {
    fonts();
    let e = err("utilization");
    let xs: Vec<&Series> = runs.iter().map(|r| &r.1).collect();
    let x_max = max_x(&xs);
    let q_max = runs.iter().flat_map(|r| r.2.iter().map(|p| p.1)).fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .right_y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..1.05f64)
            .map_err(&e)?
            .set_secondary_coord(0f64..x_max, 0f64..q_max * 1.05);
        chart
            .configure_mesh()
            .x_desc("hours since first submission")
            .y_desc("utilization")
            .draw()
            .map_err(&e)?;
        chart
            .configure_secondary_axes()
            .y_desc("queued allocations")
            .draw()
            .map_err(&e)?;
        for (i, (name, busy, queued)) in runs.iter().enumerate() {
            let c = COLORS[i % 2];
            chart
                .draw_series(LineSeries::new(busy.iter().copied(), c.stroke_width(2)))
                .map_err(&e)?
                .label(format!("{name}: utilization"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
            chart
                .draw_secondary_series(LineSeries::new(queued.iter().copied(), c.mix(0.45).stroke_width(1)))
                .map_err(&e)?
                .label(format!("{name}: queue depth"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.mix(0.45)));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// Empirical CDFs of the wait time.
pub fn wait_cdf(runs: &[(String, Series)]) -> Result<String, ReportError> {
    fonts();
    let e = err("waits");
    let xs: Vec<&Series> = runs.iter().map(|r| &r.1).collect();
    let x_max = max_x(&xs);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..1.0f64)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("wait (hours)")
            .y_desc("fraction of allocations")
            .draw()
            .map_err(&e)?;
        for (i, (name, cdf)) in runs.iter().enumerate() {
            let c = COLORS[i % 2];
            chart
                .draw_series(LineSeries::new(cdf.iter().copied(), c.stroke_width(2)))
                .map_err(&e)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Each top tenant's share of the busy node-time over time; the run's lines solid, the baseline's
/// (same tenant, same colour) faded.
/// Each tenant's target share (of the first run) is a dashed line in the tenant's colour.
pub fn tenant_shares(
    runs: &[(String, Vec<(String, Series)>)],
    targets: &std::collections::BTreeMap<String, f64>,
) -> Result<String, ReportError> {
    fonts();
    let e = err("tenants");
    let xs: Vec<&Series> = runs.iter().flat_map(|r| r.1.iter().map(|t| &t.1)).collect();
    let x_max = max_x(&xs);
    // Colours follow the first run's tenant order.
    let order: Vec<&str> = runs
        .first()
        .map(|r| r.1.iter().map(|t| t.0.as_str()).collect())
        .unwrap_or_default();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..1.0f64)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("hours since first submission")
            .y_desc("share of busy node-time")
            .draw()
            .map_err(&e)?;
        for (i, (run, tenants)) in runs.iter().enumerate() {
            for (tenant, series) in tenants {
                let k = order.iter().position(|t| t == tenant).unwrap_or(order.len());
                let c = PALETTE[k % PALETTE.len()];
                let style = if i == 0 {
                    c.stroke_width(2)
                } else {
                    c.mix(0.35).stroke_width(1)
                };
                let s = chart
                    .draw_series(LineSeries::new(series.iter().copied(), style))
                    .map_err(&e)?;
                if i == 0 || runs.len() == 1 {
                    s.label(format!("{tenant} ({run})"))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
                }
                if i == 0
                    && let Some(&t) = targets.get(tenant)
                {
                    chart
                        .draw_series(DashedLineSeries::new([(0.0, t), (x_max, t)], 6, 4, c.stroke_width(1)))
                        .map_err(&e)?;
                }
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// Node occupancy as a heat map (a Gantt aggregated to `cells.len()` blocks of nodes × intervals): the
/// darker a cell, the busier its nodes; `hours` is the time axis length. Runs of cells of the same
/// shade in a row are drawn as one rectangle, which keeps the SVG small for long traces.
pub fn gantt(
    chart: &'static str,
    run: usize,
    cells: &[Vec<f64>],
    nodes: u32,
    hours: f64,
) -> Result<String, ReportError> {
    fonts();
    let e = err(chart);
    let rows = cells.len().max(1);
    let bins = cells.first().map_or(1, |r| r.len()).max(1);
    let width = hours.max(1e-6) / bins as f64;
    let first = |r: usize| (r as u64 * nodes as u64 / rows as u64) as f64;
    let base = COLORS[run % 2];
    let shade = |level: u8| {
        let f = level as f64 / 10.0;
        let mix = |c: u8| (255.0 - (255.0 - c as f64) * f).round() as u8;
        RGBColor(mix(base.0), mix(base.1), mix(base.2))
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..hours.max(1e-6), 0f64..nodes.max(1) as f64)
            .map_err(&e)?;
        c.configure_mesh()
            .x_desc("hours since first submission")
            .y_desc("node")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .disable_mesh()
            .draw()
            .map_err(&e)?;
        let mut rects = Vec::new();
        for (r, row) in cells.iter().enumerate() {
            let (y0, y1) = (first(r), if r + 1 < rows { first(r + 1) } else { nodes as f64 });
            let mut b = 0;
            while b < row.len() {
                let level = (row[b].clamp(0.0, 1.0) * 10.0).round() as u8;
                let mut end = b + 1;
                while end < row.len() && (row[end].clamp(0.0, 1.0) * 10.0).round() as u8 == level {
                    end += 1;
                }
                if level > 0 {
                    rects.push(Rectangle::new(
                        [(b as f64 * width, y0), (end as f64 * width, y1)],
                        shade(level).filled(),
                    ));
                }
                b = end;
            }
        }
        c.draw_series(rects).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// Point events per interval, one line per kind; the baseline's lines faded.
pub fn events(runs: &[(String, Vec<(&'static str, Series)>)]) -> Result<String, ReportError> {
    fonts();
    let e = err("events");
    let xs: Vec<&Series> = runs.iter().flat_map(|r| r.1.iter().map(|k| &k.1)).collect();
    let x_max = max_x(&xs);
    let y_max = xs.iter().flat_map(|s| s.iter().map(|p| p.1)).fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max * 1.1)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("hours since first submission")
            .y_desc("events per interval")
            .draw()
            .map_err(&e)?;
        for (i, (run, kinds)) in runs.iter().enumerate() {
            for (k, (kind, series)) in kinds.iter().enumerate() {
                let c = PALETTE[k % PALETTE.len()];
                let style = if i == 0 {
                    c.stroke_width(2)
                } else {
                    c.mix(0.35).stroke_width(1)
                };
                chart
                    .draw_series(LineSeries::new(series.iter().copied(), style))
                    .map_err(&e)?
                    .label(format!("{kind} ({run})"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// Every sweep run as a point (utilization %, p95 wait h); the Pareto front orange, the best ringed.
pub fn pareto(points: &[SweepPoint]) -> Result<String, ReportError> {
    fonts();
    let e = err("pareto");
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
    for p in points {
        x0 = x0.min(p.utilization * 100.0);
        x1 = x1.max(p.utilization * 100.0);
        y0 = y0.min(p.p95_wait_h);
        y1 = y1.max(p.p95_wait_h);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (px, py) = (((x1 - x0) * 0.1).max(0.05), ((y1 - y0) * 0.1).max(0.01));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d((x0 - px)..(x1 + px), (y0 - py).max(0.0)..(y1 + py))
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("utilization %")
            .y_desc("p95 wait (hours)")
            .draw()
            .map_err(&e)?;
        chart
            .draw_series(points.iter().map(|p| {
                let c = if p.pareto { COLORS[1] } else { COLORS[0] };
                Circle::new((p.utilization * 100.0, p.p95_wait_h), 4, c.filled())
            }))
            .map_err(&e)?;
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| p.best)
                    .map(|p| Circle::new((p.utilization * 100.0, p.p95_wait_h), 9, BLACK.stroke_width(2))),
            )
            .map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// The mean objective metric against each varied weight's value, one line per weight.
pub fn sensitivity(metric: &str, rows: &Sensitivity) -> Result<String, ReportError> {
    fonts();
    let e = err("sensitivity");
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.0) {
            names.push(r.0);
        }
    }
    let x1 = rows.iter().map(|r| r.1).fold(0.0, f64::max).max(1e-3);
    let (y0, y1) = rows
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(r.2), b.max(r.2)));
    let (y0, y1) = if y0.is_finite() { (y0, y1) } else { (0.0, 1.0) };
    let pad = ((y1 - y0) * 0.1).max(y1.abs() * 0.01).max(1e-3);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x1 * 1.05, (y0 - pad)..(y1 + pad))
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("weight value")
            .y_desc(format!("mean {metric}"))
            .draw()
            .map_err(&e)?;
        for (k, name) in names.iter().enumerate() {
            let c = PALETTE[k % PALETTE.len()];
            let pts: Vec<(f64, f64)> = rows.iter().filter(|r| r.0 == *name).map(|r| (r.1, r.2)).collect();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(&e)?
                .label(name.to_string())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(&e)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

/// Bounded slowdowns in log₂ buckets: bucket k holds [2^k, 2^(k+1)), k = 0..=15 (the last is open).
pub fn bsld_buckets(values: &[f64]) -> [u64; 16] {
    let mut b = [0u64; 16];
    for &v in values {
        let k = if v < 1.0 {
            0
        } else {
            (v.log2().floor() as usize).min(15)
        };
        b[k] += 1;
    }
    b
}

/// Histogram of bounded slowdowns, one bar per run side by side in each bucket.
pub fn bsld_histogram(runs: &[(String, Vec<f64>)]) -> Result<String, ReportError> {
    let counts: Vec<(String, Vec<u64>)> = runs
        .iter()
        .map(|r| (r.0.clone(), bsld_buckets(&r.1).to_vec()))
        .collect();
    bars("bsld", "bounded slowdown (log2 bucket: 2^x to 2^(x+1))", &counts)
}

/// Dragonfly groups spanned per allocation: buckets 1..=8 and 9+ (x = groups − 1).
pub fn span_buckets(groups: &[u32]) -> Vec<u64> {
    let mut b = vec![0u64; 9];
    for &g in groups {
        b[(g.max(1) as usize - 1).min(8)] += 1;
    }
    b
}

/// Conformance fitness in tenths: bucket k holds [k/10, (k+1)/10), 1.0 in the last.
pub fn conformance_buckets(values: &[f64]) -> Vec<u64> {
    let mut b = vec![0u64; 10];
    for &v in values {
        b[((v.clamp(0.0, 1.0) * 10.0).floor() as usize).min(9)] += 1;
    }
    b
}

/// Bars per bucket (x = bucket index), one bar per run side by side.
pub fn bars(chart: &'static str, x_desc: &str, runs: &[(String, Vec<u64>)]) -> Result<String, ReportError> {
    fonts();
    let e = err(chart);
    let n_buckets = runs.iter().map(|r| r.1.len()).max().unwrap_or(1).max(1);
    let y_max = runs.iter().flat_map(|r| r.1.iter().copied()).max().unwrap_or(1).max(1);
    let n = runs.len().max(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n_buckets as f64, 0u64..y_max + y_max / 20 + 1)
            .map_err(&e)?;
        c.configure_mesh()
            .x_desc(x_desc)
            .y_desc("allocations")
            .disable_x_mesh()
            .draw()
            .map_err(&e)?;
        for (i, (name, b)) in runs.iter().enumerate() {
            let col = COLORS[i % 2];
            let off = i as f64 / n;
            c.draw_series(b.iter().enumerate().filter(|(_, v)| **v > 0).map(|(k, v)| {
                let x0 = k as f64 + 0.05 + off * 0.9;
                Rectangle::new([(x0, 0), (x0 + 0.9 / n, *v)], col.filled())
            }))
            .map_err(&e)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
        }
        legend(&mut c, SeriesLabelPosition::UpperMiddle).map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        let b = bsld_buckets(&[1.0, 1.9, 2.0, 3.9, 4.0, 1e9]);
        assert_eq!(&b[..3], &[2, 2, 1]);
        assert_eq!(b[15], 1);
    }

    #[test]
    fn span_and_conformance_buckets() {
        assert_eq!(span_buckets(&[1, 1, 2, 9, 40]), vec![2, 1, 0, 0, 0, 0, 0, 0, 2]);
        let c = conformance_buckets(&[0.0, 0.55, 1.0, 0.99]);
        assert_eq!((c[0], c[5], c[9]), (1, 1, 2));
    }

    #[test]
    fn charts_have_text_and_data() {
        let s: Series = (0..50).map(|i| (i as f64, (i as f64 / 50.0))).collect();
        let svg = wait_cdf(&[("a".into(), s.clone()), ("b".into(), s)]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("wait (hours)"));
        assert!(svg.matches("<polyline").count() >= 2, "{}", &svg[..500.min(svg.len())]);
    }
}
