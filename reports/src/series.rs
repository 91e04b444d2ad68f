//! Time series and distributions derived from the per-allocation records.

use lattice_sim::{JobRecord, RunSpan, Timeline};

/// `(x, y)` points in x order.
pub type Series = Vec<(f64, f64)>;

/// Busy-node fraction and queue depth (submitted, not yet started), each averaged over `bins` equal
/// intervals from the first submission to the last end; points at the interval centres (hours since the
/// first submission). Busy nodes come from the runs on nodes (a suspended allocation holds none).
/// Exact integrals of the step functions, so short spikes are neither lost nor exaggerated.
pub fn occupancy(jobs: &[JobRecord], runs: &[RunSpan], nodes: u32, bins: usize) -> (Series, Series) {
    let mut busy: Vec<(f64, i64)> = Vec::new();
    let mut queue: Vec<(f64, i64)> = Vec::new();
    for j in jobs {
        queue.push((j.submit_s, 1));
        if let Some(s) = j.start_s {
            queue.push((s, -1));
        }
    }
    for r in runs {
        let n: i64 = r.nodes.iter().map(|(a, b)| (b - a + 1) as i64).sum();
        busy.push((r.start_s, n));
        if let Some(e) = r.end_s {
            busy.push((e, -n));
        }
    }
    let Some((t0, t1)) = span(jobs).filter(|_| bins > 0) else {
        return (Vec::new(), Vec::new());
    };
    let width = (t1 - t0) / bins as f64;
    let average = |ev: Vec<(f64, i64)>, scale: f64| -> Series {
        bin_average(ev, t0, t1, bins)
            .iter()
            .enumerate()
            .map(|(k, v)| ((k as f64 + 0.5) * width / 3600.0, v * scale))
            .collect()
    };
    (average(busy, 1.0 / nodes.max(1) as f64), average(queue, 1.0))
}

/// The time span of the records: first submission to last end (at least 1 s), if any.
fn span(jobs: &[JobRecord]) -> Option<(f64, f64)> {
    let t0 = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let t1 = jobs
        .iter()
        .map(|j| j.end_s.or(j.start_s).unwrap_or(j.submit_s))
        .fold(f64::NEG_INFINITY, f64::max);
    (t0.is_finite() && t1.is_finite()).then(|| (t0, t1.max(t0 + 1.0)))
}

/// The average level of a step function (`(time, change)` events, starting at 0) over each of `bins`
/// equal intervals of [t0, t1].
fn bin_average(mut ev: Vec<(f64, i64)>, t0: f64, t1: f64, bins: usize) -> Vec<f64> {
    let width = (t1 - t0) / bins as f64;
    ev.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut acc = vec![0.0f64; bins];
    // Adds `level` over [from, to) to the bins it covers.
    let mut spread = |from: f64, to: f64, level: i64| {
        let mut a = from;
        while a < to {
            let bin = (((a - t0) / width).floor() as usize).min(bins - 1);
            let edge = (t0 + (bin + 1) as f64 * width).min(to);
            let b = if edge > a { edge } else { to };
            acc[bin] += level as f64 * (b - a);
            a = b;
        }
    };
    let (mut level, mut t) = (0i64, t0);
    for (et, d) in ev {
        let et = et.clamp(t0, t1);
        if et > t {
            spread(t, et, level);
            t = et;
        }
        level += d;
    }
    if t < t1 {
        spread(t, t1, level);
    }
    acc.iter().map(|sum| sum / width).collect()
}

/// Each of the `top` tenants with the most node-hours: its share of the busy node-time in each of
/// `bins` intervals (0 where nothing ran), in decreasing node-hours order.
pub fn tenant_shares(jobs: &[JobRecord], runs: &[RunSpan], bins: usize, top: usize) -> Vec<(String, Series)> {
    let Some((t0, t1)) = span(jobs) else { return Vec::new() };
    if bins == 0 {
        return Vec::new();
    }
    // Ended runs: (tenant, start, end, nodes).
    let ended: Vec<(&str, f64, f64, i64)> = runs
        .iter()
        .filter_map(|r| {
            let n: i64 = r.nodes.iter().map(|(a, b)| (b - a + 1) as i64).sum();
            Some((jobs.get(r.job as usize)?.tenant.as_ref(), r.start_s, r.end_s?, n))
        })
        .collect();
    let run_events = |r: &(&str, f64, f64, i64)| -> [(f64, i64); 2] { [(r.1, r.3), (r.2, -r.3)] };
    let mut hours: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for r in &ended {
        *hours.entry(r.0).or_default() += r.3 as f64 * (r.2 - r.1);
    }
    let mut ranked: Vec<(&str, f64)> = hours.into_iter().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let total = bin_average(ended.iter().flat_map(run_events).collect(), t0, t1, bins);
    let width = (t1 - t0) / bins as f64;
    ranked
        .into_iter()
        .take(top)
        .map(|(t, _)| {
            let mine = bin_average(
                ended.iter().filter(|r| r.0 == t).flat_map(run_events).collect(),
                t0,
                t1,
                bins,
            );
            let series = mine
                .iter()
                .zip(&total)
                .enumerate()
                .map(|(k, (m, all))| {
                    (
                        (k as f64 + 0.5) * width / 3600.0,
                        if *all > 0.0 { m / all } else { 0.0 },
                    )
                })
                .collect();
            (t.to_string(), series)
        })
        .collect()
}

/// The time span of a run's records (seconds): first submission to last end, if any.
pub fn time_span(jobs: &[JobRecord]) -> Option<(f64, f64)> {
    span(jobs)
}

/// Point events of the timeline counted per interval: for each kind (in [`EVENT_KINDS`] order) the
/// number of events in each of `bins` equal intervals of [t0, t1] (points at interval centres, hours
/// since t0). Borrowing counts starts on borrowed nodes.
pub fn event_counts(timeline: &Timeline, t0: f64, t1: f64, bins: usize) -> Vec<(&'static str, Series)> {
    let width = (t1 - t0) / bins.max(1) as f64;
    let mut counts = vec![vec![0.0f64; bins]; EVENT_KINDS.len()];
    for e in &timeline.events {
        let label = e.kind.label();
        let Some(k) = EVENT_KINDS.iter().position(|x| *x == label) else {
            continue;
        };
        if bins == 0 || e.time_s < t0 || e.time_s > t1 {
            continue;
        }
        let b = (((e.time_s - t0) / width).floor() as usize).min(bins - 1);
        counts[k][b] += 1.0;
    }
    EVENT_KINDS
        .iter()
        .zip(counts)
        .map(|(name, c)| {
            let series = c
                .into_iter()
                .enumerate()
                .map(|(b, v)| ((b as f64 + 0.5) * width / 3600.0, v))
                .collect();
            (*name, series)
        })
        .collect()
}

/// The event series of [`event_counts`], in order.
pub const EVENT_KINDS: [&str; 5] = [
    "preemptions",
    "checkpoints completed",
    "checkpoints failed",
    "starts on borrowed nodes",
    "node failures",
];

/// Node occupancy aggregated for a Gantt heat map: `rows` blocks of consecutive nodes (node indices
/// split as evenly as possible) × `bins` equal intervals of [t0, t1]; each cell is the busy fraction of
/// its block's node-time (exact: every run's node-seconds are split over the cells it covers).
pub fn gantt_cells(timeline: &Timeline, nodes: u32, t0: f64, t1: f64, rows: usize, bins: usize) -> Vec<Vec<f64>> {
    let rows = rows.min(nodes as usize).max(1);
    let mut cells = vec![vec![0.0f64; bins]; rows];
    if bins == 0 || nodes == 0 || t1 <= t0 {
        return cells;
    }
    let width = (t1 - t0) / bins as f64;
    // Block r holds nodes [first(r), first(r + 1)).
    let first = |r: usize| (r as u64 * nodes as u64 / rows as u64) as u32;
    let block_of = |n: u32| {
        // The largest r with first(r) <= n.
        let mut r = ((n as u64 * rows as u64) / nodes as u64) as usize;
        while r + 1 < rows && first(r + 1) <= n {
            r += 1;
        }
        while r > 0 && first(r) > n {
            r -= 1;
        }
        r
    };
    for run in &timeline.runs {
        let (s, e) = (run.start_s.max(t0), run.end_s.unwrap_or(t1).min(t1));
        if e <= s {
            continue;
        }
        let (b0, b1) = (
            (((s - t0) / width).floor() as usize).min(bins - 1),
            (((e - t0) / width).ceil() as usize).clamp(1, bins),
        );
        for &(lo, hi) in &run.nodes {
            let (lo, hi) = (lo.min(nodes - 1), hi.min(nodes - 1));
            let mut n = lo;
            while n <= hi {
                let r = block_of(n);
                let end = (if r + 1 < rows { first(r + 1) } else { nodes }).min(hi + 1);
                let count = (end - n) as f64;
                for (b, cell) in cells[r].iter_mut().enumerate().take(b1).skip(b0) {
                    let (c0, c1) = (t0 + b as f64 * width, t0 + (b + 1) as f64 * width);
                    let overlap = e.min(c1) - s.max(c0);
                    if overlap > 0.0 {
                        *cell += count * overlap;
                    }
                }
                n = end;
            }
        }
    }
    for (r, row) in cells.iter_mut().enumerate() {
        let size = (if r + 1 < rows { first(r + 1) } else { nodes } - first(r)).max(1) as f64;
        for c in row.iter_mut() {
            *c = (*c / (size * width)).min(1.0);
        }
    }
    cells
}

/// The empirical CDF of wait times in hours (at most 1000 points: every k-th sorted wait).
pub fn wait_cdf(jobs: &[JobRecord]) -> Series {
    let mut w: Vec<f64> = jobs.iter().filter_map(|j| j.wait_s).map(|s| s / 3600.0).collect();
    w.sort_by(f64::total_cmp);
    let n = w.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(1000);
    let mut out: Series = (0..n)
        .step_by(step)
        .map(|i| (w[i], (i + 1) as f64 / n as f64))
        .collect();
    if out.last().is_some_and(|p| p.1 < 1.0) {
        out.push((w[n - 1], 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(submit: f64, start: Option<f64>, end: Option<f64>, nodes: u32) -> JobRecord {
        JobRecord {
            id: "j".into(),
            submit_s: submit,
            start_s: start,
            end_s: end,
            nodes,
            wait_s: start.map(|s| s - submit),
            bsld: None,
            backfilled: false,
            tenant: "t".into(),
            vcluster: "v".into(),
            state: "completed",
            reason: "success",
            gpus: 0,
            groups: None,
            conformance: None,
            class: 5,
            score: None,
            preempted: 0,
            borrowed: 0,
            run_s: start.zip(end).map(|(s, e)| e - s),
        }
    }

    fn run(start: f64, end: Option<f64>, nodes: Vec<(u32, u32)>) -> lattice_sim::RunSpan {
        lattice_sim::RunSpan {
            job: 0,
            start_s: start,
            end_s: end,
            nodes,
        }
    }

    #[test]
    fn gantt_cells_split_node_time_exactly() {
        // 4 nodes in 2 blocks, 2 one-hour bins. Node 0 busy 0-2 h, nodes 2-3 busy 1-1.5 h; an open run on
        // node 1 from 1.5 h lasts to the end.
        let t = Timeline {
            runs: vec![
                run(0.0, Some(7200.0), vec![(0, 0)]),
                run(3600.0, Some(5400.0), vec![(2, 3)]),
                run(5400.0, None, vec![(1, 1)]),
            ],
            events: vec![],
        };
        let cells = gantt_cells(&t, 4, 0.0, 7200.0, 2, 2);
        assert_eq!(cells, vec![vec![0.5, 0.75], vec![0.0, 0.5]]);
        // More rows than nodes: one node per row.
        let cells = gantt_cells(&t, 4, 0.0, 7200.0, 10, 1);
        assert_eq!(cells, vec![vec![1.0], vec![0.25], vec![0.25], vec![0.25]]);
        // Uneven blocks (5 nodes, 2 rows: nodes 0-1 and 2-4): node-time is kept.
        let t = Timeline {
            runs: vec![run(0.0, Some(3600.0), vec![(0, 4)])],
            events: vec![],
        };
        assert_eq!(gantt_cells(&t, 5, 0.0, 3600.0, 2, 1), vec![vec![1.0], vec![1.0]]);
    }

    #[test]
    fn events_are_counted_per_interval_and_kind() {
        use lattice_sim::{TimelineEvent, TimelineKind};
        let ev = |t: f64, kind| TimelineEvent { time_s: t, kind };
        let t = Timeline {
            runs: vec![],
            events: vec![
                ev(10.0, TimelineKind::Preemption("priority")),
                ev(20.0, TimelineKind::Preemption("reclaim")),
                ev(3700.0, TimelineKind::CheckpointDone),
                ev(7200.0, TimelineKind::NodeDown),
                ev(100.0, TimelineKind::Borrow(3)),
            ],
        };
        let c = event_counts(&t, 0.0, 7200.0, 2);
        let ys = |k: usize| c[k].1.iter().map(|p| p.1).collect::<Vec<_>>();
        assert_eq!(c[0].0, "preemptions");
        assert_eq!(ys(0), vec![2.0, 0.0]);
        assert_eq!(ys(1), vec![0.0, 1.0]);
        assert_eq!(ys(2), vec![0.0, 0.0]);
        assert_eq!(ys(3), vec![1.0, 0.0]);
        assert_eq!(ys(4), vec![0.0, 1.0], "an event at the end falls in the last interval");
        assert_eq!(c[0].1[0].0, 0.5);
    }

    /// One run per started record, on nodes 0..nodes.
    fn runs_of(jobs: &[JobRecord]) -> Vec<lattice_sim::RunSpan> {
        jobs.iter()
            .enumerate()
            .filter_map(|(k, j)| Some(run_of(k, j.start_s?, j.end_s, j.nodes)))
            .collect()
    }

    fn run_of(job: usize, start: f64, end: Option<f64>, nodes: u32) -> lattice_sim::RunSpan {
        lattice_sim::RunSpan {
            job: job as u32,
            start_s: start,
            end_s: end,
            nodes: vec![(0, nodes - 1)],
        }
    }

    #[test]
    fn occupancy_tracks_busy_nodes_and_queue() {
        // 4 nodes. A: 2 nodes 0-3600 s; B submitted at 0, waits, runs 3600-7200 s on 4 nodes.
        let jobs = [
            rec(0.0, Some(0.0), Some(3600.0), 2),
            rec(0.0, Some(3600.0), Some(7200.0), 4),
        ];
        let runs = runs_of(&jobs);
        let (busy, queue) = occupancy(&jobs, &runs, 4, 2);
        assert_eq!(busy, vec![(0.5, 0.5), (1.5, 1.0)]);
        assert_eq!(queue, vec![(0.5, 1.0), (1.5, 0.0)]);
        // Bins that split the runs: a quarter-hour bin each; averages are exact.
        let (busy, queue) = occupancy(&jobs, &runs, 4, 3);
        let close = |a: &Series, b: &[f64]| a.iter().zip(b).all(|(p, x)| (p.1 - x).abs() < 1e-9);
        assert!(close(&busy, &[0.5, 0.75, 1.0]), "{busy:?}");
        assert!(close(&queue, &[1.0, 0.5, 0.0]), "{queue:?}");
        // Node-hours are preserved: Σ busy × width = (2 × 1 h + 4 × 1 h) / 4 nodes.
        let (busy, _) = occupancy(&jobs, &runs, 4, 7);
        let total: f64 = busy.iter().map(|p| p.1 * 2.0 / 7.0).sum();
        assert!((total - 1.5).abs() < 1e-9, "{total}");
        // A preempted allocation holds no nodes while suspended: 4 nodes 0-1 h and 2-3 h.
        let jobs = [rec(0.0, Some(0.0), Some(3.0 * 3600.0), 4)];
        let runs = [
            run_of(0, 0.0, Some(3600.0), 4),
            run_of(0, 7200.0, Some(3.0 * 3600.0), 4),
        ];
        let (busy, queue) = occupancy(&jobs, &runs, 4, 3);
        assert_eq!(busy.iter().map(|p| p.1).collect::<Vec<_>>(), vec![1.0, 0.0, 1.0]);
        assert_eq!(queue.iter().map(|p| p.1).collect::<Vec<_>>(), vec![0.0, 0.0, 0.0]);
    }

    #[test]
    fn tenant_shares_split_the_busy_time() {
        let mut a = rec(0.0, Some(0.0), Some(7200.0), 3);
        a.tenant = "a".into();
        let mut b = rec(0.0, Some(3600.0), Some(7200.0), 1);
        b.tenant = "b".into();
        let jobs = [a, b];
        let shares = tenant_shares(&jobs, &runs_of(&jobs), 2, 5);
        assert_eq!(shares.len(), 2);
        assert_eq!(shares[0].0, "a", "most node-hours first");
        assert_eq!(shares[0].1, vec![(0.5, 1.0), (1.5, 0.75)]);
        assert_eq!(shares[1].1, vec![(0.5, 0.0), (1.5, 0.25)]);
        assert_eq!(tenant_shares(&[], &[], 2, 5), vec![]);
    }

    #[test]
    fn cdf_ends_at_one() {
        let jobs: Vec<JobRecord> = (0..2500).map(|i| rec(0.0, Some(i as f64 * 36.0), None, 1)).collect();
        let c = wait_cdf(&jobs);
        assert!(c.len() <= 1001);
        assert_eq!(c.last().copied(), Some((2499.0 * 36.0 / 3600.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }
}
