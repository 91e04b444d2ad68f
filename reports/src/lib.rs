//! `lattice-reports` — the site-review report of an `rm-replay` run: one self-contained HTML file (charts
//! embedded as inline SVG, no network fetches) with the run configuration and trace summary, headline
//! metrics (against a baseline when given), wait percentiles per priority class, utilization and queue
//! depth over time, the wait-time CDF, tenant shares over time against their targets, a Gantt of node
//! occupancy (aggregated into node blocks × intervals), preemption/checkpoint/borrowing/failure events
//! over time, the bounded-slowdown distribution and group-span/conformance histograms; a baseline's
//! curves overlay the run's on every chart.
//!
//! The per-allocation and per-interval tables, and the per-class and per-tenant aggregations the report
//! shows, are polars DataFrames ([`tables`]), exported as Parquet/CSV by [`tables::write_tables`].
//! Text in the charts is laid out with a bundled font (DejaVu Sans, `assets/`), so a fresh machine
//! needs no system fonts. A sweep gets its own report: the Pareto front of utilization against p95
//! wait and the objective's sensitivity per weight.

mod charts;
mod html;
mod report;
mod series;
mod sweep;
pub mod tables;

pub use html::ReportError;
pub use report::{Run, SECTIONS, render_html};
pub use series::{Series, event_counts, gantt_cells, occupancy, tenant_shares, wait_cdf};
pub use sweep::{Sensitivity, SweepPoint, render_sweep_html};
