//! An independent reference of EASY backfilling as pyss schedules it (DESIGN.md, "EASY,
//! pyss-compatible"), written from those rules alone: one pool of processors, an event heap, a FIFO
//! queue and the shadow/extra bookkeeping — nothing of the engine's. It reads the trace with the same
//! reader (so both see the same jobs). `rm-replay bench` times it beside the engine's
//! `--policy easy --compat pyss` (the side-by-side ratio the speed goals are stated against), and a
//! test holds the engine to it job by job on real traces.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// One job as the reference sees it (times in ms; `run` already clamped to `req` by the pyss reading).
#[derive(Clone, Copy, Debug)]
pub struct RefJob {
    pub submit: u64,
    pub size: u32,
    pub run: u64,
    pub req: u64,
}

/// The jobs of a workload read with `SwfOptions { pyss: true, .. }`, in trace order.
pub fn jobs(w: &lattice_traces::Workload) -> Vec<RefJob> {
    w.jobs
        .iter()
        .map(|j| RefJob {
            submit: j.submit.0,
            size: j.spec.nodes.min,
            run: j.runtime.map_or(0, |d| d.0),
            req: j.spec.lifecycle.walltime().map_or(u64::MAX, |d| d.0),
        })
        .collect()
}

/// Each job's start time (ms), or `None` for a job larger than the machine (it never starts).
pub fn pyss_easy(jobs: &[RefJob], procs: u32) -> Vec<Option<u64>> {
    // Events ordered by (time, kind, insertion order): submissions (kind 0) before terminations (1).
    let mut events: BinaryHeap<Reverse<(u64, u8, u64, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, j) in jobs.iter().enumerate() {
        events.push(Reverse((j.submit, 0, seq, i)));
        seq += 1;
    }
    let mut start: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut queue: VecDeque<usize> = VecDeque::new();
    // Running jobs (index) until their termination event is handled.
    let mut running: Vec<usize> = Vec::new();
    let est_end = |i: usize, start: &[Option<u64>]| start[i].unwrap_or(0).saturating_add(jobs[i].req);
    while let Some(Reverse((t, kind, _, i))) = events.pop() {
        let free = |running: &[usize], start: &[Option<u64>]| -> i64 {
            i64::from(procs)
                - running
                    .iter()
                    .filter(|&&r| est_end(r, start) > t)
                    .map(|&r| i64::from(jobs[r].size))
                    .sum::<i64>()
        };
        if kind == 0 {
            if jobs[i].size > procs {
                continue; // never fits: refused
            }
            queue.push_back(i);
            if i64::from(jobs[i].size) > free(&running, &start) {
                continue;
            }
        } else if let Some(p) = running.iter().position(|&r| r == i) {
            running.swap_remove(p);
        }
        // A pass at t.
        let mut launch = |i: usize, running: &mut Vec<usize>, start: &mut Vec<Option<u64>>| {
            start[i] = Some(t);
            running.push(i);
            events.push(Reverse((t + jobs[i].run, 1, seq, i)));
            seq += 1;
        };
        while let Some(&h) = queue.front() {
            if i64::from(jobs[h].size) > free(&running, &start) {
                break;
            }
            queue.pop_front();
            launch(h, &mut running, &mut start);
        }
        if queue.len() < 2 {
            continue;
        }
        let head = queue[0];
        let now_free = free(&running, &start);
        let mut ends: Vec<(u64, u32)> = running
            .iter()
            .map(|&r| (est_end(r, &start), jobs[r].size))
            .filter(|&(e, _)| e > t)
            .collect();
        ends.sort_unstable();
        let mut released = 0i64;
        let mut shadow = None;
        for &(e, size) in &ends {
            released += i64::from(size);
            if now_free + released >= i64::from(jobs[head].size) {
                shadow = Some(e);
                break;
            }
        }
        let Some(shadow) = shadow else { continue };
        let by_shadow: i64 = ends
            .iter()
            .filter(|&&(e, _)| e <= shadow)
            .map(|&(_, s)| i64::from(s))
            .sum();
        let mut extra = now_free + by_shadow - i64::from(jobs[head].size);
        let mut nonextra = now_free - extra;
        if nonextra < 0 {
            extra += nonextra;
            nonextra = 0;
        }
        let mut k = 1;
        while k < queue.len() {
            let j = queue[k];
            let size = i64::from(jobs[j].size);
            let starts = if jobs[j].req > shadow - t {
                if size <= extra {
                    extra -= size;
                    true
                } else {
                    false
                }
            } else if size <= extra + nonextra {
                nonextra -= size;
                if nonextra < 0 {
                    extra += nonextra;
                    nonextra = 0;
                }
                true
            } else {
                false
            };
            if starts {
                queue.remove(k);
                launch(j, &mut running, &mut start);
            } else {
                k += 1;
            }
        }
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_engine::Policy;
    use lattice_traces::{SwfOptions, homogeneous};

    /// The engine's `--policy easy --compat pyss` starts every job of a real trace exactly when the
    /// reference does (KTH-SP2: 28k jobs on 100 processors, thousands of them backfilled).
    /// `LATTICE_REFERENCE_ALL=1` adds LANL-CM5 (111k jobs on 1,024) and LCG (188k) — equal too, but
    /// half a minute in a debug build. NASA-iPSC has no requested times: the pyss reading keeps none
    /// of its jobs.
    #[test]
    fn the_engine_schedules_pyss_easy_as_the_reference_does() {
        let mut traces = vec![("KTH-SP2-1996-2.1-cln.swf.gz", 1000)];
        if std::env::var_os("LATTICE_REFERENCE_ALL").is_some() {
            traces.extend([("LANL-CM5-1994-4.1-cln.swf.gz", 1000), ("LCG.swf.gz", 0)]);
        }
        for (name, min_backfilled) in traces {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/traces")
                .join(name);
            let w = lattice_traces::read_swf(
                &p,
                &SwfOptions {
                    pyss: true,
                    ..SwfOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{} is required: {e}", p.display()));
            let procs = w.cluster_nodes.expect("the header declares the size");
            let want = pyss_easy(&jobs(&w), procs);
            let cfg = lattice_sim::SimConfig {
                policy: Policy::PyssEasy,
                ..lattice_sim::SimConfig::default()
            };
            let r = lattice_sim::simulate(&w, &homogeneous(procs), &cfg, &mut |_, _| {}).unwrap();
            assert_eq!(r.jobs.len(), w.jobs.len());
            let mut differ = Vec::new();
            for (i, (j, rec)) in w.jobs.iter().zip(&r.jobs).enumerate() {
                assert_eq!(j.id, rec.id);
                let got = rec.start_s.map(|s| (s * 1000.0).round() as u64);
                if got != want[i] {
                    differ.push(format!(
                        "job {} (line {}): engine {got:?}, reference {:?}",
                        j.id, j.line, want[i]
                    ));
                }
            }
            assert!(
                differ.is_empty(),
                "{name}: {} of {} jobs start differently, first: {:?}",
                differ.len(),
                w.jobs.len(),
                &differ[..differ.len().min(5)]
            );
            assert!(
                r.summary.backfilled >= min_backfilled,
                "{name}: {}",
                r.summary.backfilled
            );
        }
    }
}
