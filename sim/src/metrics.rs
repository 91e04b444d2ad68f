//! Metrics with the exact definitions of DESIGN.md §3:
//!
//! - wait = start − submit; percentiles are nearest-rank (`p`-th = the `ceil(p/100·n)`-th smallest).
//! - bounded slowdown = max(1, (wait + run) / max(run, 10 s)), over allocations that ended.
//! - utilization = Σ(nodes × run) / (total nodes × (last end − first submit)); `run` is the time the
//!   allocation held its nodes, summed over its runs (suspended time between runs does not count).
//! - makespan = last end − first submit; throughput = ended allocations per hour of makespan.
//! - backfilled = allocations started ahead of an earlier-queued allocation that still waited.

use crate::facts::{self, JobFacts, JobFields};
use lattice_engine::AllocState;
use lattice_engine::Duration;
use serde::Serialize;
use std::collections::BTreeMap;

/// Bounded-slowdown threshold τ.
pub const BSLD_TAU: Duration = Duration(10_000);

/// One replayed allocation (a row of `jobs.csv`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobRecord {
    pub id: String,
    pub submit_s: f64,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub nodes: u32,
    pub wait_s: Option<f64>,
    pub bsld: Option<f64>,
    pub backfilled: bool,
    /// Tenant and vCluster names, shared by every record that names them.
    pub tenant: std::sync::Arc<str>,
    pub vcluster: std::sync::Arc<str>,
    pub state: &'static str,
    pub reason: &'static str,
    /// GPUs held (Σ gpu_count over its nodes).
    pub gpus: u32,
    /// Dragonfly groups its nodes span.
    pub groups: Option<u32>,
    /// Conformance fitness of the placement: largest same-fingerprint share of its nodes.
    pub conformance: Option<f64>,
    /// Preemption (priority) class.
    pub class: u8,
    /// Score when it started (score-ordered vClusters).
    pub score: Option<f64>,
    /// Times it was preempted.
    pub preempted: u32,
    /// Nodes it holds outside its vCluster's home pool (borrowed).
    pub borrowed: u32,
    /// Time it held nodes, summed over its runs (a preempted allocation waits suspended between runs),
    /// when it ended; the `run` of the node-time metrics.
    pub run_s: Option<f64>,
}

impl JobRecord {
    /// The columns of `jobs.csv`, in the order [`JobRecord::csv_row`] writes them.
    pub const CSV_COLUMNS: [&'static str; 17] = [
        "id",
        "submit_s",
        "start_s",
        "end_s",
        "nodes",
        "wait_s",
        "bsld",
        "backfilled",
        "tenant",
        "vcluster",
        "state",
        "reason",
        "groups",
        "conformance",
        "class",
        "score",
        "preempted",
    ];

    /// The header line of `jobs.csv` (every column a row carries, no newline).
    pub fn csv_header() -> String {
        Self::CSV_COLUMNS.join(",")
    }

    pub fn csv_row(&self, out: &mut String) {
        use std::fmt::Write;
        let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&self.id),
            self.submit_s,
            opt(self.start_s),
            opt(self.end_s),
            self.nodes,
            opt(self.wait_s),
            opt(self.bsld.map(round6)),
            self.backfilled,
            csv_field(&self.tenant),
            csv_field(&self.vcluster),
            self.state,
            self.reason,
            self.groups.map(|g| g.to_string()).unwrap_or_default(),
            opt(self.conformance),
            self.class,
            opt(self.score),
            self.preempted
        );
    }
}

impl JobFields for JobRecord {
    fn submit_s(&self) -> f64 {
        self.submit_s
    }
    fn start_s(&self) -> Option<f64> {
        self.start_s
    }
    fn end_s(&self) -> Option<f64> {
        self.end_s
    }
    fn wait_s(&self) -> Option<f64> {
        self.wait_s
    }
    fn bsld(&self) -> Option<f64> {
        self.bsld
    }
    fn run_s(&self) -> Option<f64> {
        self.run_s
    }
    fn nodes(&self) -> u32 {
        self.nodes
    }
    fn gpus(&self) -> u32 {
        self.gpus
    }
    fn borrowed(&self) -> u32 {
        self.borrowed
    }
    fn groups(&self) -> Option<u32> {
        self.groups
    }
    fn conformance(&self) -> Option<f64> {
        self.conformance
    }
    fn class(&self) -> u8 {
        self.class
    }
    fn backfilled(&self) -> bool {
        self.backfilled
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn vcluster(&self) -> &str {
        &self.vcluster
    }
    fn state(&self) -> &'static str {
        self.state
    }
}

/// Every allocation state, to read a record's state name back.
const STATES: [AllocState; 7] = [
    AllocState::Pending,
    AllocState::Staging,
    AllocState::Running,
    AllocState::Completed,
    AllocState::Failed,
    AllocState::Cancelled,
    AllocState::Suspended,
];

impl From<&JobRecord> for JobFacts {
    fn from(r: &JobRecord) -> JobFacts {
        JobFacts {
            submit_s: r.submit_s,
            start_s: facts::pack(r.start_s),
            end_s: facts::pack(r.end_s),
            wait_s: facts::pack(r.wait_s),
            bsld: facts::pack(r.bsld),
            run_s: facts::pack(r.run_s),
            conformance: facts::pack(r.conformance),
            tenant: r.tenant.clone(),
            vcluster: r.vcluster.clone(),
            nodes: r.nodes,
            gpus: r.gpus,
            borrowed: r.borrowed,
            groups: r.groups.unwrap_or(u32::MAX),
            class: r.class,
            backfilled: r.backfilled,
            state: STATES
                .into_iter()
                .find(|s| s.as_str() == r.state)
                .expect("a record's state is an allocation state"),
        }
    }
}

/// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Rounds to 6 decimals so printed floats stay short; deterministic.
pub fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Metrics of a set of allocations (the whole run, one tenant or one vCluster).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GroupMetrics {
    pub jobs: u64,
    pub started: u64,
    pub mean_wait_s: f64,
    pub p50_wait_s: f64,
    pub p95_wait_s: f64,
    pub p99_wait_s: f64,
    pub max_wait_s: f64,
    pub mean_bsld: f64,
    pub p95_bsld: f64,
    pub utilization: f64,
    pub node_hours: f64,
    pub gpu_hours: f64,
    pub backfilled: u64,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Computes [`GroupMetrics`] over `jobs`; `capacity_node_s` = total nodes × span, for utilization.
pub fn group_metrics<'a, R: JobFields + 'a>(jobs: impl Iterator<Item = &'a R>, capacity_node_s: f64) -> GroupMetrics {
    let mut m = GroupMetrics::default();
    let mut waits = Vec::new();
    let mut bslds = Vec::new();
    let mut node_s = 0.0;
    let mut gpu_s = 0.0;
    for j in jobs {
        m.jobs += 1;
        m.backfilled += j.backfilled() as u64;
        if let Some(w) = j.wait_s() {
            waits.push(w);
        }
        if let Some(b) = j.bsld() {
            bslds.push(b);
        }
        if let Some(run) = j.run_s() {
            node_s += j.nodes() as f64 * run;
            gpu_s += j.gpus() as f64 * run;
        }
    }
    m.started = waits.len() as u64;
    waits.sort_by(f64::total_cmp);
    bslds.sort_by(f64::total_cmp);
    if !waits.is_empty() {
        m.mean_wait_s = round6(waits.iter().sum::<f64>() / waits.len() as f64);
        m.p50_wait_s = percentile(&waits, 50.0);
        m.p95_wait_s = percentile(&waits, 95.0);
        m.p99_wait_s = percentile(&waits, 99.0);
        m.max_wait_s = *waits.last().expect("non-empty");
    }
    if !bslds.is_empty() {
        m.mean_bsld = round6(bslds.iter().sum::<f64>() / bslds.len() as f64);
        m.p95_bsld = round6(percentile(&bslds, 95.0));
    }
    if capacity_node_s > 0.0 {
        m.utilization = round6(node_s / capacity_node_s);
    }
    m.node_hours = round6(node_s / 3600.0);
    m.gpu_hours = round6(gpu_s / 3600.0);
    m
}

/// bounded slowdown = max(1, (wait + run) / max(run, τ)).
pub fn bounded_slowdown(wait: Duration, run: Duration) -> f64 {
    let denom = run.max(BSLD_TAU).as_secs_f64();
    ((wait.as_secs_f64() + run.as_secs_f64()) / denom).max(1.0)
}

/// `summary.json`: the output contract of DESIGN.md §3 (keys are stable once landed).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub trace: String,
    pub jobs: u64,
    pub skipped: BTreeMap<String, u64>,
    pub policy: String,
    pub seed: u64,
    /// Nodes at the end of the replay (the inventory's and those that joined).
    pub nodes: u32,
    /// Nodes that joined during the replay (`node_added` events); utilization counts each from when
    /// it joined.
    pub nodes_added: u64,
    pub mean_wait_s: f64,
    pub p50_wait_s: f64,
    pub p95_wait_s: f64,
    pub p99_wait_s: f64,
    pub max_wait_s: f64,
    pub mean_bsld: f64,
    pub p95_bsld: f64,
    pub utilization: f64,
    pub makespan_s: f64,
    pub backfilled: u64,
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    pub walltime_kills: u64,
    pub unfinished: u64,
    pub mean_turnaround_s: f64,
    pub throughput_jobs_per_h: f64,
    pub node_hours: f64,
    pub gpu_hours: f64,
    pub first_submit_s: f64,
    pub last_end_s: f64,
    /// Scheduling passes the engine ran (cycles).
    pub passes: u64,
    pub quorum_commits: u64,
    pub quorum_rejections: u64,
    /// Quorum rejections by reason (`node_conflict`, `max_nodes`, `max_concurrent_allocations`,
    /// `sensitive_pool_size`) and the first messages, worded as users see them.
    pub quota_rejections: BTreeMap<String, u64>,
    pub rejection_examples: Vec<String>,
    /// Preemptions issued, by reason (`priority`, `reclaim`, `sensitive`).
    pub preemptions: u64,
    /// Node-hours run on nodes borrowed from other vClusters.
    pub borrowed_node_hours: f64,
    pub preemptions_by_reason: BTreeMap<String, u64>,
    /// Victims killed because their checkpoint did not finish within the (extended) timeout.
    pub preemption_kills: u64,
    /// Checkpoints completed / attempted, by the broker and during preemptions (1 when none was).
    pub checkpoint_success_rate: f64,
    /// Checkpoint hints the broker issued (Value > Cost).
    pub checkpoint_hints: u64,
    /// Broker checkpoints that completed, and preemptions whose victim stopped with a checkpoint: a run
    /// that is lost or requeued later resumes from the last of these.
    pub broker_checkpoints: u64,
    pub preemption_checkpoints: u64,
    /// Data staging: allocations pre-staged, queue time staging used (wait saved), I/O stalls of starts
    /// above 80 % staged, stagings that exhausted their retries.
    pub staged_allocations: u64,
    pub staging_overlap_s: f64,
    pub staging_stall_s: f64,
    pub staging_alerts: u64,
    /// Reactive scaling: scale-ups, scale-downs, scale-ups that quota/capacity made no-ops, oscillation
    /// alerts; services (unbounded/reactive) and their mean availability until the trace end.
    pub scale_ups: u64,
    pub scale_downs: u64,
    pub scale_blocked: u64,
    /// Evaluations of a reactive allocation without a fresh metric (nothing was decided for it;
    /// production counts them in `lattice_autoscaling_metric_query_failures_total`).
    pub scale_metric_unavailable: u64,
    pub oscillation_alerts: u64,
    pub services: u64,
    pub service_availability: f64,
    /// Per DAG: state, makespan, critical path and stretch; their mean stretch.
    pub dags: BTreeMap<String, DagMetrics>,
    pub mean_dag_stretch: f64,
    /// Per task group: elements, completions, throughput.
    pub task_groups: BTreeMap<String, TaskGroupMetrics>,
    /// Nodes that went Down (trace events and injected), injected failures, node-hours of work lost,
    /// and requeues after failures.
    pub node_failures: u64,
    pub injected_failures: u64,
    pub lost_node_hours: f64,
    pub requeues: u64,
    /// Prologue failures reported by node agents (each retried on other nodes, up to the limit).
    pub prologue_failures: u64,
    /// Energy used by allocations (node power × time) and its cost under the price series.
    pub energy_kwh: f64,
    pub energy_cost: f64,
    /// Suspended allocations that re-entered the queue.
    pub suspended_requeues: u64,
    /// Sensitive claims, their longest wait (0 when the pool has capacity), secure wipes, nodes
    /// quarantined after a failed wipe, and the audit log's size and chain check.
    pub sensitive_claims: u64,
    pub sensitive_wait_max_s: f64,
    pub wipes: u64,
    pub quarantined_nodes: u64,
    /// Conformance drifts (trace `drift` events that drained a node) and drifted nodes taken Down
    /// for not being remediated within the drift remediation timeout (24 h; 4 h sensitive).
    pub drifts: u64,
    pub drift_timeouts: u64,
    /// Nodes booted into the hardened image for sensitive claims, and hardened boots that failed or
    /// timed out (the node Down, its claim failed).
    pub hardened_boots: u64,
    pub boot_failures: u64,
    /// Starts refused because their network domain needed a VNI the pool had not (only when
    /// network domains are modelled).
    #[serde(skip_serializing_if = "is_zero")]
    pub vni_refusals: u64,
    /// Sensitive claims refused because their pool could not give them the nodes at once (claims
    /// never queue).
    #[serde(skip_serializing_if = "is_zero")]
    pub claims_refused: u64,
    /// Nodes quarantined because their wipe was not confirmed within the wipe timeout (only with one).
    #[serde(skip_serializing_if = "is_zero")]
    pub wipe_timeouts: u64,
    /// Victims whose preemption the fake agents did not report in time (lost reports modelled):
    /// taken as stopped without a checkpoint.
    #[serde(skip_serializing_if = "is_zero")]
    pub preemption_report_timeouts: u64,
    /// Starts held because their submission, or a dependency's end, was not yet on a majority of
    /// the quorum members' disks (only when the mirrors are modelled).
    #[serde(skip_serializing_if = "is_zero")]
    pub durability_holds: u64,
    pub audit_entries: u64,
    pub audit_chain_valid: bool,
    /// Mean dragonfly groups spanned per started allocation, and the fraction placed in one group.
    pub mean_group_span: f64,
    pub single_group_fraction: f64,
    /// Mean conformance fitness of placements (largest same-fingerprint share of an allocation's nodes).
    pub mean_conformance_fitness: f64,
    /// Jain's index over tenants of actual share / target share (configured targets, the rest equal),
    /// and max |actual − target|, over the whole run ...
    pub jain_index: f64,
    pub max_share_deviation: f64,
    /// ... and per `fairness_window_s` window: mean Jain index, worst and mean max deviation.
    pub fairness_window_s: f64,
    pub jain_index_windowed: f64,
    pub max_share_deviation_windowed: f64,
    pub mean_share_deviation_windowed: f64,
    /// Demand-aware fairness ([`demand_fairness`]): windows with contention, Jain's index of
    /// delivered / fair share, largest and mean |delivered − fair| share (weighted by waiting work).
    pub fair_share_windows: u64,
    pub fair_share_jain: f64,
    pub fair_share_dev_max: f64,
    pub fair_share_dev_mean: f64,
    /// Service fairness ([`service_fairness`]): Jain's index of per-tenant mean bounded slowdowns,
    /// worst over median tenant mean slowdown, worst minus median tenant p95 wait (s).
    pub tenant_bsld_jain: f64,
    pub tenant_bsld_worst_to_median: f64,
    pub tenant_p95_wait_spread_s: f64,
    /// SLO compliance ([`slo_compliance`]): the fraction of allocations whose wait met their class's
    /// target, overall and per class (`"0"`..`"10"`).
    pub slo_wait_compliance: f64,
    pub slo_wait_compliance_by_class: BTreeMap<String, f64>,
    /// Real CPU time per scheduling cycle (the only keys that differ between identical runs).
    pub cycle_cpu_ms_mean: f64,
    pub cycle_cpu_ms_p99: f64,
    /// Pass-allocation decisions that kept a time-flexible job waiting for a cheaper energy window.
    pub deferred_for_energy: u64,
    /// Pass-allocation decisions that kept a job waiting for a placement in fewer groups.
    pub deferred_for_topology: u64,
    pub power_budget_kw: Option<f64>,
    pub min_power_headroom_kw: Option<f64>,
    pub mean_power_headroom_kw: Option<f64>,
    pub per_tenant: BTreeMap<String, GroupMetrics>,
    pub per_vcluster: BTreeMap<String, GroupMetrics>,
    /// Per preemption class ("00".."10").
    pub per_class: BTreeMap<String, GroupMetrics>,
    pub notes: Vec<String>,
}

/// One DAG's outcome. Stretch = makespan / critical path (the longest chain of run times).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DagMetrics {
    pub state: &'static str,
    pub allocations: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub unfinished: u64,
    pub submit_s: f64,
    pub last_end_s: f64,
    pub makespan_s: f64,
    pub critical_path_s: f64,
    pub stretch: f64,
}

/// One task group's throughput: completed elements per hour between its first start and last end.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TaskGroupMetrics {
    pub elements: u64,
    pub completed: u64,
    pub first_start_s: f64,
    pub last_end_s: f64,
    pub throughput_per_h: f64,
}

/// Keys of `summary.json` that measure real time and so differ between otherwise identical runs.
pub const TIMING_KEYS: [&str; 2] = ["cycle_cpu_ms_mean", "cycle_cpu_ms_p99"];

/// Jain's index of `x`: (Σx)² / (n·Σx²), 1 for equal values (and for none or all zero).
fn jain_of(x: &[f64]) -> f64 {
    let (sum, sq): (f64, f64) = (x.iter().sum(), x.iter().map(|v| v * v).sum());
    if sq > 0.0 {
        sum * sum / (x.len() as f64 * sq)
    } else {
        1.0
    }
}

/// The last time anything happened to `jobs` (an end, or a submission that never ended).
fn replay_end<R: JobFields>(jobs: &[R]) -> f64 {
    jobs.iter()
        .map(|j| j.end_s().unwrap_or(j.submit_s()).max(j.submit_s()))
        .fold(0.0, f64::max)
}

/// Jain's fairness index over tenants of (actual share / target share), and the largest
/// |actual share − target share|; shares are of node-hours. `targets` gives configured shares; the
/// other tenants split what is left equally.
pub fn fairness<K: std::borrow::Borrow<str> + Ord>(
    usage: &BTreeMap<K, f64>,
    targets: &BTreeMap<String, f64>,
) -> (f64, f64) {
    let total: f64 = usage.values().sum();
    let n = usage.len();
    if n == 0 || total <= 0.0 {
        return (1.0, 0.0);
    }
    let effective = effective_targets(usage.keys(), targets);
    let target = |t: &str| effective.get(t).copied().unwrap_or(0.0);
    let x: Vec<f64> = usage
        .iter()
        .filter(|(t, _)| target((*t).borrow()) > 0.0)
        .map(|(t, u)| (u / total) / target(t.borrow()))
        .collect();
    let jain = jain_of(&x);
    let dev = usage
        .iter()
        .map(|(t, u)| (u / total - target(t.borrow())).abs())
        .fold(0.0, f64::max);
    (round6(jain), round6(dev))
}

/// The target share of each of `tenants`: its configured target, or an equal split of what the
/// configured targets (of these tenants) leave.
pub fn effective_targets<'a, K: std::borrow::Borrow<str> + 'a>(
    tenants: impl Iterator<Item = &'a K> + Clone,
    targets: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let set: f64 = tenants.clone().filter_map(|t| targets.get(t.borrow())).sum();
    let unset = tenants.clone().filter(|t| !targets.contains_key(t.borrow())).count();
    let rest = if unset > 0 {
        (1.0 - set).max(0.0) / unset as f64
    } else {
        0.0
    };
    tenants
        .map(|t| (t.borrow().to_string(), targets.get(t.borrow()).copied().unwrap_or(rest)))
        .collect()
}

/// Fairness per time window: each allocation's node-seconds are split over the windows it ran in;
/// in each window the tenants that used the machine are compared with their targets. Returns
/// (mean Jain index, max share deviation, mean share deviation) over windows with any usage.
pub fn windowed_fairness<R: JobFields>(jobs: &[R], window_s: f64, targets: &BTreeMap<String, f64>) -> (f64, f64, f64) {
    // Keyed by the records' own tenant names: no string is made per job and window.
    let mut windows: BTreeMap<u64, BTreeMap<&str, f64>> = BTreeMap::new();
    for j in jobs {
        let (Some(s), Some(e), Some(run)) = (j.start_s(), j.end_s(), j.run_s()) else {
            continue;
        };
        // Its node-time, spread evenly from first start to end (exact unless it was suspended).
        let density = if e > s { j.nodes() as f64 * run / (e - s) } else { 0.0 };
        let mut t = s;
        while t < e {
            let w = (t / window_s).floor() as u64;
            let until = ((w + 1) as f64 * window_s).min(e);
            *windows.entry(w).or_default().entry(j.tenant()).or_default() += density * (until - t);
            t = until;
        }
    }
    if windows.is_empty() {
        return (1.0, 0.0, 0.0);
    }
    let per: Vec<(f64, f64)> = windows.values().map(|u| fairness(u, targets)).collect();
    let n = per.len() as f64;
    (
        round6(per.iter().map(|p| p.0).sum::<f64>() / n),
        round6(per.iter().map(|p| p.1).fold(0.0, f64::max)),
        round6(per.iter().map(|p| p.1).sum::<f64>() / n),
    )
}

/// Demand-aware fairness over the run (docs/rm-replay.md, "Fairness"): in each window with
/// contention, each tenant's fair share is its target capped by its demand (max-min, the engine's KAI
/// one-level division of what was delivered), and the delivered shares are compared with it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DemandFairness {
    /// Windows that counted: some work waited and at least two tenants wanted the machine.
    pub windows: u64,
    /// Jain's index of delivered / fair over the tenants with demand, mean over those windows
    /// weighted by their waiting node-time.
    pub jain: f64,
    /// The largest |delivered − fair| share of a tenant in a window, weighted mean over windows.
    pub max_dev: f64,
    /// The mean |delivered − fair| share over the tenants with demand, weighted mean over windows.
    pub mean_dev: f64,
}

/// Splits `[from, to)` over windows of `window_s`, adding `rate × overlap` to each window's entry
/// for `tenant`.
fn spread<'a>(
    windows: &mut BTreeMap<u64, BTreeMap<&'a str, (f64, f64)>>,
    window_s: f64,
    tenant: &'a str,
    from: f64,
    to: f64,
    rate: f64,
    waiting: bool,
) {
    let mut t = from;
    while t < to {
        let w = (t / window_s).floor() as u64;
        let until = ((w + 1) as f64 * window_s).min(to);
        let e = windows.entry(w).or_default().entry(tenant).or_default();
        if waiting {
            e.1 += rate * (until - t);
        } else {
            e.0 += rate * (until - t);
        }
        t = until;
    }
}

/// [`DemandFairness`] of `jobs`. Delivered node-time is each allocation's node-seconds spread over
/// its span (as [`windowed_fairness`]); waiting demand is its nodes from submission to first start
/// (to the end of the run if it never started). `targets`: configured shares; tenants without one
/// split what is left equally among those with demand in the window.
pub fn demand_fairness<R: JobFields>(jobs: &[R], window_s: f64, targets: &BTreeMap<String, f64>) -> DemandFairness {
    let end = replay_end(jobs);
    // window → tenant → (delivered, waiting) node-seconds.
    let mut windows: BTreeMap<u64, BTreeMap<&str, (f64, f64)>> = BTreeMap::new();
    for j in jobs {
        let first_start = j.start_s().unwrap_or(end);
        spread(
            &mut windows,
            window_s,
            j.tenant(),
            j.submit_s(),
            first_start,
            j.nodes() as f64,
            true,
        );
        if let (Some(s), Some(e), Some(run)) = (j.start_s(), j.end_s(), j.run_s()) {
            let density = if e > s { j.nodes() as f64 * run / (e - s) } else { 0.0 };
            spread(&mut windows, window_s, j.tenant(), s, e, density, false);
        }
    }
    let (mut weight, mut jain, mut max_dev, mut mean_dev, mut counted) = (0.0, 0.0, 0.0, 0.0, 0u64);
    for per in windows.values() {
        let waiting: f64 = per.values().map(|v| v.1).sum();
        let delivered: f64 = per.values().map(|v| v.0).sum();
        let wanting: Vec<(&&str, f64, f64)> = per
            .iter()
            .filter(|(_, v)| v.0 + v.1 > 0.0)
            .map(|(t, v)| (t, v.0, v.0 + v.1))
            .collect();
        if waiting <= 0.0 || delivered <= 0.0 || wanting.len() < 2 {
            continue;
        }
        let shares = effective_targets(wanting.iter().map(|w| w.0), targets);
        let queues: Vec<lattice_engine::kai::QueueSpec> = wanting
            .iter()
            .map(|(t, _, demand)| lattice_engine::kai::QueueSpec {
                name: t.to_string(),
                deserved: 0.0,
                over_quota_weight: shares.get(**t).copied().unwrap_or(0.0),
                request: *demand,
                children: Vec::new(),
            })
            .collect();
        let fair = lattice_engine::kai::one_level(delivered, &queues);
        let devs: Vec<f64> = wanting
            .iter()
            .zip(&fair)
            .map(|((_, got, _), f)| (got - f).abs() / delivered)
            .collect();
        let x: Vec<f64> = wanting
            .iter()
            .zip(&fair)
            .filter(|(_, f)| **f > 0.0)
            .map(|((_, got, _), f)| got / f)
            .collect();
        let j = jain_of(&x);
        weight += waiting;
        jain += waiting * j;
        max_dev += waiting * devs.iter().copied().fold(0.0, f64::max);
        mean_dev += waiting * devs.iter().sum::<f64>() / devs.len() as f64;
        counted += 1;
    }
    if counted == 0 {
        return DemandFairness {
            windows: 0,
            jain: 1.0,
            max_dev: 0.0,
            mean_dev: 0.0,
        };
    }
    DemandFairness {
        windows: counted,
        jain: round6(jain / weight),
        max_dev: round6(max_dev / weight),
        mean_dev: round6(mean_dev / weight),
    }
}

/// Service fairness over tenants: Jain's index of the per-tenant mean bounded slowdowns, the worst
/// tenant's mean slowdown over the median tenant's, and the worst tenant's p95 wait minus the median
/// tenant's (s). Tenants that started nothing do not count; one tenant is perfectly fair.
pub fn service_fairness(per_tenant: &BTreeMap<String, GroupMetrics>) -> (f64, f64, f64) {
    let served: Vec<&GroupMetrics> = per_tenant.values().filter(|m| m.started > 0).collect();
    if served.len() < 2 {
        return (1.0, 1.0, 0.0);
    }
    let mut bsld: Vec<f64> = served.iter().map(|m| m.mean_bsld).collect();
    let jain = jain_of(&bsld);
    bsld.sort_by(f64::total_cmp);
    let median = |v: &[f64]| v[(v.len() - 1) / 2];
    let worst_to_median = bsld[bsld.len() - 1] / median(&bsld).max(1.0);
    let mut p95: Vec<f64> = served.iter().map(|m| m.p95_wait_s).collect();
    p95.sort_by(f64::total_cmp);
    let spread = p95[p95.len() - 1] - median(&p95);
    (round6(jain), round6(worst_to_median), round6(spread))
}

/// SLO compliance: the fraction of allocations whose wait was at most their class's target
/// (`target_s(class)`), overall and per class. One that never started counts as met while it waited
/// less than its target by the end of the replay, missed otherwise.
pub fn slo_compliance<R: JobFields>(jobs: &[R], target_s: impl Fn(u8) -> f64) -> (f64, BTreeMap<String, f64>) {
    let end = replay_end(jobs);
    let mut by_class: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
    for j in jobs {
        let wait = j.wait_s().unwrap_or(end - j.submit_s());
        let e = by_class.entry(j.class()).or_default();
        e.1 += 1;
        if wait <= target_s(j.class()) {
            e.0 += 1;
        }
    }
    let (met, all) = by_class.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
    let overall = if all == 0 { 1.0 } else { round6(met as f64 / all as f64) };
    (
        overall,
        by_class
            .into_iter()
            .map(|(c, (m, n))| (c.to_string(), round6(m as f64 / n as f64)))
            .collect(),
    )
}

/// Real CPU time spent in scheduling passes: reported apart from `summary.json`, which must stay
/// byte-identical between runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineCost {
    pub passes: u64,
    pub cycle_cpu_ms_mean: f64,
    pub cycle_cpu_ms_p99: f64,
    pub cycle_cpu_ms_max: f64,
    pub engine_cpu_ms_total: f64,
}

impl EngineCost {
    pub fn from_nanos(mut ns: Vec<u64>) -> EngineCost {
        if ns.is_empty() {
            return EngineCost::default();
        }
        ns.sort_unstable();
        let total: u64 = ns.iter().sum();
        let ms: Vec<f64> = ns.iter().map(|&n| n as f64 / 1e6).collect();
        EngineCost {
            passes: ns.len() as u64,
            cycle_cpu_ms_mean: round6(total as f64 / 1e6 / ns.len() as f64),
            cycle_cpu_ms_p99: round6(percentile(&ms, 99.0)),
            cycle_cpu_ms_max: round6(*ms.last().expect("non-empty")),
            engine_cpu_ms_total: round6(total as f64 / 1e6),
        }
    }
}

/// Counters shown only when something happened (a summary of a run without them keeps its shape).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(absent: bool) -> JobRecord {
        let some = |x: f64| (!absent).then_some(x);
        JobRecord {
            id: "j1".into(),
            submit_s: 1.5,
            start_s: some(2.0),
            end_s: some(9.25),
            nodes: 4,
            wait_s: some(0.5),
            bsld: some(1.1),
            backfilled: !absent,
            tenant: "t".into(),
            vcluster: "v".into(),
            state: "completed",
            reason: "",
            gpus: 8,
            groups: (!absent).then_some(2),
            conformance: some(0.75),
            class: 3,
            score: None,
            preempted: 1,
            borrowed: 2,
            run_s: some(0.0),
        }
    }

    fn fields(j: &dyn JobFields) -> String {
        format!(
            "{} {:?} {:?} {:?} {:?} {:?} {} {} {} {:?} {:?} {} {} {} {} {}",
            j.submit_s(),
            j.start_s(),
            j.end_s(),
            j.wait_s(),
            j.bsld(),
            j.run_s(),
            j.nodes(),
            j.gpus(),
            j.borrowed(),
            j.groups(),
            j.conformance(),
            j.class(),
            j.backfilled(),
            j.tenant(),
            j.vcluster(),
            j.state()
        )
    }

    #[test]
    fn every_state_reads_back() {
        for s in STATES {
            let r = JobRecord {
                state: s.as_str(),
                ..record(false)
            };
            assert_eq!(JobFacts::from(&r).state(), s.as_str());
        }
    }

    #[test]
    fn facts_read_back_every_field_of_the_record_present_or_absent() {
        for absent in [false, true] {
            let r = record(absent);
            assert_eq!(fields(&JobFacts::from(&r)), fields(&r));
        }
        // A zero run time is present, not absent.
        assert_eq!(JobFacts::from(&record(false)).run_s(), Some(0.0));
    }

    #[test]
    fn slo_compliance_per_class() {
        let rec = |class: u8, wait: Option<f64>, submit: f64, end: Option<f64>| JobRecord {
            id: String::new(),
            submit_s: submit,
            start_s: wait.map(|w| submit + w),
            end_s: end,
            nodes: 1,
            wait_s: wait,
            bsld: None,
            backfilled: false,
            tenant: "t".into(),
            vcluster: "v".into(),
            state: "completed",
            reason: "success",
            gpus: 0,
            groups: None,
            conformance: None,
            class,
            score: None,
            preempted: 0,
            borrowed: 0,
            run_s: None,
        };
        // Class 9 target 15 min, the others 1 h. Class 9: 600 s met, 1,200 s missed. Class 1: 3,600 s
        // met (at most the target), one never started after 1,000 s by the end (t = 5,000): met.
        let jobs = [
            rec(9, Some(600.0), 0.0, Some(1000.0)),
            rec(9, Some(1200.0), 0.0, Some(2000.0)),
            rec(1, Some(3600.0), 0.0, Some(5000.0)),
            rec(1, None, 4000.0, None),
        ];
        let (all, by) = slo_compliance(&jobs, |c| if c >= 7 { 900.0 } else { 3600.0 });
        assert_eq!(all, 0.75);
        assert_eq!(by["9"], 0.5);
        assert_eq!(by["1"], 1.0);
        // The one that never started misses once it has waited past its target by the end.
        let (all, _) = slo_compliance(&jobs, |_| 900.0);
        assert_eq!(all, 0.25);
    }

    #[test]
    fn fairness_against_targets() {
        let usage: BTreeMap<String, f64> = [("a".to_string(), 75.0), ("b".to_string(), 25.0)].into();
        // Equal targets: a is 25 points over.
        assert_eq!(fairness(&usage, &BTreeMap::new()), (0.8, 0.25));
        // Targets 75/25: perfect.
        let t: BTreeMap<String, f64> = [("a".to_string(), 0.75)].into();
        assert_eq!(fairness(&usage, &t), (1.0, 0.0));
    }

    #[test]
    fn jobs_csv_rows_carry_exactly_the_header_columns() {
        let r = JobRecord {
            id: "a,1".into(),
            submit_s: 1.0,
            start_s: Some(2.0),
            end_s: Some(3.0),
            nodes: 4,
            wait_s: Some(1.0),
            bsld: Some(1.0),
            backfilled: false,
            tenant: "t\"x".into(),
            vcluster: "v".into(),
            state: "completed",
            reason: "success",
            gpus: 0,
            groups: Some(1),
            conformance: Some(1.0),
            class: 4,
            score: Some(0.5),
            preempted: 2,
            borrowed: 0,
            run_s: Some(1.0),
        };
        let mut row = String::new();
        r.csv_row(&mut row);
        // Split on commas outside quotes.
        let (mut fields, mut quoted) = (1, false);
        for c in row.trim_end().chars() {
            match c {
                '"' => quoted = !quoted,
                ',' if !quoted => fields += 1,
                _ => {}
            }
        }
        assert_eq!(fields, JobRecord::CSV_COLUMNS.len(), "{row}");
        assert_eq!(JobRecord::csv_header().split(',').count(), fields);
        assert!(row.starts_with("\"a,1\",1,2,3,4,"), "{row}");
        assert!(row.trim_end().ends_with(",1,1,4,0.5,2"), "{row}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), 2.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn bounded_slowdown_definition() {
        // run 100 s, wait 100 s: (100 + 100) / 100 = 2
        assert_eq!(
            bounded_slowdown(Duration::from_secs(100), Duration::from_secs(100)),
            2.0
        );
        // run 1 s uses τ = 10 s: (9 + 1) / 10 = 1
        assert_eq!(bounded_slowdown(Duration::from_secs(9), Duration::from_secs(1)), 1.0);
        // never below 1
        assert_eq!(bounded_slowdown(Duration::ZERO, Duration::ZERO), 1.0);
        // run 0, wait 30: 30 / 10 = 3
        assert_eq!(bounded_slowdown(Duration::from_secs(30), Duration::ZERO), 3.0);
    }

    #[test]
    fn csv_quotes_fields_that_need_it() {
        let r = JobRecord {
            id: "a,b".into(),
            submit_s: 1.5,
            start_s: Some(2.0),
            end_s: None,
            nodes: 3,
            wait_s: Some(0.5),
            bsld: None,
            backfilled: true,
            tenant: "t".into(),
            vcluster: "v".into(),
            state: "running",
            reason: "",
            gpus: 0,
            groups: Some(2),
            conformance: Some(0.5),
            class: 3,
            score: None,
            preempted: 0,
            borrowed: 0,
            run_s: None,
        };
        let mut s = String::new();
        r.csv_row(&mut s);
        assert_eq!(s, "\"a,b\",1.5,2,,3,0.5,,true,t,v,running,,2,0.5,3,,0\n");
    }
}
