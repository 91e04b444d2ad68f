//! `rm-replay sweep`: replay one trace under many weight vectors (a grid, or a seeded random search)
//! on all cores, score each run with an objective, write the table of every run and name the best
//! profile (Performance Tuning Guide, steps 3-5).
//!
//! Varied weights take exactly the swept values; the other weights are rescaled so the total stays the
//! base profile's (the usual renormalisation: weights are relative). Each replay is deterministic, so a
//! sweep's table does not depend on the number of threads.

use crate::replay::{self, ReplayOptions};
use anyhow::{Context, Result, bail};
use lattice_engine::CostWeights;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `fair_share=0.1:0.4:0.05`: a weight and its range (`lo:hi:step`; the step is only for grids).
#[derive(Clone, Debug, PartialEq)]
pub struct Vary {
    pub weight: usize,
    pub lo: f64,
    pub hi: f64,
    pub step: Option<f64>,
}

impl Vary {
    pub fn name(&self) -> &'static str {
        CostWeights::NAMES[self.weight]
    }

    pub fn parse(s: &str) -> Result<Vary, String> {
        let (name, range) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}`: expected NAME=LO:HI[:STEP]"))?;
        let weight = CostWeights::NAMES
            .iter()
            .position(|n| *n == name.trim())
            .ok_or_else(|| format!("`{name}` is not a weight ({})", CostWeights::NAMES.join(", ")))?;
        let parts: Vec<&str> = range.split(':').collect();
        let num = |p: &str| -> Result<f64, String> {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("`{s}`: `{p}` is not a number >= 0"))
        };
        let (lo, hi, step) = match parts.as_slice() {
            [lo, hi] => (num(lo)?, num(hi)?, None),
            [lo, hi, st] => (num(lo)?, num(hi)?, Some(num(st)?)),
            _ => return Err(format!("`{s}`: expected NAME=LO:HI[:STEP]")),
        };
        if lo > hi {
            return Err(format!("`{s}`: LO is above HI"));
        }
        if step == Some(0.0) {
            return Err(format!("`{s}`: STEP must be positive"));
        }
        Ok(Vary { weight, lo, hi, step })
    }

    /// Grid values lo, lo+step, ..., up to hi (inclusive, within rounding).
    fn values(&self) -> Vec<f64> {
        let Some(step) = self.step else {
            return vec![self.lo, self.hi];
        };
        let n = ((self.hi - self.lo) / step + 1e-9).floor() as usize;
        (0..=n)
            .map(|i| ((self.lo + i as f64 * step) * 1e9).round() / 1e9)
            .collect()
    }
}

/// Every combination of the grid values (first `--vary` outermost).
pub fn grid(vary: &[Vary]) -> Vec<Vec<f64>> {
    let mut points = vec![Vec::new()];
    for v in vary {
        let vals = v.values();
        points = points
            .into_iter()
            .flat_map(|p| {
                vals.iter().map(move |x| {
                    let mut q = p.clone();
                    q.push(*x);
                    q
                })
            })
            .collect();
    }
    points
}

/// `n` points drawn uniformly within each range, from `seed`.
pub fn random(vary: &[Vary], n: usize, seed: u64) -> Vec<Vec<f64>> {
    use rand_chacha::rand_core::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            vary.iter()
                .map(|v| {
                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    ((v.lo + u * (v.hi - v.lo)) * 1e6).round() / 1e6
                })
                .collect()
        })
        .collect()
}

/// `base` with the varied weights set and the others rescaled so the total stays the base's.
pub fn apply(base: &CostWeights, vary: &[Vary], values: &[f64]) -> CostWeights {
    let mut w = base.as_array();
    let total: f64 = w.iter().sum();
    let varied: f64 = values.iter().sum();
    let others: f64 = (0..9)
        .filter(|i| !vary.iter().any(|v| v.weight == *i))
        .map(|i| w[i])
        .sum();
    let scale = if others > 0.0 && total > varied {
        (total - varied) / others
    } else {
        1.0
    };
    for (i, x) in w.iter_mut().enumerate() {
        match vary.iter().position(|v| v.weight == i) {
            Some(k) => *x = values[k],
            None => *x = (*x * scale * 1e6).round() / 1e6,
        }
    }
    CostWeights::from_array(w)
}

/// A summary metric by name: the `summary.json` key, with `_s` implied for times and short aliases:
/// `fairness` = `fair_share_jain` and `share_dev` = `fair_share_dev_max` (demand-aware, the ones that
/// move with the weights), `tenant_bsld_jain`, `bsld` = `mean_bsld`; the older `jain` = `jain_index`
/// and `share_deviation` = `max_share_deviation` keep their whole-run meaning.
pub fn metric(summary: &Value, name: &str) -> Option<f64> {
    let key = match name {
        "fairness" => "fair_share_jain",
        "slo" => "slo_wait_compliance",
        "share_dev" => "fair_share_dev_max",
        "jain" => "jain_index",
        "share_deviation" => "max_share_deviation",
        "bsld" => "mean_bsld",
        "backfill" => "backfilled",
        n => n,
    };
    summary
        .get(key)
        .or_else(|| summary.get(format!("{key}_s")))
        .and_then(Value::as_f64)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cmp {
    Ge,
    Le,
    Gt,
    Lt,
}

/// `minimize p95_wait subject to jain >= 0.9 and utilization > 0.6`.
#[derive(Clone, Debug, PartialEq)]
pub struct Objective {
    pub minimize: bool,
    pub metric: String,
    pub constraints: Vec<(String, Cmp, f64)>,
}

impl Objective {
    pub fn parse(s: &str) -> Result<Objective, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let minimize = match words.first() {
            Some(&"minimize") | Some(&"min") => true,
            Some(&"maximize") | Some(&"max") => false,
            _ => return Err(format!("`{s}`: start with `minimize METRIC` or `maximize METRIC`")),
        };
        let metric = words.get(1).ok_or_else(|| format!("`{s}`: which metric?"))?.to_string();
        let mut constraints = Vec::new();
        let mut rest = &words[2..];
        if !rest.is_empty() {
            if rest.len() < 2 || rest[0] != "subject" || rest[1] != "to" {
                return Err(format!(
                    "`{s}`: expected `subject to METRIC >= VALUE [and ...]` after the metric"
                ));
            }
            rest = &rest[2..];
            loop {
                let [m, op, v, tail @ ..] = rest else {
                    return Err(format!("`{s}`: a constraint is `METRIC >= VALUE` (or <=, >, <)"));
                };
                let op = match *op {
                    ">=" => Cmp::Ge,
                    "<=" => Cmp::Le,
                    ">" => Cmp::Gt,
                    "<" => Cmp::Lt,
                    o => return Err(format!("`{s}`: `{o}` is not one of >=, <=, >, <")),
                };
                let v: f64 = v.parse().map_err(|_| format!("`{s}`: `{v}` is not a number"))?;
                constraints.push((m.to_string(), op, v));
                match tail {
                    [] => break,
                    ["and", more @ ..] => rest = more,
                    _ => return Err(format!("`{s}`: join constraints with `and`")),
                }
            }
        }
        Ok(Objective {
            minimize,
            metric,
            constraints,
        })
    }

    /// Checks the metric names against a summary (so typos fail before hours of replays).
    pub fn check_names(&self, summary: &Value) -> Result<(), String> {
        for m in std::iter::once(&self.metric).chain(self.constraints.iter().map(|c| &c.0)) {
            if metric(summary, m).is_none() {
                return Err(format!("objective: `{m}` is not a numeric summary metric"));
            }
        }
        Ok(())
    }

    pub fn feasible(&self, summary: &Value) -> bool {
        self.constraints.iter().all(|(m, op, v)| {
            metric(summary, m).is_some_and(|x| match op {
                Cmp::Ge => x >= *v,
                Cmp::Le => x <= *v,
                Cmp::Gt => x > *v,
                Cmp::Lt => x < *v,
            })
        })
    }

    /// Is `a` better than `b`? Feasible runs beat infeasible ones; ties keep the earlier run.
    pub fn better(&self, a: &Value, b: &Value) -> bool {
        match (self.feasible(a), self.feasible(b)) {
            (true, false) => return true,
            (false, true) => return false,
            _ => {}
        }
        let (x, y) = (
            metric(a, &self.metric).unwrap_or(f64::NAN),
            metric(b, &self.metric).unwrap_or(f64::NAN),
        );
        if self.minimize { x < y } else { x > y }
    }
}

/// One replay of the sweep.
#[derive(Clone, Debug)]
pub struct Run {
    pub index: usize,
    pub weights: CostWeights,
    pub profile: PathBuf,
    pub summary: Value,
}

/// The columns of `sweep.csv` after the run number and the nine weights.
pub const METRICS: [&str; 15] = [
    "utilization",
    "mean_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "mean_bsld",
    "jain_index",
    "max_share_deviation",
    "fair_share_jain",
    "fair_share_dev_max",
    "fair_share_dev_mean",
    "tenant_bsld_jain",
    "slo_wait_compliance",
    "backfilled",
    "preemptions",
];

/// Replays every point on `threads` worker threads. Each run's profile is written to
/// `out/profiles/run-NNNN.yaml` first (the table refers to it; the best one is deployable as is).
/// With a `shard`, only that slice's points run.
#[allow(clippy::too_many_arguments)]
pub fn run(
    opts: &ReplayOptions,
    base_profile: &Path,
    vary: &[Vary],
    points: &[Vec<f64>],
    out: &Path,
    threads: usize,
    shard: Option<Shard>,
    progress: &(dyn Fn() + Sync),
) -> Result<Vec<Run>> {
    let text = std::fs::read_to_string(base_profile).with_context(|| format!("reading {}", base_profile.display()))?;
    let base = lattice_traces::parse_profile(&base_profile.display().to_string(), &text)?;
    let dir = out.join("profiles");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut jobs = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        if shard.is_some_and(|sh| !sh.holds(i)) {
            continue;
        }
        let per_vc: BTreeMap<String, CostWeights> = base
            .vclusters
            .iter()
            .map(|(name, vc)| (name.clone(), apply(&vc.weights, vary, p)))
            .collect();
        let yaml = lattice_traces::profile_with_weights(&base.source, &text, &per_vc)?;
        let path = dir.join(format!("run-{i:04}.yaml"));
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        let first = per_vc.values().next().copied().unwrap_or_default();
        jobs.push((i, path, first));
    }
    // One parsed trace for every point (read-only, shared by the workers): each point only resolves
    // its own profile's configurations.
    let Some((_, first, _)) = jobs.first() else {
        return Ok(Vec::new());
    };
    let mut o0 = opts.clone();
    o0.weights = Some(first.clone());
    let shared = replay::prepare(&o0)?;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Run>>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let slot = next.fetch_add(1, Ordering::Relaxed);
                    if slot >= jobs.len() {
                        break;
                    }
                    let (i, path, weights) = &jobs[slot];
                    let i = *i;
                    let mut o = opts.clone();
                    o.weights = Some(path.clone());
                    let r = shared
                        .for_profile(&o)
                        .and_then(|(mut config, notes)| {
                            // A point's summary is all the sweep keeps: no timeline, no records.
                            config.keep_timeline = false;
                            replay::run_streaming_with(&shared, &config, &notes, &mut |_, _| {}, &mut |_| {})
                        })
                        .and_then(|(r, _)| serde_json::to_value(&r.summary).map_err(anyhow::Error::from))
                        .map(|summary| Run {
                            index: i,
                            weights: *weights,
                            profile: path.clone(),
                            summary,
                        });
                    results.lock().expect("no worker panicked")[slot] = Some(r);
                    progress();
                }
            });
        }
    });
    results
        .into_inner()
        .expect("no worker panicked")
        .into_iter()
        .map(|r| r.expect("every point ran"))
        .collect()
}

/// The index of the best run under the objective.
pub fn best(runs: &[Run], objective: &Objective) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, r) in runs.iter().enumerate() {
        if best.is_none_or(|b| objective.better(&r.summary, &runs[b].summary)) {
            best = Some(i);
        }
    }
    best
}

/// Which runs lie on the Pareto front of utilization (higher is better) against p95 wait (lower is
/// better): no other run is at least as good on both and strictly better on one.
pub fn pareto(runs: &[Run]) -> Vec<bool> {
    let point = |r: &Run| {
        (
            metric(&r.summary, "utilization").unwrap_or(0.0),
            metric(&r.summary, "p95_wait").unwrap_or(f64::INFINITY),
        )
    };
    let pts: Vec<(f64, f64)> = runs.iter().map(point).collect();
    pts.iter()
        .map(|&(u, w)| !pts.iter().any(|&(u2, w2)| u2 >= u && w2 <= w && (u2 > u || w2 < w)))
        .collect()
}

/// One-at-a-time sensitivity: for each varied weight, the mean of `metric` over the runs at each of its
/// values (grid), or in each of 5 equal-width bins of its range (random search). Rows are
/// `(weight, value or bin centre, mean, runs)`, in weight then value order.
pub fn sensitivity(runs: &[Run], vary: &[Vary], metric_name: &str) -> Vec<(&'static str, f64, f64, usize)> {
    let mut rows = Vec::new();
    for v in vary {
        // Bucket key in millionths of a weight (exact for grid values).
        let mut buckets: BTreeMap<i64, (f64, usize)> = BTreeMap::new();
        for r in runs {
            let x = r.weights.as_array()[v.weight];
            let key = match v.step {
                Some(_) => (x * 1e6).round() as i64,
                None => {
                    let width = (v.hi - v.lo) / 5.0;
                    let bin = if width > 0.0 {
                        ((x - v.lo) / width).floor().clamp(0.0, 4.0)
                    } else {
                        0.0
                    };
                    ((v.lo + (bin + 0.5) * width) * 1e6).round() as i64
                }
            };
            if let Some(m) = metric(&r.summary, metric_name) {
                let e = buckets.entry(key).or_default();
                e.0 += m;
                e.1 += 1;
            }
        }
        for (key, (sum, n)) in buckets {
            rows.push((v.name(), key as f64 / 1e6, sum / n as f64, n));
        }
    }
    rows
}

/// `sweep.csv`: run, the nine weights, the metrics, feasible, pareto, profile.
pub fn table(runs: &[Run], objective: &Objective) -> String {
    let mut o = String::from("run");
    for n in CostWeights::NAMES {
        let _ = write!(o, ",{n}");
    }
    for m in METRICS {
        let _ = write!(o, ",{m}");
    }
    o.push_str(",feasible,pareto,profile\n");
    let front = pareto(runs);
    for (r, on_front) in runs.iter().zip(front) {
        let _ = write!(o, "{}", r.index);
        for x in r.weights.as_array() {
            let _ = write!(o, ",{x}");
        }
        for m in METRICS {
            let _ = write!(
                o,
                ",{}",
                metric(&r.summary, m).map(|x| x.to_string()).unwrap_or_default()
            );
        }
        let _ = writeln!(
            o,
            ",{},{},{}",
            objective.feasible(&r.summary),
            on_front,
            lattice_sim::metrics::csv_field(&r.profile.display().to_string())
        );
    }
    o
}

/// Rejects sweeps that would be empty or enormous.
pub fn check_points(points: &[Vec<f64>]) -> Result<()> {
    if points.is_empty() {
        bail!("the sweep has no points (give --vary NAME=LO:HI:STEP, or --random N)");
    }
    if points.len() > 10_000 {
        bail!(
            "the sweep has {} points; the limit is 10000 (coarser steps or --random N)",
            points.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vary_parses_and_grids() {
        let v = Vary::parse("fair_share=0.1:0.4:0.05").unwrap();
        assert_eq!(v.name(), "fair_share");
        assert_eq!(v.values(), vec![0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]);
        let t = Vary::parse("topology=0:0.2:0.1").unwrap();
        let g = grid(&[v.clone(), t]);
        assert_eq!(g.len(), 21);
        assert_eq!((g[0].clone(), g[20].clone()), (vec![0.1, 0.0], vec![0.4, 0.2]));
        assert!(Vary::parse("fairshare=0:1").unwrap_err().contains("not a weight"));
        assert!(
            Vary::parse("fair_share=0.4:0.1")
                .unwrap_err()
                .contains("LO is above HI")
        );
        assert!(Vary::parse("fair_share=0:1:0").unwrap_err().contains("STEP"));
    }

    #[test]
    fn random_points_are_seeded_and_in_bounds() {
        let v = [Vary::parse("fair_share=0.1:0.4").unwrap()];
        let (a, b, c) = (random(&v, 50, 7), random(&v, 50, 7), random(&v, 50, 8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|p| (0.1..=0.4).contains(&p[0])));
    }

    #[test]
    fn apply_renormalises_the_other_weights() {
        let base = CostWeights::default(); // sums to 1.0
        let v = [Vary::parse("fair_share=0:1").unwrap()];
        let w = apply(&base, &v, &[0.4]);
        assert_eq!(w.fair_share, 0.4);
        assert!((w.as_array().iter().sum::<f64>() - 1.0).abs() < 1e-5);
        // The others keep their proportions: priority = wait_time in the default.
        assert_eq!(w.priority, w.wait_time);
        assert!(w.priority < base.priority);
    }

    #[test]
    fn sensitivity_averages_per_value() {
        let v = [Vary::parse("fair_share=0.1:0.2:0.1").unwrap()];
        let run = |i: usize, fs: f64, w: f64| Run {
            index: i,
            weights: CostWeights {
                fair_share: fs,
                ..CostWeights::default()
            },
            profile: PathBuf::new(),
            summary: serde_json::json!({"p95_wait_s": w}),
        };
        let runs = [run(0, 0.1, 100.0), run(1, 0.1, 300.0), run(2, 0.2, 50.0)];
        assert_eq!(
            sensitivity(&runs, &v, "p95_wait"),
            vec![("fair_share", 0.1, 200.0, 2), ("fair_share", 0.2, 50.0, 1)]
        );
        // Random search: 5 bins over the range, labelled by their centres.
        let r = [Vary::parse("fair_share=0:1").unwrap()];
        let runs = [run(0, 0.05, 10.0), run(1, 0.15, 30.0), run(2, 0.95, 5.0)];
        assert_eq!(
            sensitivity(&runs, &r, "p95_wait"),
            vec![("fair_share", 0.1, 20.0, 2), ("fair_share", 0.9, 5.0, 1)]
        );
    }

    #[test]
    fn pareto_front_of_utilization_and_p95_wait() {
        let run = |i: usize, u: f64, w: f64| Run {
            index: i,
            weights: CostWeights::default(),
            profile: PathBuf::new(),
            summary: serde_json::json!({"utilization": u, "p95_wait_s": w}),
        };
        // (0.7, 100) and (0.8, 200) trade off; (0.6, 150) is dominated by the first; a duplicate of
        // a front point stays on the front.
        let runs = [
            run(0, 0.7, 100.0),
            run(1, 0.8, 200.0),
            run(2, 0.6, 150.0),
            run(3, 0.7, 100.0),
        ];
        assert_eq!(pareto(&runs), vec![true, true, false, true]);
    }

    #[test]
    fn objectives_parse_and_rank() {
        let o = Objective::parse("minimize p95_wait subject to jain >= 0.9 and utilization > 0.5").unwrap();
        assert!(o.minimize);
        assert_eq!(o.constraints.len(), 2);
        let run = |p95: f64, jain: f64| serde_json::json!({"p95_wait_s": p95, "jain_index": jain, "utilization": 0.7});
        assert!(o.feasible(&run(10.0, 0.95)));
        assert!(!o.feasible(&run(10.0, 0.85)));
        assert!(o.better(&run(10.0, 0.95), &run(5.0, 0.85)), "feasible first");
        assert!(o.better(&run(5.0, 0.95), &run(10.0, 0.95)));
        assert!(o.check_names(&run(1.0, 1.0)).is_ok());
        let bad = Objective::parse("minimize p96_wait").unwrap();
        assert!(bad.check_names(&run(1.0, 1.0)).unwrap_err().contains("p96_wait"));
        assert!(Objective::parse("lower p95").is_err());
        assert!(Objective::parse("minimize p95_wait given jain >= 0.9").is_err());
        assert!(Objective::parse("minimize p95_wait subject to jain => 0.9").is_err());
    }
}

/// `--shard K/N`: the K-th (0-based) of N deterministic slices of a sweep's points — point `i` is in
/// slice `i mod N`, so every slice gets a fair mix of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub fn parse(s: &str) -> Result<Shard, String> {
        let (k, n) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: expected K/N, e.g. 0/8 (the K-th of N slices, K from 0)"))?;
        let k: usize = k.trim().parse().map_err(|_| format!("`{s}`: K is not a number"))?;
        let n: usize = n.trim().parse().map_err(|_| format!("`{s}`: N is not a number"))?;
        if n == 0 || k >= n {
            return Err(format!("`{s}`: needs 0 <= K < N"));
        }
        Ok(Shard { index: k, count: n })
    }

    pub fn holds(&self, point: usize) -> bool {
        point % self.count == self.index
    }
}

/// What a shard writes (`DIR/shard.json`) for `rm-replay sweep merge`: the sweep it belongs to and
/// its runs with their whole summaries.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardFile {
    pub format: String,
    pub shard: usize,
    pub of: usize,
    /// Every point of the sweep (all slices), so a merge can check it has them all.
    pub points: usize,
    /// The sweep's definition: merging refuses shards of different sweeps.
    pub sweep: SweepSpec,
    pub runs: Vec<ShardRun>,
}

/// The flags that decide a sweep's points and its best run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepSpec {
    pub vary: Vec<String>,
    pub random: Option<usize>,
    pub seed: u64,
    pub objective: String,
    pub base_profile: String,
    pub trace: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardRun {
    pub index: usize,
    pub weights: [f64; 9],
    /// The run's profile file, relative to the shard's folder.
    pub profile: String,
    pub summary: Value,
}

pub const SHARD_FORMAT: &str = "lattice-sweep-shard/1";

/// Writes `out/shard.json` for the runs of one slice.
pub fn write_shard(out: &Path, shard: Shard, points: usize, spec: &SweepSpec, runs: &[Run]) -> Result<PathBuf> {
    let file = ShardFile {
        format: SHARD_FORMAT.into(),
        shard: shard.index,
        of: shard.count,
        points,
        sweep: spec.clone(),
        runs: runs
            .iter()
            .map(|r| ShardRun {
                index: r.index,
                weights: r.weights.as_array(),
                profile: r.profile.strip_prefix(out).unwrap_or(&r.profile).display().to_string(),
                summary: r.summary.clone(),
            })
            .collect(),
    };
    let path = out.join("shard.json");
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Reads the shards in `dirs` (each holding a `shard.json`), checks they are the slices of one sweep
/// with every point exactly once, copies their profiles into `out/profiles/` and returns the runs in
/// point order (their profiles named in `out`), the sweep's definition and its point count.
pub fn merge_shards(dirs: &[PathBuf], out: &Path) -> Result<(Vec<Run>, SweepSpec)> {
    if dirs.is_empty() {
        bail!("sweep merge: name the shard folders (each holds a shard.json)");
    }
    let mut spec: Option<(SweepSpec, usize, usize)> = None;
    let mut runs: BTreeMap<usize, Run> = BTreeMap::new();
    let mut seen_shards = std::collections::BTreeSet::new();
    let dest = out.join("profiles");
    let mut copies: Vec<(PathBuf, PathBuf)> = Vec::new();
    for dir in dirs {
        let path = dir.join("shard.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let f: ShardFile =
            serde_json::from_str(&text).with_context(|| format!("{}: not a sweep shard", path.display()))?;
        if f.format != SHARD_FORMAT {
            bail!("{}: format `{}`, expected `{SHARD_FORMAT}`", path.display(), f.format);
        }
        match &spec {
            None => spec = Some((f.sweep.clone(), f.of, f.points)),
            Some((s, of, points)) => {
                if *s != f.sweep || *of != f.of || *points != f.points {
                    bail!(
                        "{}: shard of another sweep ({} slices of {} points, {:?}) than the first ({} slices of {} points, {:?})",
                        path.display(),
                        f.of,
                        f.points,
                        f.sweep,
                        of,
                        points,
                        s
                    );
                }
            }
        }
        if !seen_shards.insert(f.shard) {
            bail!("{}: shard {}/{} is given twice", path.display(), f.shard, f.of);
        }
        let shard = Shard {
            index: f.shard,
            count: f.of,
        };
        for r in f.runs {
            if !shard.holds(r.index) || r.index >= f.points {
                bail!(
                    "{}: run {} does not belong to shard {}/{}",
                    path.display(),
                    r.index,
                    f.shard,
                    f.of
                );
            }
            let src = dir.join(&r.profile);
            let name = src
                .file_name()
                .with_context(|| format!("{}: run {} names no profile file", path.display(), r.index))?;
            if !src.is_file() {
                bail!(
                    "{}: run {}'s profile {} is missing",
                    path.display(),
                    r.index,
                    src.display()
                );
            }
            let to = dest.join(name);
            copies.push((src, to.clone()));
            runs.insert(
                r.index,
                Run {
                    index: r.index,
                    weights: CostWeights::from_array(r.weights),
                    profile: to,
                    summary: r.summary,
                },
            );
        }
    }
    let (spec, of, points) = spec.expect("at least one shard was read");
    let missing: Vec<usize> = (0..of).filter(|k| !seen_shards.contains(k)).collect();
    if !missing.is_empty() {
        bail!("sweep merge: shards {missing:?} of {of} are missing");
    }
    if runs.len() != points {
        let absent: Vec<usize> = (0..points).filter(|i| !runs.contains_key(i)).take(10).collect();
        bail!(
            "sweep merge: {} of {points} runs present; missing runs {absent:?}",
            runs.len()
        );
    }
    // Only a complete, consistent set of shards writes anything.
    std::fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
    for (src, to) in copies {
        std::fs::copy(&src, &to).with_context(|| format!("copying {} to {}", src.display(), to.display()))?;
    }
    Ok((runs.into_values().collect(), spec))
}
