//! The polars tables agree with the simulator's own metrics (DESIGN.md §3), and their Parquet/CSV export
//! reads back.

use lattice_reports::tables;
use lattice_sim::{SimConfig, SimResult, simulate};
use lattice_traces::{SwfOptions, homogeneous, read_swf};
use polars::prelude::*;
use std::path::PathBuf;

/// The bundled demo trace (128 nodes, 2000 jobs) under EASY, with a target for two of its tenants.
fn demo() -> SimResult {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces/library/demo-128n.swf");
    let w = read_swf(&p, &SwfOptions::default()).unwrap();
    let mut cfg = SimConfig::default();
    for (t, share) in [(w.tenants.names()[0].clone(), 0.3), (w.tenants.names()[1].clone(), 0.2)] {
        let q = cfg.tenants.entry(t).or_default();
        q.fair_share_target = Some(share);
    }
    simulate(&w, &homogeneous(128), &cfg, &mut |_, _| {}).unwrap()
}

fn f64_at(df: &DataFrame, col: &str, i: usize) -> f64 {
    df.column(col).unwrap().f64().unwrap().get(i).unwrap_or(f64::NAN)
}

#[test]
fn class_table_matches_the_summary() {
    let r = demo();
    let jobs = tables::jobs_frame(&r).unwrap();
    assert_eq!(jobs.height(), r.jobs.len());
    let classes = tables::class_table(&jobs).unwrap();
    assert_eq!(classes.height(), r.summary.per_class.len());
    let ids = classes.column("class").unwrap().u32().unwrap();
    for i in 0..classes.height() {
        let class = ids.get(i);
        let g = &r.summary.per_class[&format!("{:02}", class.unwrap())];
        let n = classes
            .column("jobs")
            .unwrap()
            .get(i)
            .unwrap()
            .extract::<u64>()
            .unwrap();
        assert_eq!(n, g.jobs);
        for (c, want) in [
            ("p50_wait_h", g.p50_wait_s / 3600.0),
            ("p95_wait_h", g.p95_wait_s / 3600.0),
            ("p99_wait_h", g.p99_wait_s / 3600.0),
            ("mean_bsld", g.mean_bsld),
        ] {
            let got = f64_at(&classes, c, i);
            assert!((got - want).abs() < 1e-5, "class {class:?} {c}: {got} vs {want}");
        }
    }
}

#[test]
fn tenant_table_shares_and_targets() {
    let r = demo();
    let jobs = tables::jobs_frame(&r).unwrap();
    let t = tables::tenant_table(&jobs, &r.tenant_targets).unwrap();
    assert_eq!(t.height(), r.summary.per_tenant.len());
    let tenant = t.column("tenant").unwrap().str().unwrap();
    let names: Vec<String> = (0..t.height()).map(|i| tenant.get(i).unwrap().to_string()).collect();
    let mut share_sum = 0.0;
    let mut last = f64::INFINITY;
    for (i, name) in names.iter().enumerate() {
        let g = &r.summary.per_tenant[name];
        let hours = f64_at(&t, "node_hours", i);
        assert!(
            (hours - g.node_hours).abs() < 1e-3,
            "{name}: {hours} vs {}",
            g.node_hours
        );
        assert!(hours <= last, "heaviest first");
        last = hours;
        share_sum += f64_at(&t, "share", i);
        let target = f64_at(&t, "target", i);
        assert_eq!(target, r.tenant_targets[name]);
        assert!((f64_at(&t, "share_minus_target", i) - (f64_at(&t, "share", i) - target)).abs() < 1e-12);
    }
    assert!((share_sum - 1.0).abs() < 1e-9);
    // The two configured targets are kept; the others split the remaining half equally.
    let (a, b) = (&names, &r.tenant_targets);
    assert_eq!(b.values().filter(|v| **v == 0.3).count(), 1);
    let rest = 0.5 / (a.len() - 2) as f64;
    assert_eq!(b.values().filter(|v| (**v - rest).abs() < 1e-12).count(), a.len() - 2);
}

#[test]
fn intervals_integrate_to_the_utilization() {
    let r = demo();
    let iv = tables::intervals_frame(&r, tables::INTERVALS).unwrap();
    assert_eq!(iv.height(), tables::INTERVALS);
    let mean = iv.column("utilization").unwrap().f64().unwrap().mean().unwrap();
    assert!(
        (mean - r.summary.utilization).abs() < 1e-6,
        "{mean} vs {}",
        r.summary.utilization
    );
    for c in tables::event_columns() {
        assert!(iv.column(&c).is_ok(), "missing {c}");
    }
    let ti = tables::tenant_intervals_frame(&r, 50, 3).unwrap();
    assert_eq!(ti.height(), 150);
}

#[test]
fn tables_export_as_parquet_and_csv_and_read_back() {
    let r = demo();
    let dir = std::env::temp_dir().join(format!("lattice-tables-{}", std::process::id()));
    let written = tables::write_tables(&dir, &r).unwrap();
    assert_eq!(written.len(), 7);
    let f = std::fs::File::open(dir.join("jobs.parquet")).unwrap();
    let back = ParquetReader::new(f).finish().unwrap();
    let jobs = tables::jobs_frame(&r).unwrap();
    assert!(back.equals_missing(&jobs), "jobs.parquet round-trips");
    let csv = std::fs::read_to_string(dir.join("intervals.csv")).unwrap();
    assert!(csv.starts_with("interval,start_h,end_h,utilization,queue_depth,preemptions,"));
    assert_eq!(csv.lines().count(), tables::INTERVALS + 1);
    let tenants = std::fs::read_to_string(dir.join("tenants.csv")).unwrap();
    assert!(tenants.starts_with("tenant,jobs,node_hours,share,target,share_minus_target,"));
    std::fs::remove_dir_all(&dir).unwrap();
}
