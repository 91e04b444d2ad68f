//! What a finished replay reports: its job records and the summary's metrics (staging, services,
//! the controller's counters, sensitive claims, workflows, energy) — and the seeded draws the
//! replay makes (failure times, synthetic load).

use crate::config::{DEFAULT_SLO_WAIT, SimConfig};
use crate::facts::JobFields;
use crate::metrics::{self, GroupMetrics, JobRecord, Summary};
use crate::quorum::FakeQuorum;
use crate::world;
use lattice_engine::{AllocState, Controller, Duration, EndReason, Engine, NodeId, TenantId, Time, VClusterId};
use lattice_traces::Workload;
use std::collections::BTreeMap;

/// Staging metrics: allocations staged, the queue time staging used, stalls and alerts.
pub(crate) fn staging_metrics(summary: &mut Summary, engine: &Engine, stall_ms: u64) {
    let staged: Vec<(Time, Option<Time>, Option<Time>)> = engine
        .allocations()
        .iter()
        .filter_map(|a| engine.staging_times(a.id).map(|(s, e)| (s, e, a.first_started)))
        .collect();
    summary.staged_allocations = staged.len() as u64;
    // Queue time that staging used: from staging start to the earlier of staging end and the job start.
    summary.staging_overlap_s = metrics::round6(
        staged
            .iter()
            .map(|&(s, e, st)| {
                let until = match (e, st) {
                    (Some(e), Some(st)) => e.min(st),
                    (Some(e), None) => e,
                    (None, Some(st)) => st,
                    (None, None) => s,
                };
                until.since(s).as_secs_f64()
            })
            .sum(),
    );
    summary.staging_stall_s = metrics::round6(stall_ms as f64 / 1000.0);
    summary.staging_alerts = engine.staging_alerts();
}

/// Services (allocations without a walltime, sensitive claims aside) and their mean availability:
/// the share of the time from submission to `until` (the horizon or the trace's end) they ran.
pub(crate) fn service_metrics(summary: &mut Summary, engine: &Engine, until: Time) {
    let services: Vec<f64> = engine
        .allocations()
        .iter()
        .filter(|a| a.spec.lifecycle.walltime().is_none() && !a.spec.sensitive_claim)
        .map(|a| {
            let end = until.max(a.submitted);
            let window = end.since(a.submitted).as_secs_f64();
            let up = a
                .first_started
                .map_or(0.0, |s| a.ended.unwrap_or(end).min(end).since(s).as_secs_f64());
            if window > 0.0 { (up / window).min(1.0) } else { 1.0 }
        })
        .collect();
    summary.services = services.len() as u64;
    summary.service_availability = if services.is_empty() {
        1.0
    } else {
        metrics::round6(services.iter().sum::<f64>() / services.len() as f64)
    };
}

/// What the controller counted: checkpoints, lost node-hours, preemptions, wipes, drifts, boots.
pub(crate) fn controller_stats(summary: &mut Summary, ctl: &Controller) {
    let stats = &ctl.stats;
    summary.checkpoint_hints = stats.broker_hints;
    summary.broker_checkpoints = stats.broker_checkpoints;
    summary.preemption_checkpoints = stats.preemption_checkpoints;
    summary.lost_node_hours = metrics::round6(stats.lost_node_s / 3600.0);
    summary.preemptions = stats.preemptions.values().sum();
    summary.preemptions_by_reason = world::by_reason(&stats.preemptions);
    summary.wipes = stats.wipes;
    summary.quarantined_nodes = stats.quarantined_nodes;
    summary.drifts = stats.drifts;
    summary.drift_timeouts = stats.drift_timeouts;
    summary.hardened_boots = stats.hardened_boots;
    summary.boot_failures = stats.boot_failures;
    summary.vni_refusals = stats.vni_refusals;
    summary.claims_refused = stats.claims_refused;
    summary.wipe_timeouts = stats.wipe_timeouts;
    summary.preemption_report_timeouts = stats.preemption_report_timeouts;
    summary.durability_holds = stats.durability_holds;
}

/// Sensitive claims and the longest wait of one that started.
pub(crate) fn sensitive_metrics(summary: &mut Summary, engine: &Engine) {
    let claim_waits: Vec<f64> = engine
        .allocations()
        .iter()
        .filter(|a| a.spec.sensitive_claim)
        .filter_map(|a| a.first_started.map(|s| s.since(a.submitted).as_secs_f64()))
        .collect();
    summary.sensitive_claims = engine.allocations().iter().filter(|a| a.spec.sensitive_claim).count() as u64;
    summary.sensitive_wait_max_s = claim_waits.iter().copied().fold(0.0, f64::max);
}

/// DAG makespan and critical-path stretch, and task-group throughput, from the trace's structure and
/// the replayed records.
pub(crate) fn workflow_metrics<R: JobFields>(
    workload: &Workload,
    trace_of: &[usize],
    jobs: &[R],
) -> (
    BTreeMap<String, metrics::DagMetrics>,
    BTreeMap<String, metrics::TaskGroupMetrics>,
) {
    let mut rec: Vec<Option<&R>> = vec![None; workload.jobs.len()];
    for (a, &t) in trace_of.iter().enumerate() {
        rec[t] = jobs.get(a);
    }
    let run = |i: usize| rec[i].and_then(|r| r.run_s()).unwrap_or(0.0);
    let mut dags: BTreeMap<String, metrics::DagMetrics> = BTreeMap::new();
    // Longest path (run times) ending at each job; deps always point to earlier jobs.
    let mut path = vec![0.0f64; workload.jobs.len()];
    for (i, j) in workload.jobs.iter().enumerate() {
        let before = j.deps.iter().map(|&(d, _)| path[d]).fold(0.0, f64::max);
        path[i] = before + run(i);
        let Some(d) = j.dag() else { continue };
        let m = dags.entry(d.to_string()).or_insert_with(|| metrics::DagMetrics {
            submit_s: j.submit.as_secs_f64(),
            ..Default::default()
        });
        m.allocations += 1;
        let r = rec[i];
        match r.map(|r| r.state()) {
            Some("completed") => m.completed += 1,
            Some("failed") => m.failed += 1,
            Some("cancelled") => m.cancelled += 1,
            _ => m.unfinished += 1,
        }
        if let Some(e) = r.and_then(|r| r.end_s()) {
            m.last_end_s = m.last_end_s.max(e);
        }
        m.critical_path_s = m.critical_path_s.max(path[i]);
    }
    for m in dags.values_mut() {
        m.makespan_s = metrics::round6((m.last_end_s - m.submit_s).max(0.0));
        m.stretch = if m.critical_path_s > 0.0 {
            metrics::round6(m.makespan_s / m.critical_path_s)
        } else {
            0.0
        };
        m.state = if m.unfinished > 0 {
            "running"
        } else if m.failed > 0 {
            "failed"
        } else {
            "completed"
        };
    }
    let mut groups: BTreeMap<String, metrics::TaskGroupMetrics> = BTreeMap::new();
    for (i, j) in workload.jobs.iter().enumerate() {
        let Some(g) = j.group_name() else { continue };
        let m = groups
            .entry(g.to_string())
            .or_insert_with(|| metrics::TaskGroupMetrics {
                first_start_s: f64::INFINITY,
                ..Default::default()
            });
        m.elements += 1;
        if let Some(r) = rec[i] {
            if r.state() == "completed" {
                m.completed += 1;
            }
            if let Some(s) = r.start_s() {
                m.first_start_s = m.first_start_s.min(s);
            }
            if let Some(e) = r.end_s() {
                m.last_end_s = m.last_end_s.max(e);
            }
        }
    }
    for m in groups.values_mut() {
        if !m.first_start_s.is_finite() {
            m.first_start_s = 0.0;
        }
        let span = (m.last_end_s - m.first_start_s).max(0.0);
        m.throughput_per_h = if span > 0.0 {
            metrics::round6(m.completed as f64 / (span / 3600.0))
        } else {
            0.0
        };
    }
    (dags, groups)
}

/// Inclusive ranges `(first, last)` of node indices, ascending (an ended allocation's nodes).
pub(crate) type NodeRanges = Box<[(u32, u32)]>;

/// The nodes each allocation holds, or held when it ended: the engine's list, or the ranges the
/// replay kept for an ended allocation whose list it moved out of the engine.
pub(crate) struct HeldNodes<'a> {
    pub engine: &'a Engine,
    /// By allocation index: the ranges `(first, last)` of an ended allocation's nodes.
    pub ended: &'a [Option<NodeRanges>],
}

impl HeldNodes<'_> {
    /// The nodes allocation `a` holds (holds still, or held at its end), in ascending order for an
    /// ended one.
    pub fn of<'b>(&self, a: &'b lattice_engine::Allocation) -> std::borrow::Cow<'b, [NodeId]> {
        match self.ended.get(a.id.index()) {
            Some(Some(r)) => r.iter().flat_map(|&(f, l)| (f..=l).map(NodeId)).collect(),
            _ => std::borrow::Cow::Borrowed(&a.nodes[..]),
        }
    }
}

/// `(start, end, kW)` of every run that ended (current runs of requeued/preempted allocations only).
pub(crate) fn summary_jobs_energy(held: &HeldNodes, power_w: &[u32]) -> Vec<(Time, Time, f64)> {
    held.engine
        .allocations()
        .iter()
        .filter_map(|a| {
            let kw = held.of(a).iter().map(|n| power_w[n.index()] as f64).sum::<f64>() / 1000.0;
            Some((a.started?, a.ended?, kw))
        })
        .collect()
}

/// Energy (kWh) and its cost under the price series (price per kWh, step function; before the first
/// point the first price applies; no series = cost 0).
pub(crate) fn energy_use(runs: &[(Time, Time, f64)], prices: &[(Time, f64)]) -> (f64, f64) {
    let mut kwh = 0.0;
    let mut cost = 0.0;
    for &(s, e, kw) in runs {
        let hours = e.since(s).as_secs_f64() / 3600.0;
        kwh += kw * hours;
        if prices.is_empty() {
            continue;
        }
        let mut t = s;
        while t < e {
            let i = prices.partition_point(|p| p.0 <= t);
            let price = if i == 0 { prices[0].1 } else { prices[i - 1].1 };
            let until = prices.get(i).map_or(e, |p| p.0.min(e));
            cost += kw * until.since(t).as_secs_f64() / 3600.0 * price;
            t = until;
        }
    }
    (metrics::round6(kwh), metrics::round6(cost))
}

/// Demand (nodes) of a synthetic load curve at `since` after its start: a sine around `base` plus
/// uniform noise in ±`noise`, drawn from a generator seeded by (run seed, curve, sample) so every sample
/// is reproducible on its own.
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_demand(
    seed: u64,
    curve: usize,
    k: u32,
    since: Duration,
    base: f64,
    amplitude: f64,
    period: Duration,
    noise: f64,
) -> f64 {
    use rand_chacha::rand_core::{Rng, SeedableRng};
    let phase = since.0 as f64 / period.0 as f64 * std::f64::consts::TAU;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x10AD_C0DE_u64 ^ ((curve as u64) << 32) ^ k as u64);
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (base + amplitude * phase.sin() + noise * (2.0 * u - 1.0)).max(0.0)
}

/// An exponentially distributed duration with the given mean.
pub(crate) fn draw_exp(rng: &mut rand_chacha::ChaCha8Rng, mean: Duration) -> Duration {
    use rand_chacha::rand_core::Rng;
    let u = ((rng.next_u64() >> 11) as f64 + 1.0) / ((1u64 << 53) as f64 + 1.0);
    Duration((-(u.ln()) * mean.as_millis() as f64).round().max(1.0) as u64)
}

/// `(gpus, group, conformance fingerprint)` per node.
pub(crate) type NodeFacts = [(u32, u32, u64)];

/// (groups spanned, nodes in the largest same-fingerprint subset) of a placement; O(nodes × distinct).
pub(crate) fn placement_shape(nodes: &[lattice_engine::NodeId], facts: &NodeFacts) -> (u32, u32) {
    let mut groups: Vec<u32> = Vec::new();
    let mut fps: Vec<(u64, u32)> = Vec::new();
    for n in nodes {
        let (_, g, fp) = facts[n.index()];
        if groups.last() != Some(&g) && !groups.contains(&g) {
            groups.push(g);
        }
        match fps.iter_mut().find(|x| x.0 == fp) {
            Some(x) => x.1 += 1,
            None => fps.push((fp, 1)),
        }
    }
    (groups.len() as u32, fps.iter().map(|x| x.1).max().unwrap_or(0))
}

/// Builds the `jobs.csv` record of each allocation, one at a time (a year's replay need not hold them
/// all: see [`crate::facts`]).
pub(crate) struct Records<'a> {
    held: &'a HeldNodes<'a>,
    workload: &'a Workload,
    trace_of: &'a [usize],
    facts: &'a NodeFacts,
    /// Node-time held by each allocation, summed as its runs ended.
    held_s: &'a [f64],
    /// One group and one fingerprint everywhere (every SWF replay): every placement spans 1 group.
    uniform: bool,
    /// Names interned once: a year's records share a few hundred tenant and vCluster names.
    tenants: Vec<std::sync::Arc<str>>,
    vclusters: Vec<std::sync::Arc<str>>,
}

impl<'a> Records<'a> {
    pub fn new(
        held: &'a HeldNodes<'a>,
        workload: &'a Workload,
        trace_of: &'a [usize],
        facts: &'a NodeFacts,
        held_s: &'a [f64],
    ) -> Records<'a> {
        let engine = held.engine;
        let name = |n: Option<String>| -> std::sync::Arc<str> { n.unwrap_or_default().into() };
        Records {
            held,
            workload,
            trace_of,
            facts,
            held_s,
            uniform: facts.windows(2).all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2),
            tenants: (0..)
                .map(TenantId)
                .take_while(|&t| engine.tenant(t).is_some())
                .map(|t| name(engine.tenant(t).map(|x| x.name)))
                .collect(),
            vclusters: (0..)
                .map(VClusterId)
                .take_while(|&v| engine.vcluster(v).is_some())
                .map(|v| name(engine.vcluster(v).map(|x| x.name)))
                .collect(),
        }
    }

    /// Every record, in allocation order — which is submission order, the workload's (trace) order.
    pub fn all(&self) -> Vec<JobRecord> {
        self.held.engine.allocations().iter().map(|a| self.record(a)).collect()
    }

    /// The record of allocation `a`.
    pub fn record(&self, a: &lattice_engine::Allocation) -> JobRecord {
        let engine = self.held.engine;
        let facts = self.facts;
        let shared = |names: &[std::sync::Arc<str>], i: usize| names.get(i).cloned().unwrap_or_else(|| "".into());
        let job = &self.workload.jobs[self.trace_of[a.id.index()]];
        let nodes = self.held.of(a);
        let shape = a.started.map(|_| {
            if self.uniform {
                (1, nodes.len() as u32)
            } else {
                placement_shape(&nodes, facts)
            }
        });
        // A preempted allocation waited until its first start; its run spans every run since.
        let first = a.first_started;
        let wait = first.map(|s| s.since(a.submitted));
        let bsld = match (first, a.ended) {
            (Some(s), Some(e)) => Some(metrics::bounded_slowdown(s.since(a.submitted), e.since(s))),
            _ => None,
        };
        let end_s = first.and(a.ended).map(Time::as_secs_f64);
        JobRecord {
            id: job.id.clone(),
            submit_s: a.submitted.as_secs_f64(),
            start_s: first.map(Time::as_secs_f64),
            end_s,
            nodes: if a.started.is_some() {
                nodes.len() as u32
            } else {
                a.spec.nodes.min
            },
            wait_s: wait.map(Duration::as_secs_f64),
            bsld,
            backfilled: a.backfilled && a.started.is_some(),
            tenant: shared(&self.tenants, a.spec.tenant.index()),
            vcluster: shared(&self.vclusters, a.spec.vcluster.index()),
            state: a.state.as_str(),
            reason: a.end_reason.map_or("", |r| r.as_str()),
            gpus: nodes.iter().map(|n| facts[n.index()].0).sum(),
            groups: shape.map(|s| s.0),
            conformance: shape
                .filter(|_| !nodes.is_empty())
                .map(|s| metrics::round6(s.1 as f64 / nodes.len() as f64)),
            class: a.spec.preemption_class.get(),
            score: a.start_score.as_ref().map(|s| metrics::round6(s.total)),
            preempted: a.preempted,
            borrowed: engine.borrowed_among(a.id, &nodes),
            // Node-time held: the sum of each ended allocation's runs.
            run_s: end_s.map(|_| metrics::round6(self.held_s.get(a.id.index()).copied().unwrap_or(0.0))),
        }
    }
}

/// What the summary reads besides the records, at the end of a replay.
pub(crate) struct AtEnd<'a> {
    pub workload: &'a Workload,
    pub trace_of: &'a [usize],
    pub engine: &'a Engine,
    pub cfg: &'a SimConfig,
    pub joined: &'a [Time],
    pub quorum: &'a FakeQuorum,
}

impl AtEnd<'_> {
    /// The summary's metrics over `jobs` (full records or their compact facts: the same summary).
    pub fn summarize<R: JobFields>(&self, jobs: &[R], skipped: BTreeMap<String, u64>, notes: Vec<String>) -> Summary {
        let (dags, groups) = workflow_metrics(self.workload, self.trace_of, jobs);
        let mut summary = summarize(
            self.workload,
            self.engine,
            self.cfg,
            jobs,
            skipped,
            self.joined,
            self.quorum,
            notes,
        );
        summary.borrowed_node_hours = metrics::round6(
            jobs.iter()
                .filter_map(|j| Some(j.borrowed() as f64 * j.run_s()? / 3600.0))
                .sum::<f64>(),
        );
        summary.mean_dag_stretch = if dags.is_empty() {
            0.0
        } else {
            metrics::round6(dags.values().map(|d| d.stretch).sum::<f64>() / dags.len() as f64)
        };
        summary.dags = dags;
        summary.task_groups = groups;
        summary
    }
}

#[allow(clippy::too_many_arguments)]
fn summarize<R: JobFields>(
    workload: &Workload,
    engine: &Engine,
    cfg: &SimConfig,
    jobs: &[R],
    skipped: BTreeMap<String, u64>,
    joined: &[Time],
    quorum: &FakeQuorum,
    notes: Vec<String>,
) -> Summary {
    let total_nodes = engine.nodes().len() as u32;
    let first_submit = jobs.iter().map(|j| j.submit_s()).fold(f64::INFINITY, f64::min);
    let last_end = jobs.iter().filter_map(|j| j.end_s()).fold(f64::NEG_INFINITY, f64::max);
    let (first_submit, last_end) = if jobs.is_empty() || !last_end.is_finite() {
        (0.0, 0.0)
    } else {
        (first_submit, last_end)
    };
    let span = (last_end - first_submit).max(0.0);
    // Node-seconds the site offered: a node that joined counts from when it joined.
    let capacity = (total_nodes as usize - joined.len()) as f64 * span
        + joined
            .iter()
            .map(|t| (last_end - t.as_secs_f64().max(first_submit)).max(0.0))
            .sum::<f64>();
    let all = metrics::group_metrics(jobs.iter(), capacity);
    let mut by_tenant: BTreeMap<&str, Vec<&R>> = BTreeMap::new();
    let mut by_vcluster: BTreeMap<&str, Vec<&R>> = BTreeMap::new();
    for j in jobs {
        by_tenant.entry(j.tenant()).or_default().push(j);
        by_vcluster.entry(j.vcluster()).or_default().push(j);
    }
    let group = |m: BTreeMap<&str, Vec<&R>>| -> BTreeMap<String, GroupMetrics> {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), metrics::group_metrics(v.into_iter(), capacity)))
            .collect()
    };
    let mut by_class: BTreeMap<String, Vec<&R>> = BTreeMap::new();
    for j in jobs {
        by_class.entry(format!("{:02}", j.class())).or_default().push(j);
    }
    let per_class: BTreeMap<String, GroupMetrics> = by_class
        .into_iter()
        .map(|(k, v)| (k, metrics::group_metrics(v.into_iter(), capacity)))
        .collect();
    let per_tenant = group(by_tenant);
    let per_vcluster = group(by_vcluster);
    let targets: BTreeMap<String, f64> = cfg
        .tenants
        .iter()
        .filter_map(|(t, q)| q.fair_share_target.map(|x| (t.clone(), x)))
        .collect();
    let usage: BTreeMap<String, f64> = per_tenant.iter().map(|(t, m)| (t.clone(), m.node_hours)).collect();
    let fairness = metrics::fairness(&usage, &targets);
    let window = cfg.fairness_window.as_secs_f64().max(1.0);
    let windowed = metrics::windowed_fairness(jobs, window, &targets);
    let demand = metrics::demand_fairness(jobs, window, &targets);
    let service = metrics::service_fairness(&per_tenant);
    let slo = metrics::slo_compliance(jobs, |class| {
        cfg.slo_wait
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&class))
            .map_or(DEFAULT_SLO_WAIT, |r| r.2)
            .as_secs_f64()
    });
    let spans: Vec<u32> = jobs.iter().filter_map(|j| j.groups()).collect();
    let conf: Vec<f64> = jobs.iter().filter_map(|j| j.conformance()).collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            metrics::round6(v.iter().sum::<f64>() / v.len() as f64)
        }
    };
    let count = |s: AllocState| engine.allocations().iter().filter(|a| a.state == s).count() as u64;
    let ended: Vec<&R> = jobs.iter().filter(|j| j.end_s().is_some()).collect();
    let turnaround: f64 = ended.iter().map(|j| j.end_s().unwrap_or(0.0) - j.submit_s()).sum();
    Summary {
        trace: workload.source.clone(),
        jobs: jobs.len() as u64,
        skipped,
        policy: match cfg.vclusters.len() {
            0 => cfg.policy.to_string(),
            1 => cfg.vclusters.values().next().expect("one").policy.to_string(),
            _ => cfg
                .vclusters
                .iter()
                .map(|(n, c)| format!("{n}={}", c.policy))
                .collect::<Vec<_>>()
                .join(","),
        },
        seed: cfg.seed,
        nodes: total_nodes,
        nodes_added: joined.len() as u64,
        mean_wait_s: all.mean_wait_s,
        p50_wait_s: all.p50_wait_s,
        p95_wait_s: all.p95_wait_s,
        p99_wait_s: all.p99_wait_s,
        max_wait_s: all.max_wait_s,
        mean_bsld: all.mean_bsld,
        p95_bsld: all.p95_bsld,
        utilization: all.utilization,
        makespan_s: span,
        backfilled: all.backfilled,
        started: all.started,
        completed: count(AllocState::Completed),
        failed: count(AllocState::Failed),
        walltime_kills: engine
            .allocations()
            .iter()
            .filter(|a| a.end_reason == Some(EndReason::WalltimeExceeded))
            .count() as u64,
        unfinished: jobs.iter().filter(|j| j.end_s().is_none()).count() as u64,
        mean_turnaround_s: if ended.is_empty() {
            0.0
        } else {
            metrics::round6(turnaround / ended.len() as f64)
        },
        throughput_jobs_per_h: if span > 0.0 {
            metrics::round6(ended.len() as f64 / (span / 3600.0))
        } else {
            0.0
        },
        node_hours: all.node_hours,
        gpu_hours: all.gpu_hours,
        first_submit_s: first_submit,
        last_end_s: last_end,
        passes: engine.passes(),
        quorum_commits: quorum.commits,
        quorum_rejections: quorum.rejections,
        mean_group_span: mean(&spans.iter().map(|&g| g as f64).collect::<Vec<_>>()),
        single_group_fraction: mean(&spans.iter().map(|&g| (g <= 1) as u8 as f64).collect::<Vec<_>>()),
        mean_conformance_fitness: mean(&conf),
        jain_index: fairness.0,
        max_share_deviation: fairness.1,
        fairness_window_s: window,
        jain_index_windowed: windowed.0,
        max_share_deviation_windowed: windowed.1,
        mean_share_deviation_windowed: windowed.2,
        fair_share_windows: demand.windows,
        fair_share_jain: demand.jain,
        fair_share_dev_max: demand.max_dev,
        fair_share_dev_mean: demand.mean_dev,
        tenant_bsld_jain: service.0,
        tenant_bsld_worst_to_median: service.1,
        tenant_p95_wait_spread_s: service.2,
        slo_wait_compliance: slo.0,
        slo_wait_compliance_by_class: slo.1,
        cycle_cpu_ms_mean: 0.0,
        cycle_cpu_ms_p99: 0.0,
        deferred_for_energy: 0,
        deferred_for_topology: 0,
        quota_rejections: BTreeMap::new(),
        rejection_examples: Vec::new(),
        preemptions: 0,
        borrowed_node_hours: 0.0,
        preemptions_by_reason: BTreeMap::new(),
        preemption_kills: 0,
        checkpoint_success_rate: 1.0,
        checkpoint_hints: 0,
        broker_checkpoints: 0,
        preemption_checkpoints: 0,
        dags: BTreeMap::new(),
        mean_dag_stretch: 0.0,
        staged_allocations: 0,
        staging_overlap_s: 0.0,
        staging_stall_s: 0.0,
        staging_alerts: 0,
        scale_ups: 0,
        scale_downs: 0,
        scale_blocked: 0,
        scale_metric_unavailable: 0,
        oscillation_alerts: 0,
        services: 0,
        service_availability: 1.0,
        task_groups: BTreeMap::new(),
        node_failures: 0,
        injected_failures: 0,
        lost_node_hours: 0.0,
        requeues: 0,
        prologue_failures: 0,
        energy_kwh: 0.0,
        energy_cost: 0.0,
        suspended_requeues: engine.allocations().iter().map(|a| a.preempted as u64).sum(),
        sensitive_claims: 0,
        sensitive_wait_max_s: 0.0,
        wipes: 0,
        quarantined_nodes: 0,
        drifts: 0,
        drift_timeouts: 0,
        hardened_boots: 0,
        boot_failures: 0,
        vni_refusals: 0,
        claims_refused: 0,
        durability_holds: 0,
        wipe_timeouts: 0,
        preemption_report_timeouts: 0,
        audit_entries: 0,
        audit_chain_valid: true,
        power_budget_kw: None,
        min_power_headroom_kw: None,
        mean_power_headroom_kw: None,
        per_tenant,
        per_vcluster,
        per_class,
        notes,
    }
}
