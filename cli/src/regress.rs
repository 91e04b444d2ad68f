//! `rm-replay regress`: the regression suite (book: "Testing Strategy", level 3). A manifest
//! (`traces/library/manifest.yaml`) names each trace with its profile, inventory, tenants and pass/fail
//! thresholds; every entry is replayed (on all cores, each replay deterministic), every threshold is
//! checked, and the result is a table, a JSON file and the exit status.
//!
//! A threshold is `METRIC OP VALUE` (`>`, `>=`, `<`, `<=`, `==`) or `METRIC ~ VALUE ± TOL` (`TOL` absolute,
//! or relative with `%`; `+-` also works) — the form that pins a real trace's current behaviour. Values
//! may be durations (`4h`) for `_s` metrics. Metrics are `summary.json` keys (with the sweep's aliases
//! `p95_wait`, `jain`, ...) plus `ramp_up_s`: the time from the first submission until 90 % of the nodes
//! are busy.

use crate::replay::{self, ReplayOptions};
use anyhow::{Context, Result, bail};
use lattice_sim::SimResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub traces: Vec<Entry>,
}

/// One trace of the suite. Paths are relative to the manifest's folder (or absolute).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub trace: PathBuf,
    /// `swf`/`jsonl` (by extension, the default) or `alibaba` (a pod list CSV; `inventory` is then the
    /// node list CSV).
    pub format: Option<String>,
    pub weights: Option<PathBuf>,
    pub vcluster: Option<String>,
    pub inventory: Option<PathBuf>,
    pub tenants: Option<PathBuf>,
    pub policy: Option<String>,
    pub procs_per_node: Option<u32>,
    /// Stop the replay at this virtual time (e.g. `4d`).
    pub horizon: Option<String>,
    #[serde(default)]
    pub seed: u64,
    pub thresholds: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    /// Within a tolerance of a pinned value.
    Near,
}

/// A parsed threshold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Threshold {
    pub metric: String,
    pub op: Op,
    pub value: f64,
    /// For `~`: the allowed absolute difference.
    pub tolerance: f64,
    pub text: String,
}

fn number(s: &str, metric: &str) -> Result<f64, String> {
    if let Ok(v) = s.parse::<f64>() {
        return Ok(v);
    }
    if (metric.ends_with("_s") || metric.contains("wait") || metric.contains("ramp"))
        && let Ok(d) = lattice_traces::parse_duration(s)
    {
        return Ok(d.as_secs_f64());
    }
    Err(format!("`{s}` is not a number (or a duration for a seconds metric)"))
}

impl Threshold {
    pub fn parse(text: &str) -> Result<Threshold, String> {
        let t = text.replace('±', " +- ");
        let words: Vec<&str> = t.split_whitespace().collect();
        let fail = |m: String| format!("threshold `{text}`: {m}");
        match words[..] {
            [metric, "~", value, "+-", tol] => {
                let value = number(value, metric).map_err(fail)?;
                let tolerance = match tol.strip_suffix('%') {
                    Some(p) => {
                        p.parse::<f64>()
                            .map_err(|_| fail(format!("`{tol}` is not a percentage")))?
                            / 100.0
                            * value.abs()
                    }
                    None => number(tol, metric).map_err(fail)?,
                };
                Ok(Threshold {
                    metric: metric.to_string(),
                    op: Op::Near,
                    value,
                    tolerance,
                    text: text.to_string(),
                })
            }
            [metric, op, value] => {
                let op = match op {
                    ">" => Op::Gt,
                    ">=" => Op::Ge,
                    "<" => Op::Lt,
                    "<=" => Op::Le,
                    "==" => Op::Eq,
                    o => return Err(fail(format!("`{o}` is not one of >, >=, <, <=, ==, ~"))),
                };
                Ok(Threshold {
                    metric: metric.to_string(),
                    op,
                    value: number(value, metric).map_err(fail)?,
                    tolerance: 0.0,
                    text: text.to_string(),
                })
            }
            _ => Err(fail("expected `METRIC OP VALUE` or `METRIC ~ VALUE ± TOL`".into())),
        }
    }

    pub fn holds(&self, x: f64) -> bool {
        match self.op {
            Op::Gt => x > self.value,
            Op::Ge => x >= self.value,
            Op::Lt => x < self.value,
            Op::Le => x <= self.value,
            Op::Eq => x == self.value,
            Op::Near => (x - self.value).abs() <= self.tolerance,
        }
    }
}

/// Time from the first submission until at least 90 % of `nodes` were busy at once (the makespan when
/// that never happened).
pub fn ramp_up_s(r: &SimResult) -> f64 {
    let mut ev: Vec<(f64, i64)> = Vec::new();
    for j in &r.jobs {
        if let Some(s) = j.start_s {
            ev.push((s, j.nodes as i64));
            if let Some(e) = j.end_s {
                ev.push((e, -(j.nodes as i64)));
            }
        }
    }
    // Ends before starts at the same time.
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let first = r.summary.first_submit_s;
    let need = (0.9 * r.summary.nodes as f64).ceil() as i64;
    let mut busy = 0i64;
    for (t, d) in ev {
        busy += d;
        if busy >= need {
            return t - first;
        }
    }
    r.summary.makespan_s
}

/// A metric of a replay: a `summary.json` key (or a sweep alias), or `ramp_up_s`.
pub fn metric(r: &SimResult, summary: &Value, name: &str) -> Option<f64> {
    match name {
        "ramp_up_s" | "ramp_up" => Some(ramp_up_s(r)),
        n => crate::sweep::metric(summary, n),
    }
}

/// One threshold's outcome.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Check {
    pub trace: String,
    pub metric: String,
    pub threshold: String,
    pub value: Option<f64>,
    pub pass: bool,
}

/// One trace's outcome.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TraceResult {
    pub name: String,
    pub description: String,
    pub jobs: u64,
    pub wall_s: f64,
    pub error: Option<String>,
    pub checks: Vec<Check>,
}

impl TraceResult {
    pub fn pass(&self) -> bool {
        self.error.is_none() && self.checks.iter().all(|c| c.pass)
    }
}

pub fn read_manifest(path: &Path) -> Result<Manifest> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let m: Manifest = yaml_serde::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for e in &m.traces {
        for t in &e.thresholds {
            Threshold::parse(t).map_err(|msg| anyhow::anyhow!("{}: trace `{}`: {msg}", path.display(), e.name))?;
        }
        if e.thresholds.is_empty() {
            bail!("{}: trace `{}` has no thresholds", path.display(), e.name);
        }
    }
    Ok(m)
}

/// The replay options of an entry; `scratch` receives converted inputs (an imported Alibaba trace).
fn options(e: &Entry, dir: &Path, scratch: &Path) -> Result<ReplayOptions> {
    let p = |x: &Option<PathBuf>| x.as_ref().map(|x| dir.join(x));
    let mut trace = Some(dir.join(&e.trace));
    let inventory = p(&e.inventory);
    match e.format.as_deref() {
        None | Some("swf") | Some("jsonl") => {}
        Some("alibaba") => {
            // The pod list is imported to JSONL on the fly; the node list CSV is the inventory.
            if inventory.is_none() {
                bail!(
                    "trace `{}`: format alibaba needs `inventory` (the node list CSV)",
                    e.name
                );
            }
            let imported = lattice_traces::import::alibaba_file(&dir.join(&e.trace))?;
            std::fs::create_dir_all(scratch)?;
            let t = scratch.join(format!("{}.jsonl", e.name));
            std::fs::write(&t, &imported.jsonl)?;
            trace = Some(t);
        }
        Some(other) => bail!("trace `{}`: unknown format `{other}` (swf, jsonl, alibaba)", e.name),
    }
    Ok(ReplayOptions {
        trace,
        inventory,
        procs_per_node: e.procs_per_node.unwrap_or(1),
        policy: e.policy.clone(),
        depth: None,
        compat: None,
        weights: p(&e.weights),
        vcluster: e.vcluster.clone(),
        seed: e.seed,
        commit_latency_ms: 0,
        tenant_field: lattice_traces::TenantField::User,
        vcluster_by_queue: false,
        check_invariants: false,
        horizon: e
            .horizon
            .as_deref()
            .map(|h| lattice_traces::parse_duration(h).map(|d| lattice_engine::Time::ZERO + d))
            .transpose()
            .map_err(|m| anyhow::anyhow!("trace `{}`: horizon: {m}", e.name))?,
        fairshare_half_life: None,
        tenants: p(&e.tenants),
        mtbf: None,
        repair: None,
        walltime_grace: None,
        hardened_boot: None,
        vni_pool: None,
        mirror_latency: None,
        slo_wait: Vec::new(),
    })
}

/// Replays one entry and checks its thresholds.
pub fn run_entry(e: &Entry, dir: &Path, scratch: &Path) -> TraceResult {
    let started = std::time::Instant::now();
    let mut out = TraceResult {
        name: e.name.clone(),
        description: e.description.clone(),
        jobs: 0,
        wall_s: 0.0,
        error: None,
        checks: Vec::new(),
    };
    let result = options(e, dir, scratch)
        .and_then(|o| replay::prepare(&o))
        .and_then(|p| replay::run(&p, &mut |_, _| {}));
    out.wall_s = started.elapsed().as_secs_f64();
    let r = match result {
        Ok(r) => r,
        Err(err) => {
            // The chain, without causes their context already quotes.
            let mut text = err.to_string();
            for cause in err.chain().skip(1) {
                let c = cause.to_string();
                if !text.contains(&c) {
                    text = format!("{text}: {c}");
                }
            }
            out.error = Some(text);
            return out;
        }
    };
    out.jobs = r.summary.jobs;
    let summary = serde_json::to_value(&r.summary).unwrap_or(Value::Null);
    for text in &e.thresholds {
        let t = Threshold::parse(text).expect("validated with the manifest");
        let value = metric(&r, &summary, &t.metric);
        out.checks.push(Check {
            trace: e.name.clone(),
            metric: t.metric.clone(),
            threshold: t.text.clone(),
            value,
            pass: value.is_some_and(|v| t.holds(v)),
        });
    }
    out
}

/// Runs every entry (those named in `only`, when given) on `threads` threads; results in manifest order.
pub fn run(manifest: &Path, only: &[String], threads: usize) -> Result<Vec<TraceResult>> {
    run_shard(manifest, only, threads, None).map(|(r, _, _)| r)
}

/// [`run`] for the `shard` slice of the entries (entry `i` of the selected ones is in slice
/// `i mod N`): its results, their positions among the selected entries, and how many there are.
pub fn run_shard(
    manifest: &Path,
    only: &[String],
    threads: usize,
    shard: Option<crate::sweep::Shard>,
) -> Result<(Vec<TraceResult>, Vec<usize>, usize)> {
    let m = read_manifest(manifest)?;
    let dir = manifest.parent().unwrap_or(Path::new(".")).to_path_buf();
    for o in only {
        if !m.traces.iter().any(|e| &e.name == o) {
            bail!("--only {o}: no such trace in {}", manifest.display());
        }
    }
    let selected: Vec<Entry> = m
        .traces
        .into_iter()
        .filter(|e| only.is_empty() || only.contains(&e.name))
        .collect();
    let total = selected.len();
    let (positions, entries): (Vec<usize>, Vec<Entry>) = selected
        .into_iter()
        .enumerate()
        .filter(|(i, _)| shard.is_none_or(|sh| sh.holds(*i)))
        .unzip();
    let scratch = std::env::temp_dir().join(format!("lattice-regress-{}", std::process::id()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, entries.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(e) = entries.get(i) else { break };
                    let r = run_entry(e, &dir, &scratch);
                    results.lock().expect("no panics while held").push((i, r));
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let mut results = results.into_inner().expect("threads joined");
    results.sort_by_key(|r| r.0);
    Ok((results.into_iter().map(|r| r.1).collect(), positions, total))
}

/// What `regress --shard K/N` writes as its JSON: the slice's results with their positions.
#[derive(Debug, Serialize, Deserialize)]
pub struct ShardResult {
    pub manifest: String,
    pub only: Vec<String>,
    pub shard: usize,
    pub of: usize,
    pub entries: usize,
    pub positions: Vec<usize>,
    pub traces: Vec<TraceResult>,
}

/// Combines the JSON files of every slice of one sharded regression run into the results in
/// manifest order (refusing slices of other runs, missing or repeated slices).
pub fn merge(files: &[std::path::PathBuf]) -> Result<(String, Vec<TraceResult>)> {
    if files.is_empty() {
        bail!("regress merge: name the shards' JSON files");
    }
    let mut first: Option<(String, Vec<String>, usize, usize)> = None;
    let mut seen = std::collections::BTreeSet::new();
    let mut out: std::collections::BTreeMap<usize, TraceResult> = std::collections::BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let s: ShardResult =
            serde_json::from_str(&text).with_context(|| format!("{}: not a regress shard's JSON", f.display()))?;
        let key = (s.manifest.clone(), s.only.clone(), s.of, s.entries);
        match &first {
            None => first = Some(key),
            Some(k) if *k != key => bail!("{}: a shard of another run ({key:?}, not {k:?})", f.display()),
            Some(_) => {}
        }
        if !seen.insert(s.shard) {
            bail!("{}: shard {}/{} is given twice", f.display(), s.shard, s.of);
        }
        if s.positions.len() != s.traces.len() {
            bail!(
                "{}: {} positions for {} results",
                f.display(),
                s.positions.len(),
                s.traces.len()
            );
        }
        for (p, r) in s.positions.into_iter().zip(s.traces) {
            if p % s.of != s.shard || p >= s.entries || out.insert(p, r).is_some() {
                bail!(
                    "{}: entry {p} does not belong to shard {}/{}",
                    f.display(),
                    s.shard,
                    s.of
                );
            }
        }
    }
    let (manifest, _, of, entries) = first.expect("one file read");
    let missing: Vec<usize> = (0..of).filter(|k| !seen.contains(k)).collect();
    if !missing.is_empty() {
        bail!("regress merge: shards {missing:?} of {of} are missing");
    }
    if out.len() != entries {
        bail!("regress merge: {} of {entries} entries present", out.len());
    }
    Ok((manifest, out.into_values().collect()))
}

/// The pass/fail table.
pub fn table(results: &[TraceResult]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<20} {:<28} {:<36} {:>14}  result",
        "trace", "metric", "threshold", "value"
    );
    for r in results {
        if let Some(e) = &r.error {
            let _ = writeln!(o, "{:<20} {:<28} {:<36} {:>14}  FAIL: {e}", r.name, "-", "-", "-");
            continue;
        }
        for c in &r.checks {
            let v = c.value.map_or("missing".to_string(), |v| format!("{v:.4}"));
            let _ = writeln!(
                o,
                "{:<20} {:<28} {:<36} {:>14}  {}",
                r.name,
                c.metric,
                c.threshold,
                v,
                if c.pass { "pass" } else { "FAIL" }
            );
        }
    }
    let checks: usize = results.iter().map(|r| r.checks.len()).sum();
    let failed: usize = results
        .iter()
        .map(|r| r.checks.iter().filter(|c| !c.pass).count() + r.error.is_some() as usize)
        .sum();
    let _ = writeln!(o, "{} traces, {checks} checks, {failed} failed", results.len());
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_and_hold() {
        let t = Threshold::parse("utilization > 0.85").unwrap();
        assert_eq!((t.op, t.value), (Op::Gt, 0.85));
        assert!(t.holds(0.86) && !t.holds(0.85));
        let t = Threshold::parse("p99_wait_s < 4h").unwrap();
        assert_eq!(t.value, 14400.0);
        let t = Threshold::parse("mean_bsld ~ 50 ± 2%").unwrap();
        assert_eq!((t.op, t.tolerance), (Op::Near, 1.0));
        assert!(t.holds(50.9) && t.holds(49.0) && !t.holds(51.2));
        let t = Threshold::parse("utilization ~ 0.7 +- 0.01").unwrap();
        assert!(t.holds(0.709) && !t.holds(0.72));
        assert!(Threshold::parse("sensitive_wait_max_s == 0").unwrap().holds(0.0));
        for bad in ["utilization", "utilization => 1", "utilization > x", "a ~ 1 +- y%"] {
            assert!(Threshold::parse(bad).is_err(), "{bad}");
        }
    }
}
