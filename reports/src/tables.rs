//! The run's tables as polars DataFrames: one row per allocation (`jobs`), one row per time interval
//! (`intervals`: utilization, queue depth, point events) and per tenant per interval
//! (`tenant_intervals`: actual vs target share); the aggregations the report shows (per priority class,
//! per tenant) are polars group-bys over `jobs`, and [`write_tables`] exports all of them as Parquet and
//! CSV for notebooks and spreadsheets.
//!
//! Percentiles use polars' `Equiprobable` method, which is DESIGN.md §3's nearest rank (the
//! `ceil(p·n)`-th smallest), so the tables agree with `summary.json` exactly.

use crate::series::{EVENT_KINDS, event_counts, occupancy, tenant_shares, time_span};
use lattice_sim::SimResult;
use polars::prelude::*;
use std::path::{Path, PathBuf};

/// Intervals of the per-interval tables (and the report's time charts).
pub const INTERVALS: usize = 200;

/// One row per replayed allocation (the columns of `jobs.csv` and the placement facts), plus
/// `node_hours` of its run (null when it never ended).
pub fn jobs_frame(r: &SimResult) -> PolarsResult<DataFrame> {
    let j = &r.jobs;
    let s = |f: fn(&lattice_sim::JobRecord) -> &str| j.iter().map(f).collect::<Vec<&str>>();
    let node_hours: Vec<Option<f64>> = j.iter().map(|x| Some(x.nodes as f64 * x.run_s? / 3600.0)).collect();
    DataFrame::new_infer_height(vec![
        Column::new("id".into(), s(|x| &x.id)),
        Column::new("tenant".into(), s(|x| &x.tenant)),
        Column::new("vcluster".into(), s(|x| &x.vcluster)),
        Column::new("class".into(), j.iter().map(|x| x.class as u32).collect::<Vec<_>>()),
        Column::new("state".into(), s(|x| x.state)),
        Column::new("reason".into(), s(|x| x.reason)),
        Column::new("submit_s".into(), j.iter().map(|x| x.submit_s).collect::<Vec<_>>()),
        Column::new("start_s".into(), j.iter().map(|x| x.start_s).collect::<Vec<_>>()),
        Column::new("end_s".into(), j.iter().map(|x| x.end_s).collect::<Vec<_>>()),
        Column::new("nodes".into(), j.iter().map(|x| x.nodes).collect::<Vec<_>>()),
        Column::new("gpus".into(), j.iter().map(|x| x.gpus).collect::<Vec<_>>()),
        Column::new("wait_s".into(), j.iter().map(|x| x.wait_s).collect::<Vec<_>>()),
        Column::new("bsld".into(), j.iter().map(|x| x.bsld).collect::<Vec<_>>()),
        Column::new("backfilled".into(), j.iter().map(|x| x.backfilled).collect::<Vec<_>>()),
        Column::new("groups".into(), j.iter().map(|x| x.groups).collect::<Vec<_>>()),
        Column::new(
            "conformance".into(),
            j.iter().map(|x| x.conformance).collect::<Vec<_>>(),
        ),
        Column::new("preempted".into(), j.iter().map(|x| x.preempted).collect::<Vec<_>>()),
        Column::new("borrowed".into(), j.iter().map(|x| x.borrowed).collect::<Vec<_>>()),
        Column::new("node_hours".into(), node_hours),
    ])
}

/// Columns of [`intervals_frame`] after the time bounds, utilization and queue depth: one count of
/// point events per kind.
fn event_column(kind: &str) -> String {
    kind.replace(' ', "_")
}

/// One row per interval (`bins` equal intervals from the first submission to the last end): its bounds
/// in hours, mean utilization and queue depth, and the point events in it by kind.
pub fn intervals_frame(r: &SimResult, bins: usize) -> PolarsResult<DataFrame> {
    let Some((t0, t1)) = time_span(&r.jobs) else {
        return DataFrame::new_infer_height(vec![
            Column::new("interval".into(), Vec::<u32>::new()),
            Column::new("start_h".into(), Vec::<f64>::new()),
            Column::new("end_h".into(), Vec::<f64>::new()),
        ]);
    };
    let (busy, queue) = occupancy(&r.jobs, &r.timeline.runs, r.summary.nodes, bins);
    let width_h = (t1 - t0) / bins as f64 / 3600.0;
    let mut cols = vec![
        Column::new("interval".into(), (0..bins as u32).collect::<Vec<_>>()),
        Column::new(
            "start_h".into(),
            (0..bins).map(|k| k as f64 * width_h).collect::<Vec<_>>(),
        ),
        Column::new(
            "end_h".into(),
            (0..bins).map(|k| (k + 1) as f64 * width_h).collect::<Vec<_>>(),
        ),
        Column::new("utilization".into(), busy.iter().map(|p| p.1).collect::<Vec<_>>()),
        Column::new("queue_depth".into(), queue.iter().map(|p| p.1).collect::<Vec<_>>()),
    ];
    for (kind, series) in event_counts(&r.timeline, t0, t1, bins) {
        cols.push(Column::new(
            event_column(kind).into(),
            series.iter().map(|p| p.1 as u32).collect::<Vec<_>>(),
        ));
    }
    DataFrame::new_infer_height(cols)
}

/// One row per (interval, tenant) for the `top` tenants with the most node-hours: the tenant's share
/// of the interval's busy node-time and its target share.
pub fn tenant_intervals_frame(r: &SimResult, bins: usize, top: usize) -> PolarsResult<DataFrame> {
    let (mut interval, mut tenant, mut share, mut target) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (t, series) in tenant_shares(&r.jobs, &r.timeline.runs, bins, top) {
        for (k, p) in series.iter().enumerate() {
            interval.push(k as u32);
            tenant.push(t.clone());
            share.push(p.1);
            target.push(r.tenant_targets.get(&t).copied());
        }
    }
    DataFrame::new_infer_height(vec![
        Column::new("interval".into(), interval),
        Column::new("tenant".into(), tenant),
        Column::new("share".into(), share),
        Column::new("target".into(), target),
    ])
}

fn pct(column: &str, p: f64) -> Expr {
    col(column).quantile(lit(p), QuantileMethod::Equiprobable)
}

/// Per preemption class: allocations, started, wait percentiles (hours) and mean bounded slowdown.
pub fn class_table(jobs: &DataFrame) -> PolarsResult<DataFrame> {
    jobs.clone()
        .lazy()
        .group_by([col("class")])
        .agg([
            len().alias("jobs"),
            col("wait_s").count().alias("started"),
            (pct("wait_s", 0.50) / lit(3600.0)).alias("p50_wait_h"),
            (pct("wait_s", 0.95) / lit(3600.0)).alias("p95_wait_h"),
            (pct("wait_s", 0.99) / lit(3600.0)).alias("p99_wait_h"),
            col("bsld").mean().alias("mean_bsld"),
        ])
        .sort(["class"], SortMultipleOptions::default())
        .collect()
}

/// Per tenant: allocations, node-hours, actual share of all node-hours against its target (and the
/// difference), mean and p95 wait (hours); the heaviest users first.
pub fn tenant_table(jobs: &DataFrame, targets: &std::collections::BTreeMap<String, f64>) -> PolarsResult<DataFrame> {
    let per = jobs
        .clone()
        .lazy()
        .group_by([col("tenant")])
        .agg([
            len().alias("jobs"),
            col("node_hours").sum().alias("node_hours"),
            (col("wait_s").mean() / lit(3600.0)).alias("mean_wait_h"),
            (pct("wait_s", 0.95) / lit(3600.0)).alias("p95_wait_h"),
        ])
        .collect()?;
    let tenant = per.column("tenant")?.str()?;
    let names: Vec<String> = (0..tenant.len())
        .map(|i| tenant.get(i).unwrap_or_default().to_string())
        .collect();
    let target: Vec<Option<f64>> = names.iter().map(|t| targets.get(t).copied()).collect();
    let total = lit(per
        .column("node_hours")?
        .f64()?
        .sum()
        .unwrap_or(0.0)
        .max(f64::MIN_POSITIVE));
    per.lazy()
        .with_columns([lit(Series::new("target".into(), target)).alias("target")])
        .with_columns([(col("node_hours") / total).alias("share")])
        .with_columns([(col("share") - col("target")).alias("share_minus_target")])
        .select([
            col("tenant"),
            col("jobs"),
            col("node_hours"),
            col("share"),
            col("target"),
            col("share_minus_target"),
            col("mean_wait_h"),
            col("p95_wait_h"),
        ])
        .sort_by_exprs(
            [col("node_hours"), col("tenant")],
            SortMultipleOptions::default().with_order_descending_multi([true, false]),
        )
        .collect()
}

/// Writes `jobs.parquet`, `intervals.parquet` + `.csv`, `tenant_intervals.parquet`, `tenants.csv` +
/// `.parquet` and `classes.csv` into `dir`; returns the paths written.
pub fn write_tables(dir: &Path, r: &SimResult) -> Result<Vec<PathBuf>, TableError> {
    std::fs::create_dir_all(dir).map_err(|e| TableError::Io(dir.to_path_buf(), e))?;
    let mut jobs = jobs_frame(r)?;
    let mut tenants = tenant_table(&jobs, &r.tenant_targets)?;
    let mut classes = class_table(&jobs)?;
    let mut intervals = intervals_frame(r, INTERVALS)?;
    let mut tenant_intervals = tenant_intervals_frame(r, INTERVALS, 12)?;
    let mut written = Vec::new();
    let mut out = |name: &str, df: &mut DataFrame| -> Result<(), TableError> {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).map_err(|e| TableError::Io(path.clone(), e))?;
        if name.ends_with(".parquet") {
            ParquetWriter::new(file).finish(df)?;
        } else {
            CsvWriter::new(file).include_header(true).finish(df)?;
        }
        written.push(path);
        Ok(())
    };
    out("jobs.parquet", &mut jobs)?;
    out("intervals.parquet", &mut intervals)?;
    out("intervals.csv", &mut intervals)?;
    out("tenant_intervals.parquet", &mut tenant_intervals)?;
    out("tenants.parquet", &mut tenants)?;
    out("tenants.csv", &mut tenants)?;
    out("classes.csv", &mut classes)?;
    Ok(written)
}

/// Converts a CSV table with a header (e.g. a sweep's `sweep.csv`) to Parquet, column types inferred.
pub fn csv_to_parquet(csv: &Path, parquet: &Path) -> Result<usize, TableError> {
    let mut df = CsvReadOptions::default()
        .with_has_header(true)
        .with_infer_schema_length(None)
        .try_into_reader_with_file_path(Some(csv.to_path_buf()))?
        .finish()?;
    let file = std::fs::File::create(parquet).map_err(|e| TableError::Io(parquet.to_path_buf(), e))?;
    ParquetWriter::new(file).finish(&mut df)?;
    Ok(df.height())
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("writing {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("building a table: {0}")]
    Polars(#[from] PolarsError),
}

/// The kinds' column names in [`intervals_frame`], in order.
pub fn event_columns() -> Vec<String> {
    EVENT_KINDS.iter().map(|k| event_column(k)).collect()
}
