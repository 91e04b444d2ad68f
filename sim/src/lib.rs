//! `lattice-sim` — the discrete-event simulator that drives `lattice-engine` on a virtual clock.
//!
//! It plays the parts the production runtime plays with real machines: an event queue ordered by
//! (time, kind, sequence) is the clock; fake nodes run each allocation for its trace run time and kill it
//! at its walltime (as the node agent does); a fake quorum commits the engine's proposals after a
//! configurable latency (default 0) and validates node ownership. Metrics follow DESIGN.md §3 exactly, and
//! an [`InvariantChecker`] can re-check the engine after every event.
//!
//! Event order (DESIGN.md §3): all events of a timestamp are applied — completions (including walltime
//! kills) and quorum commits first, then arrivals in trace order — then one scheduling pass runs. With
//! `--compat pyss` the order is pyss's: one event at a time, submissions before terminations, and the
//! engine's pyss policy decides whether the event triggers a pass.
//!
//! Besides the metrics, a replay keeps a [`Timeline`] (every run of every allocation on its nodes, and
//! preemption, checkpoint, borrowing and node-failure events) for the report's Gantt and event charts.

pub mod audit;
pub mod events;
mod host;
pub mod invariants;
pub mod metrics;
pub mod quorum;
pub mod timeline;
mod world;

pub use host::{Host, SiteNames};
pub use invariants::InvariantChecker;
pub use metrics::{EngineCost, GroupMetrics, JobRecord, Summary};
pub use timeline::{RunSpan, Timeline, TimelineEvent, TimelineKind};

use events::{EventKind, EventQueue};
use lattice_engine::{
    AllocId, AllocState, ControlError, Controller, Dependency, Duration, EndReason, Engine, Input, NodeEvent, NodeId,
    NodeState, Policy, TenantId, Time, VClusterConfig, VClusterId,
};
use lattice_traces::{Inventory, Workload};
use quorum::FakeQuorum;
use std::collections::{BTreeMap, BTreeSet};

/// Simulation settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Policy of vClusters without an entry in `vclusters`.
    pub policy: Policy,
    /// Per-vCluster scheduler config by vCluster name (from a weight profile).
    pub vclusters: BTreeMap<String, VClusterConfig>,
    /// Time from a proposal to the quorum's commit.
    pub commit_latency: Duration,
    /// Run the invariant checker after every event and pass.
    pub check_invariants: bool,
    /// Also check that reservations never move later, for every policy. (Always checked for EASY-style
    /// policies when the checker runs; for deeper backfill it only holds when run times equal walltimes.)
    pub check_all_promises: bool,
    /// Recorded in the summary (no decision in this version is random; later models draw from it).
    pub seed: u64,
    /// Fair-share usage decay (f3).
    pub fair_share: lattice_engine::FairShareConfig,
    /// Tenant quotas by tenant name.
    pub tenants: BTreeMap<String, lattice_engine::TenantQuota>,
    /// Project quotas by tenant, then project name.
    pub projects: BTreeMap<String, BTreeMap<String, lattice_engine::ProjectQuota>>,
    /// Hard, system-wide limit on nodes held by sensitive (`reservation`) allocations.
    pub sensitive_pool_size: Option<u32>,
    /// Secure wipe of nodes released by sensitive claims.
    pub wipe: WipeModel,
    /// Sensitive claims boot their nodes into the hardened image before they launch (`None`: they
    /// launch at once).
    pub hardened_boot: Option<BootModel>,
    /// Checkpoint storage outages `[down, up)`.
    pub storage_outages: Vec<(Time, Time)>,
    /// Window length for the windowed fairness metrics.
    pub fairness_window: Duration,
    /// Random node failures for what-if studies (seeded).
    pub failures: Option<FailureModel>,
    /// Stop the replay here: events after it are not processed (allocations still running or waiting
    /// are reported unfinished). `None` = run until every event is processed.
    pub horizon: Option<Time>,
    /// Grace between the walltime SIGTERM and the SIGKILL: an allocation running past its walltime ends
    /// `walltime + grace` after its start (or at its natural end, if sooner). Zero = killed at walltime.
    pub walltime_grace: Duration,
    /// Keep the controller's decision log (every start, release, preemption, checkpoint, scale, wipe,
    /// with its time) in the result.
    pub decision_log: bool,
    /// Target waits per preemption class for SLO compliance: `(lowest class, highest class, target)`,
    /// the first matching range wins; classes no range covers get [`DEFAULT_SLO_WAIT`].
    pub slo_wait: Vec<(u8, u8, Duration)>,
}

/// The target wait of classes no `slo_wait` range covers: the seed's `reference_wait` (1 h), the
/// wait at which f2 counts a job as having waited "one unit".
pub const DEFAULT_SLO_WAIT: Duration = Duration(3_600_000);

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            policy: Policy::EASY,
            vclusters: BTreeMap::new(),
            commit_latency: Duration::ZERO,
            check_invariants: cfg!(debug_assertions),
            check_all_promises: false,
            seed: 0,
            fair_share: lattice_engine::FairShareConfig::default(),
            tenants: BTreeMap::new(),
            projects: BTreeMap::new(),
            sensitive_pool_size: None,
            wipe: WipeModel::default(),
            hardened_boot: None,
            storage_outages: Vec::new(),
            fairness_window: Duration::from_hours(24),
            failures: None,
            horizon: None,
            walltime_grace: Duration::ZERO,
            decision_log: false,
            slo_wait: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("engine setup: {0}")]
    Engine(#[from] lattice_engine::EngineError),
    #[error("invariant violated at {time}: {message}")]
    Invariant { time: Time, message: String },
    #[error("the pyss-compatible policy needs a commit latency of 0 (pyss starts jobs at decision time)")]
    PyssLatency,
    #[error("vCluster `{0}` is configured but the trace and inventory never use it")]
    UnusedVCluster(String),
    #[error("tenant `{0}` has quotas configured but the trace never uses it")]
    UnusedTenant(String),
    #[error("project `{1}` of tenant `{0}` has quotas configured but the trace never uses it")]
    UnusedProject(String, String),
}

/// The simulated OpenCHAMI secure wipe: a uniform duration, and a failure probability (a failed or timed
/// out wipe quarantines the nodes: they stay out of the pool). Draws come from the run's seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WipeModel {
    pub min: Duration,
    pub max: Duration,
    pub failure_probability: f64,
}

impl Default for WipeModel {
    fn default() -> Self {
        WipeModel {
            min: Duration::from_mins(10),
            max: Duration::from_mins(30),
            failure_probability: 0.02,
        }
    }
}

/// The simulated OpenCHAMI boot of a claim's nodes into the hardened image: a uniform duration per
/// node and a failure probability (seeded draws); a boot not done within `timeout` fails (the
/// controller's deadline: the book's 10-minute boot timeout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BootModel {
    pub min: Duration,
    pub max: Duration,
    pub failure_probability: f64,
    pub timeout: Duration,
}

impl Default for BootModel {
    fn default() -> Self {
        BootModel {
            min: Duration::from_mins(3),
            max: Duration::from_mins(6),
            failure_probability: 0.0,
            timeout: Duration::from_mins(10),
        }
    }
}

/// The failure injector: each node fails after an exponential time with mean `mtbf` and is repaired
/// `repair` later.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailureModel {
    pub mtbf: Duration,
    pub repair: Duration,
}

/// Everything a replay produces.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub summary: Summary,
    /// One record per replayed allocation, in trace order.
    pub jobs: Vec<JobRecord>,
    /// The score breakdown of every allocation of a score-ordered vCluster when it started, in trace
    /// order, by index into [`SimResult::jobs`]: "why did X run before Y?".
    pub scores: Vec<(u32, Box<lattice_engine::ScoreBreakdown>)>,
    /// The quorum's hash-chained sensitive audit log.
    pub audit: audit::AuditLog,
    pub cost: EngineCost,
    pub invariant_checks: u64,
    /// Runs on nodes and point events, for the report's Gantt and event charts.
    pub timeline: Timeline,
    /// Each tenant's target share of node-hours, as the fairness metrics use it: configured targets,
    /// the other tenants with usage splitting the rest equally.
    pub tenant_targets: BTreeMap<String, f64>,
    /// The controller's decisions (`"<ms> <decision>"`), when [`SimConfig::decision_log`] is on.
    pub decisions: Vec<String>,
}

// Event ranks at equal times.
pub(crate) const RANK_END: u8 = 0;
const RANK_ARRIVAL: u8 = 2;
const PYSS_RANK_ARRIVAL: u8 = 0;
const PYSS_RANK_END: u8 = 1;
pub(crate) const RANK_WAKEUP: u8 = 3;
/// Node changes come after completions and before arrivals (DESIGN.md §3 "Event order").
pub(crate) const RANK_NODE: u8 = 1;

/// Every project the trace's jobs use: (tenant, project within it, id), in id order.
fn project_names(w: &Workload) -> Vec<(String, String, lattice_engine::ProjectId)> {
    let mut out = vec![None; w.projects.len()];
    for j in &w.jobs {
        let p = j.spec.project;
        if let Some(slot @ None) = out.get_mut(p.index()) {
            let tenant = w.tenants.get(j.spec.tenant.0).unwrap_or_default().to_string();
            *slot = Some((tenant, w.project_name(&j.spec).to_string(), p));
        }
    }
    out.into_iter().flatten().collect()
}

fn engine_vclusters(e: &Engine) -> usize {
    (0..).take_while(|&i| e.vcluster(VClusterId(i)).is_some()).count()
}

/// Replays `workload` on `nodes`. `progress(done, total)` is called now and then with arrivals processed.
pub fn simulate(
    workload: &Workload,
    inventory: &Inventory,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SimResult, SimError> {
    simulate_with(workload, inventory, cfg, progress, |ctl, _| ctl).map(|(r, _)| r)
}

/// [`simulate`] with the controller inside a host `make` builds around it (given the site's names):
/// the runtime's control plane runs the same replay this way, for the parity test. It drives a
/// [`Replay`] from [`Replay::new`] through its [`Replay::step`]s to [`Replay::finish`].
pub fn simulate_with<H: Host>(
    workload: &Workload,
    inventory: &Inventory,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
    make: impl FnOnce(Controller, &SiteNames) -> H,
) -> Result<(SimResult, H), SimError> {
    let mut replay = Replay::new(workload, inventory, cfg, make)?;
    while replay.step(progress)? {}
    replay.finish()
}

/// A replay in progress, as a state machine: [`Replay::new`] builds the site, the controller's host
/// and the fake world and queues the trace; each [`Replay::step`] applies one timestamp's events (one
/// event with `--compat pyss`) and then runs the scheduling pass; [`Replay::finish`] turns what
/// happened into a [`SimResult`]. [`simulate_with`] runs one to the end.
pub struct Replay<'w, H: Host> {
    workload: &'w Workload,
    inventory: &'w Inventory,
    cfg: &'w SimConfig,
    /// pyss's event order: one event per step, submissions before terminations.
    pyss: bool,
    /// The controller's host: every input and pass goes through it.
    ctl: H,
    /// The event queue, the fake quorum and the fake nodes.
    world: world::FakeWorld<'w>,
    checker: Option<InvariantChecker>,
    /// Node ids by name (`node_added` events add to it).
    node_ids: BTreeMap<String, NodeId>,
    /// When each node that joined during the replay joined.
    joined: Vec<Time>,
    /// The site's price series, the trace's price events merged in.
    energy_prices: Vec<(Time, f64)>,
    /// Engine id of each trace tenant and vCluster, by trace index.
    tenant_map: Vec<TenantId>,
    vc_map: Vec<VClusterId>,
    /// Power headroom (kW) after each pass that ran, when the site has a power budget.
    headroom: Vec<f64>,
    /// Starts the passes deferred for energy prices, and for topology.
    deferred: u64,
    deferred_topology: u64,
    preemption_kills: u64,
    /// Node failures (hardware or heartbeat grace) the controller was told of, and how many of them
    /// the failure injector caused.
    node_failures: u64,
    injected: u64,
    /// The failure injector draws no failure after this.
    failure_horizon: Time,
    fail_rng: rand_chacha::ChaCha8Rng,
    /// Trace index of each job by id (only filled when the trace has cluster events: they name jobs).
    job_index: BTreeMap<&'w str, usize>,
    /// The end of the trace (services run until then).
    trace_end: Time,
    scaling: lattice_engine::ScaleStats,
    /// Engine id of each trace job.
    alloc_of: Vec<Option<AllocId>>,
    /// Refused submissions and changes by reason (they join the trace's skipped counts).
    rejected: BTreeMap<String, u64>,
    /// Wall time of each pass that ran.
    pass_ns: Vec<u64>,
    /// Trace jobs in all, and arrived so far (for `progress`).
    total: u64,
    arrived: u64,
    notes: Vec<String>,
    /// The replay is over (queue empty or horizon passed): steps do nothing.
    done: bool,
}

impl<'w, H: Host> Replay<'w, H> {
    /// Sets the replay up: the site's engine (tenants, quotas, vClusters of the trace and the
    /// config), the invariant checker, the controller inside the host `make` builds, and the fake
    /// world with every trace arrival, cluster event, storage outage and first injected failure
    /// queued.
    pub fn new(
        workload: &'w Workload,
        inventory: &'w Inventory,
        cfg: &'w SimConfig,
        make: impl FnOnce(Controller, &SiteNames) -> H,
    ) -> Result<Self, SimError> {
        let pyss = cfg.policy == Policy::PyssEasy || cfg.vclusters.values().any(|v| v.policy == Policy::PyssEasy);
        if pyss && cfg.commit_latency != Duration::ZERO {
            return Err(SimError::PyssLatency);
        }
        let node_ids: BTreeMap<String, NodeId> = inventory
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), NodeId(i as u32)))
            .collect();
        let Site {
            engine,
            energy_prices,
            tenant_map,
            vc_map,
        } = build_engine(workload, inventory, cfg)?;
        let checker = invariant_checker(workload, inventory, cfg);
        let mut ctl = Controller::new(engine);
        ctl.hardened_boot = cfg.hardened_boot.map(|b| b.timeout);
        ctl.check_preemptions = checker.is_some();
        if cfg.decision_log {
            ctl.enable_log();
        }
        let names = SiteNames {
            nodes: inventory.nodes.iter().map(|n| n.name.clone()).collect(),
            tenants: workload
                .tenants
                .names()
                .iter()
                .cloned()
                .zip(tenant_map.iter().copied())
                .collect(),
            projects: project_names(workload),
            vclusters: (0..engine_vclusters(&ctl.controller().engine))
                .map(|i| VClusterId(i as u32))
                .filter_map(|v| Some((ctl.controller().engine.vcluster(v)?.name, v)))
                .collect(),
        };
        let mut ctl = make(ctl, &names);

        let (rank_arrival, rank_end) = if pyss {
            (PYSS_RANK_ARRIVAL, PYSS_RANK_END)
        } else {
            (RANK_ARRIVAL, RANK_END)
        };
        let mut world = fake_world(workload, inventory, cfg, pyss, rank_end, &names);
        // The failure injector: exponential times between failures per node, up to the end of the workload.
        let failure_horizon = cfg.horizon.unwrap_or_else(|| {
            workload
                .jobs
                .iter()
                .map(|j| j.submit + j.spec.lifecycle.walltime().unwrap_or(Duration::ZERO))
                .max()
                .unwrap_or(Time::ZERO)
        });
        let mut fail_rng = {
            use rand_chacha::rand_core::SeedableRng;
            rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed ^ 0xFA11_u64)
        };
        if let Some(fm) = cfg.failures {
            for n in 0..inventory.nodes.len() as u32 {
                let t = Time::ZERO + draw_exp(&mut fail_rng, fm.mtbf);
                if t <= failure_horizon {
                    world.q.push(t, RANK_NODE, EventKind::Inject(n, true));
                }
            }
        }
        // Only the trace's cluster events name jobs by id (a year of jobs without them needs no index).
        let job_index: BTreeMap<&str, usize> = if workload.events.is_empty() {
            BTreeMap::new()
        } else {
            workload
                .jobs
                .iter()
                .enumerate()
                .map(|(i, j)| (j.id.as_str(), i))
                .collect()
        };
        // Services run until the trace ends: the autoscaler stops evaluating then.
        let trace_end = workload
            .jobs
            .iter()
            .map(|j| j.submit)
            .chain(workload.events.iter().map(|e| match e.kind {
                // A synthetic load lasts its duration.
                lattice_traces::TraceEventKind::LoadCurve { duration, .. } => e.time + duration,
                _ => e.time,
            }))
            .max()
            .unwrap_or(Time::ZERO);
        ctl.controller_mut()
            .engine
            .set_autoscale_until(Some(cfg.horizon.unwrap_or(trace_end)));
        for &(down, up) in &cfg.storage_outages {
            world.q.push(down, RANK_END, EventKind::Storage(false));
            world.q.push(up, RANK_END, EventKind::Storage(true));
        }
        for (i, j) in workload.jobs.iter().enumerate() {
            world.q.push(j.submit, rank_arrival, EventKind::Arrival(i));
        }
        Ok(Replay {
            workload,
            inventory,
            cfg,
            pyss,
            ctl,
            world,
            checker,
            node_ids,
            joined: Vec::new(),
            energy_prices,
            tenant_map,
            vc_map,
            headroom: Vec::new(),
            deferred: 0,
            deferred_topology: 0,
            preemption_kills: 0,
            node_failures: 0,
            injected: 0,
            failure_horizon,
            fail_rng,
            job_index,
            trace_end,
            scaling: lattice_engine::ScaleStats::default(),
            alloc_of: vec![None; workload.jobs.len()],
            rejected: BTreeMap::new(),
            pass_ns: Vec::new(),
            total: workload.jobs.len() as u64,
            arrived: 0,
            notes: workload.notes.clone(),
            done: false,
        })
    }

    /// One step of the replay: every event of the next timestamp (only the next event with `--compat
    /// pyss`), then the scheduling pass at that time. `progress(done, total)` is called now and then
    /// with the arrivals processed, and with `(total, total)` when the replay ends. Returns whether
    /// there is more to do: `false` once the queue is empty or its next event is past the horizon
    /// (then call [`Replay::finish`]; further steps do nothing).
    pub fn step(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<bool, SimError> {
        let Some(now) = self.next_time(progress) else {
            return Ok(false);
        };
        // pyss handles one event per step; otherwise all events of the timestamp form one step.
        while let Some(ev) = self.world.q.pop() {
            self.event(now, ev.kind, progress)?;
            if self.pyss || self.world.q.peek_time() != Some(now) {
                break;
            }
        }
        self.pass(now)?;
        Ok(self.next_time(progress).is_some())
    }

    /// The time of the next step, or `None` when the replay is over: the first time that happens, the
    /// replay ends (noting a stop at the horizon) and reports full progress.
    fn next_time(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Option<Time> {
        if self.done {
            return None;
        }
        let next = self.world.q.peek_time();
        match next {
            Some(now) if self.cfg.horizon.is_none_or(|h| now <= h) => return Some(now),
            Some(now) => self
                .notes
                .push(format!("replay stopped at the horizon ({now} is past it)")),
            None => {}
        }
        self.done = true;
        progress(self.total, self.total);
        None
    }

    /// Applies one event at `now`: the world's report becomes the controller's input (stale reports of
    /// ended runs are dropped), then the invariants are re-checked.
    fn event(&mut self, now: Time, kind: EventKind, progress: &mut dyn FnMut(u64, u64)) -> Result<(), SimError> {
        if self.pyss {
            while let Some(&(t, id)) = self.world.pyss_ends.first() {
                if t > now {
                    break;
                }
                self.world.pyss_ends.pop_first();
                self.world.quorum.release(&self.ctl.controller().engine, id);
            }
        }
        let running = |ctl: &H, id: AllocId| {
            ctl.controller()
                .engine
                .allocation(id)
                .is_some_and(|a| a.state == AllocState::Running)
        };
        let input: Option<Input> = match kind {
            EventKind::Arrival(i) => {
                self.arrival(now, i, progress);
                None
            }
            EventKind::Commit(id) => Some(if self.world.quorum.decide(&self.ctl.controller().engine, id) {
                Input::Committed(id)
            } else {
                Input::Rejected(id)
            }),
            EventKind::Wakeup => {
                self.world.wakeups.remove(&now);
                None
            }
            EventKind::Completion(id, reason, epoch) => (epoch == self.world.fake.epoch(id)).then(|| {
                self.world.fake.bump(id, now);
                if reason == EndReason::PreemptionKilled {
                    self.preemption_kills += 1;
                }
                Input::Exited(id, reason)
            }),
            EventKind::PrologueFail(id, node, epoch) => (epoch == self.world.fake.epoch(id) && running(&self.ctl, id))
                .then(|| {
                    self.world.fake.prologue_failures += 1;
                    self.world.fake.bump(id, now);
                    Input::PrologueFailed(id, NodeId(node))
                }),
            EventKind::CheckpointDone(id, epoch) => (epoch == self.world.fake.epoch(id) && running(&self.ctl, id))
                .then(|| {
                    self.world.checkpoint_ok += 1;
                    self.world.fake.event(now, TimelineKind::CheckpointDone);
                    Input::Checkpointed(id, true)
                }),
            EventKind::Storage(up) => Some(Input::Storage(up)),
            EventKind::LoadSample(i, k) => self.load_sample(now, i, k),
            EventKind::Trace(i) => self.trace_event(now, i)?,
            EventKind::Grace(n) => self
                .ctl
                .controller()
                .engine
                .node(NodeId(n))
                .is_some_and(|x| x.state == NodeState::Degraded)
                .then_some(Input::Node(NodeId(n), NodeEvent::GraceTimeout)),
            EventKind::Inject(n, failing) => self.inject(now, n, failing),
            EventKind::WipeDone(id, ok) => Some(Input::WipeDone(id, ok)),
            EventKind::Booted(id, node, ok) => Some(Input::Booted(id, node, ok)),
            EventKind::NodeWiped(id, node, ok) => Some(Input::NodeWiped(id, node, ok)),
            // The allocation may have ended first (walltime beats checkpoint).
            EventKind::Suspend(id, epoch, checkpointed) => (epoch == self.world.fake.epoch(id)).then(|| {
                self.world.fake.bump(id, now);
                Input::Suspended(id, checkpointed)
            }),
        };
        if let Some(input) = input {
            self.ctl
                .apply(now, input, &mut self.world)
                .map_err(|e| refused(now, input, e))?;
            if let Input::Node(_, NodeEvent::HardwareFailure | NodeEvent::GraceTimeout) = input {
                self.node_failures += 1;
                self.world.fake.event(now, TimelineKind::NodeDown);
            }
        }
        if let Some(c) = self.checker.as_mut() {
            c.on_event(&self.ctl.controller().engine, now)
                .map_err(|m| fail(now, m))?;
        }
        Ok(())
    }

    /// The trace job at index `i` arrives: it is submitted with the engine's tenant, vCluster and
    /// dependency ids, or counted as rejected (by reason).
    fn arrival(&mut self, now: Time, i: usize, progress: &mut dyn FnMut(u64, u64)) {
        self.arrived += 1;
        if self.arrived.is_multiple_of(4096) {
            progress(self.arrived, self.total);
        }
        let workload = self.workload;
        let job = &workload.jobs[i];
        let mut spec = job.spec.clone();
        spec.tenant = self.tenant_map[spec.tenant.index()];
        spec.vcluster = self.vc_map[spec.vcluster.index()];
        spec.depends_on = job
            .deps
            .iter()
            .filter_map(|&(d, condition)| self.alloc_of[d].map(|on| Dependency { on, condition }))
            .collect();
        if spec.depends_on.len() != job.deps.len() {
            *self.rejected.entry("dependency_rejected".into()).or_default() += 1;
            return;
        }
        match self.ctl.submit(now, job, spec) {
            Ok(id) => {
                debug_assert_eq!(id.index(), self.world.trace_of.len());
                self.world.trace_of.push(i);
                self.alloc_of[i] = Some(id);
            }
            Err(e) => {
                let reason = match e {
                    lattice_engine::SubmitError::Unsatisfiable { .. } => "unsatisfiable",
                    lattice_engine::SubmitError::PyssConstraints => "pyss_constraints",
                    _ => "rejected",
                };
                *self.rejected.entry(reason.into()).or_default() += 1;
            }
        }
    }

    /// Sample `k` of the synthetic load curve at index `i` of the trace's events: the metric of its
    /// service (when it runs), and the next sample queued until the curve's duration or the service's end.
    fn load_sample(&mut self, now: Time, i: usize, k: u32) -> Option<Input> {
        let ev = &self.workload.events[i];
        let lattice_traces::TraceEventKind::LoadCurve {
            alloc,
            base,
            amplitude,
            period,
            interval,
            duration,
            noise,
        } = &ev.kind
        else {
            return None;
        };
        let Some(&j) = self.job_index.get(alloc.as_str()) else {
            *self.rejected.entry("unknown_metric_alloc".into()).or_default() += 1;
            return None;
        };
        let mut input = None;
        let since = now.since(ev.time);
        // Before the service arrives (or while it waits) there is no metric.
        let id = self.alloc_of[j];
        if let Some(a) = id.and_then(|id| self.ctl.controller().engine.allocation(id))
            && a.state == AllocState::Running
            && let Some(policy) = a.spec.scale.as_deref()
            && !a.nodes.is_empty()
        {
            let demand = load_demand(self.cfg.seed, i, k, since, *base, *amplitude, *period, *noise);
            input = Some(Input::Metric(a.id, policy.target * demand / a.nodes.len() as f64));
        }
        // The curve stops at its duration or when the allocation has ended.
        let ended = id
            .and_then(|id| self.ctl.controller().engine.allocation(id))
            .is_some_and(|a| a.state.is_terminal());
        if !ended && since + *interval <= *duration {
            self.world
                .q
                .push(now + *interval, RANK_NODE, EventKind::LoadSample(i, k + 1));
        }
        input
    }

    /// The trace's cluster event at index `i`: a node joins, an operator or the node changes its
    /// state, or an owner changes an allocation. Returns the node's report for the controller, if any.
    fn trace_event(&mut self, now: Time, i: usize) -> Result<Option<Input>, SimError> {
        self.node_added(now, i);
        Ok(match self.cluster_change(now, i)? {
            None => None,
            Some((name, event)) => self.node_change(&name, event),
        })
    }

    /// A `node_added` event at index `i` of the trace's events: the node joins the site (its home
    /// vCluster resolved by name) and, with the failure injector on, draws its first failure.
    fn node_added(&mut self, now: Time, i: usize) {
        let ev = &self.workload.events[i];
        let lattice_traces::TraceEventKind::NodeAdded(node) = &ev.kind else {
            return;
        };
        let engine = &self.ctl.controller().engine;
        let home = node.vcluster.as_deref().map(|name| {
            (0..engine_vclusters(engine))
                .map(|i| VClusterId(i as u32))
                .find(|&v| engine.vcluster(v).is_some_and(|x| x.name == name))
        });
        if let Some(None) = home {
            *self.rejected.entry("unknown_vcluster".into()).or_default() += 1;
            return;
        }
        let mut node = (**node).clone();
        node.spec.home_vcluster = home.flatten();
        match self.ctl.add_node(now, &node) {
            Ok(n) => {
                self.node_ids.insert(node.spec.name.clone(), n);
                self.world.node_names.push(node.spec.name.clone());
                self.world.quorum.add_node();
                self.joined.push(now);
                if let Some(fm) = self.cfg.failures {
                    let t = now + draw_exp(&mut self.fail_rng, fm.mtbf);
                    if t <= self.failure_horizon {
                        self.world.q.push(t, RANK_NODE, EventKind::Inject(n.0, true));
                    }
                }
            }
            Err(e) => {
                *self.rejected.entry("node_added_refused".into()).or_default() += 1;
                self.notes
                    .push(format!("trace line {}: node_added refused: {e}", ev.line));
            }
        }
    }

    /// The cluster event at index `i` of the trace's events, except `node_added`: changes other than
    /// a node's state are applied here (or counted as refused, by reason); a node's state change is
    /// returned as (node name, event).
    fn cluster_change(&mut self, now: Time, i: usize) -> Result<Option<(String, NodeEvent)>, SimError> {
        use lattice_traces::TraceEventKind as K;
        let ev = &self.workload.events[i];
        let node_of = |name: &str| self.node_ids.get(name).copied();
        let node_change = |node: &String, event: NodeEvent| Some((node.clone(), event));
        let change = match &ev.kind {
            K::NodeFail { node, heartbeat } => node_change(
                node,
                if *heartbeat {
                    NodeEvent::HeartbeatMiss
                } else {
                    NodeEvent::HardwareFailure
                },
            ),
            K::NodeRecover { node } => node_change(node, NodeEvent::Enable),
            K::Drain { node } => node_change(node, NodeEvent::Drain),
            K::Undrain { node } => node_change(node, NodeEvent::Undrain),
            K::Drift { node, drifted } => {
                match node_of(node) {
                    Some(n) => {
                        let input = Input::Conformance(n, *drifted);
                        self.ctl
                            .apply(now, input, &mut self.world)
                            .map_err(|e| refused(now, input, e))?;
                    }
                    None => *self.rejected.entry("unknown_node".into()).or_default() += 1,
                }
                None
            }
            K::WipeRetry { node } => {
                match node_of(node) {
                    Some(n) => match self.ctl.apply(now, Input::RetryWipe(n), &mut self.world) {
                        Err(lattice_engine::ControlError::NotQuarantined(_)) => {
                            *self.rejected.entry("wipe_retry_not_quarantined".into()).or_default() += 1
                        }
                        r => r.map_err(|e| refused(now, Input::RetryWipe(n), e))?,
                    },
                    None => *self.rejected.entry("unknown_node".into()).or_default() += 1,
                }
                None
            }
            K::EnergyPrice { .. } => None, // merged into the price series up front
            K::NodeAdded(_) => None,       // added by `node_added`
            K::Metric { alloc, value } => {
                match self.job_index.get(alloc.as_str()).and_then(|&i| self.alloc_of[i]) {
                    Some(id) => {
                        let _ = self.ctl.apply(now, Input::Metric(id, *value), &mut self.world);
                    }
                    None => *self.rejected.entry("unknown_metric_alloc".into()).or_default() += 1,
                }
                None
            }
            K::PrologueFail { node } => {
                match node_of(node) {
                    Some(n) => {
                        self.world.fake.bad_image.insert(n);
                    }
                    None => *self.rejected.entry("unknown_node".into()).or_default() += 1,
                }
                None
            }
            K::LoadCurve { .. } => {
                self.world.q.push(now, RANK_NODE, EventKind::LoadSample(i, 0));
                None
            }
            K::StorageOutage => {
                self.ctl
                    .apply(now, Input::Storage(false), &mut self.world)
                    .map_err(|e| refused(now, Input::Storage(false), e))?;
                None
            }
            K::Weights { vcluster, weights } => {
                let engine = &self.ctl.controller().engine;
                let vc = (0..engine_vclusters(engine))
                    .map(|i| VClusterId(i as u32))
                    .find(|&v| engine.vcluster(v).is_some_and(|x| &x.name == vcluster));
                match vc {
                    Some(v)
                        if self
                            .ctl
                            .apply(now, Input::Weights(v, *weights), &mut self.world)
                            .is_ok() => {}
                    Some(_) => *self.rejected.entry("change_refused".into()).or_default() += 1,
                    None => *self.rejected.entry("unknown_vcluster".into()).or_default() += 1,
                }
                None
            }
            K::Cancel { alloc } | K::Walltime { alloc, .. } => {
                // A change by its owner: refused (and counted) when it cannot apply, e.g. the
                // allocation already ended.
                let input = self
                    .job_index
                    .get(alloc.as_str())
                    .and_then(|&i| self.alloc_of[i])
                    .map(|id| match &ev.kind {
                        K::Walltime { walltime, .. } => Input::Walltime(id, *walltime),
                        _ => Input::Cancel(id),
                    });
                let live = input.is_some_and(|i| match i {
                    Input::Cancel(id) | Input::Walltime(id, _) => self
                        .ctl
                        .controller()
                        .engine
                        .allocation(id)
                        .is_some_and(|a| !a.state.is_terminal()),
                    _ => false,
                });
                match input {
                    Some(i) if live && self.ctl.apply(now, i, &mut self.world).is_ok() => {}
                    Some(_) => *self.rejected.entry("change_refused".into()).or_default() += 1,
                    None => *self.rejected.entry("unknown_alloc".into()).or_default() += 1,
                }
                None
            }
            K::StorageRecover => {
                self.ctl
                    .apply(now, Input::Storage(true), &mut self.world)
                    .map_err(|e| refused(now, Input::Storage(true), e))?;
                None
            }
        };
        Ok(change)
    }

    /// A trace's state change of the node `name`: the node's report for the controller (`None` for an
    /// unknown node, counted, or a recovery with nothing left to recover).
    fn node_change(&mut self, name: &str, event: NodeEvent) -> Option<Input> {
        let Some(n) = self.node_ids.get(name).copied() else {
            *self.rejected.entry("unknown_node".into()).or_default() += 1;
            return None;
        };
        let engine = &self.ctl.controller().engine;
        let mut event = Some(event);
        if event == Some(NodeEvent::Enable) {
            // Recovery also repairs a broken image cache; a node that only had that is done.
            let had_image = self.world.fake.bad_image.remove(&n);
            if had_image && engine.node(n).is_some_and(|x| x.state == NodeState::Ready) {
                event = None;
            }
        }
        // A recovery undoes whatever state the failure left.
        event.map(|e| match (e, engine.node(n).map(|x| x.state)) {
            (NodeEvent::Enable, Some(NodeState::Degraded)) => Input::Node(n, NodeEvent::HeartbeatResume),
            (e, _) => Input::Node(n, e),
        })
    }

    /// The failure injector fails (`failing`) or repairs node `n`: a failure is reported (unless the
    /// node is already down) and its repair queued; a repair re-enables a down node and draws its next
    /// failure.
    fn inject(&mut self, now: Time, n: u32, failing: bool) -> Option<Input> {
        let state = self.ctl.controller().engine.node(NodeId(n)).map(|x| x.state);
        let mut input = None;
        if failing {
            if state != Some(NodeState::Down) {
                self.injected += 1;
                input = Some(Input::Node(NodeId(n), NodeEvent::HardwareFailure));
            }
            if let Some(fm) = self.cfg.failures {
                self.world
                    .q
                    .push(now + fm.repair, RANK_NODE, EventKind::Inject(n, false));
            }
        } else {
            if state == Some(NodeState::Down) {
                let _ = self
                    .ctl
                    .apply(now, Input::Node(NodeId(n), NodeEvent::Enable), &mut self.world);
            }
            if let Some(fm) = self.cfg.failures {
                let next = now + draw_exp(&mut self.fail_rng, fm.mtbf);
                if next <= self.failure_horizon {
                    self.world.q.push(next, RANK_NODE, EventKind::Inject(n, true));
                }
            }
        }
        input
    }

    /// The scheduling pass at `now` (timed; the engine's policy may skip it), its scaling and
    /// deferral counts and power headroom, then the dispatch of what it decided.
    fn pass(&mut self, now: Time) -> Result<(), SimError> {
        let t0 = std::time::Instant::now();
        let stats = self.ctl.schedule(now);
        let elapsed = t0.elapsed();
        let sc = self.ctl.controller().engine.scale_stats();
        self.scaling.ups += sc.ups;
        self.scaling.downs += sc.downs;
        self.scaling.oscillation_alerts += sc.oscillation_alerts;
        self.scaling.blocked += sc.blocked;
        self.scaling.metric_unavailable += sc.metric_unavailable;
        if stats.ran {
            self.pass_ns.push(elapsed.as_nanos() as u64);
            self.deferred += stats.deferred as u64;
            self.deferred_topology += stats.deferred_topology as u64;
            if let Some(b) = self.inventory.power_budget_w {
                self.headroom
                    .push(b.saturating_sub(self.ctl.controller().engine.power_used_w()) as f64 / 1000.0);
            }
        }
        self.ctl
            .dispatch(now, &mut self.world)
            .map_err(|e| fail(now, e.to_string()))?;
        if stats.ran
            && let Some(c) = self.checker.as_mut()
        {
            c.after_pass(&self.ctl.controller().engine, now)
                .map_err(|m| fail(now, m))?;
        }
        Ok(())
    }

    /// Ends the replay: one record per trace job, the metrics and the summary, the audit log, the
    /// timeline and the decision log, with the controller's host. Events still queued (past the
    /// horizon, or when stepping stopped early) are not processed: what runs or waits is unfinished.
    pub fn finish(self) -> Result<(SimResult, H), SimError> {
        let Replay {
            workload,
            inventory,
            cfg,
            mut ctl,
            world,
            checker,
            joined,
            energy_prices,
            headroom,
            deferred,
            deferred_topology,
            preemption_kills,
            node_failures,
            injected,
            trace_end,
            scaling,
            rejected,
            pass_ns,
            mut notes,
            ..
        } = self;
        let decisions = ctl.controller_mut().take_log();
        let engine = &ctl.controller().engine;
        let world::FakeWorld {
            mut quorum,
            mut fake,
            trace_of,
            checkpoint_attempts,
            checkpoint_ok,
            ..
        } = world;
        if fake.defaulted_runtime > 0 {
            notes.push(format!(
                "{} allocations had no run time in the trace (no `complete` event): they ran to their walltime",
                fake.defaulted_runtime
            ));
        }

        let node_facts: Vec<(u32, u32, u64)> = engine
            .nodes()
            .iter()
            .map(|n| (n.spec.capabilities.gpu_count, n.spec.group.0, n.spec.conformance.0))
            .collect();
        let node_power: Vec<u32> = engine.nodes().iter().map(|n| n.spec.capabilities.power_w).collect();
        let mut jobs = records(engine, workload, &trace_of, &node_facts);
        // Node-time held: the sum of each ended allocation's runs.
        let mut held = vec![0.0f64; jobs.len()];
        for r in &fake.timeline.runs {
            if let (Some(e), Some(h)) = (r.end_s, held.get_mut(r.job as usize)) {
                *h += e - r.start_s;
            }
        }
        for (j, h) in jobs.iter_mut().zip(held) {
            j.run_s = j.end_s.map(|_| metrics::round6(h));
        }
        let mut skipped = workload.skipped.clone();
        for (k, v) in rejected {
            *skipped.entry(k).or_default() += v;
        }
        let cost = EngineCost::from_nanos(pass_ns);
        let (dags, groups) = workflow_metrics(workload, &trace_of, &jobs);
        let mut summary = summarize(workload, engine, cfg, &jobs, skipped, &joined, &quorum, notes);
        summary.cycle_cpu_ms_mean = cost.cycle_cpu_ms_mean;
        summary.cycle_cpu_ms_p99 = cost.cycle_cpu_ms_p99;
        summary.deferred_for_energy = deferred;
        summary.borrowed_node_hours = metrics::round6(
            jobs.iter()
                .filter_map(|j| Some(j.borrowed as f64 * j.run_s? / 3600.0))
                .sum::<f64>(),
        );
        staging_metrics(&mut summary, engine, fake.stall_ms);
        summary.scale_ups = scaling.ups as u64;
        summary.scale_downs = scaling.downs as u64;
        summary.scale_blocked = scaling.blocked as u64;
        summary.scale_metric_unavailable = scaling.metric_unavailable as u64;
        summary.oscillation_alerts = scaling.oscillation_alerts as u64;
        service_metrics(&mut summary, engine, cfg.horizon.unwrap_or(trace_end));
        summary.mean_dag_stretch = if dags.is_empty() {
            0.0
        } else {
            metrics::round6(dags.values().map(|d| d.stretch).sum::<f64>() / dags.len() as f64)
        };
        summary.dags = dags;
        summary.task_groups = groups;
        summary.node_failures = node_failures;
        summary.injected_failures = injected;
        summary.requeues = engine.allocations().iter().map(|a| a.requeues as u64).sum();
        summary.prologue_failures = fake.prologue_failures;
        // Nodes that draw no power (every SWF replay) use none: no walk over every allocation's nodes.
        let (kwh, energy_cost) = if node_power.iter().all(|&w| w == 0) {
            (0.0, 0.0)
        } else {
            energy_use(&summary_jobs_energy(engine, &node_power), &energy_prices)
        };
        summary.energy_kwh = kwh;
        summary.energy_cost = energy_cost;
        controller_stats(&mut summary, ctl.controller());
        summary.preemption_kills = preemption_kills;
        summary.checkpoint_success_rate = if checkpoint_attempts > 0 {
            metrics::round6(checkpoint_ok as f64 / checkpoint_attempts as f64)
        } else {
            1.0
        };
        summary.quota_rejections = quorum.rejections_by_reason.clone();
        summary.rejection_examples = quorum.rejection_examples.clone();
        summary.deferred_for_topology = deferred_topology;
        if let Some(b) = inventory.power_budget_w {
            summary.power_budget_kw = Some(b as f64 / 1000.0);
            summary.min_power_headroom_kw = headroom.iter().copied().reduce(f64::min).map(metrics::round6);
            summary.mean_power_headroom_kw =
                (!headroom.is_empty()).then(|| metrics::round6(headroom.iter().sum::<f64>() / headroom.len() as f64));
        }
        summary.audit_entries = quorum.audit.entries().len() as u64;
        summary.audit_chain_valid = audit::AuditLog::verify(quorum.audit.entries()).is_ok();
        sensitive_metrics(&mut summary, engine);
        let configured: BTreeMap<String, f64> = cfg
            .tenants
            .iter()
            .filter_map(|(t, q)| q.fair_share_target.map(|x| (t.clone(), x)))
            .collect();
        let tenant_targets = metrics::effective_targets(summary.per_tenant.keys(), &configured);
        // Moved out of the engine, not copied: a year's replay holds one breakdown per started job.
        let scores = ctl
            .controller_mut()
            .engine
            .take_start_scores()
            .into_iter()
            .map(|(id, b)| (id.index() as u32, b))
            .collect();
        let result = SimResult {
            summary,
            jobs,
            scores,
            audit: std::mem::take(&mut quorum.audit),
            cost,
            invariant_checks: checker.map_or(0, |c| c.checks),
            timeline: {
                let mut t = std::mem::take(&mut fake.timeline);
                // Checkpoint outcomes are logged when decided; order every event by time (stable).
                t.events.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
                t
            },
            tenant_targets,
            decisions,
        };
        Ok((result, ctl))
    }
}

/// An invariant the checker found violated at `time`.
fn fail(time: Time, message: String) -> SimError {
    SimError::Invariant { time, message }
}

/// The controller refused an input the world reported at `time` (the replay cannot go on).
fn refused(time: Time, input: Input, e: ControlError) -> SimError {
    SimError::Invariant {
        time,
        message: format!("{input:?} refused by the controller: {e}"),
    }
}

/// The engine [`build_engine`] sets up, with what the replay keeps of its setup.
struct Site {
    engine: Engine,
    /// The site's price series, the trace's price events merged in.
    energy_prices: Vec<(Time, f64)>,
    /// Engine id of each trace tenant and vCluster, by trace index.
    tenant_map: Vec<TenantId>,
    vc_map: Vec<VClusterId>,
}

/// The site as the runtime builds it, with the trace's tenants, projects and vClusters and the
/// config's quotas and vCluster configs.
fn build_engine(workload: &Workload, inventory: &Inventory, cfg: &SimConfig) -> Result<Site, SimError> {
    // Price events of the trace join the site's series (prices are published ahead).
    let trace_prices: Vec<(Time, f64)> = workload
        .events
        .iter()
        .filter_map(|e| match e.kind {
            lattice_traces::TraceEventKind::EnergyPrice { price } => Some((e.time, price)),
            _ => None,
        })
        .collect();
    // The inventory's vClusters come first (node homes refer to them).
    let mut engine = lattice_traces::site_engine(
        inventory,
        cfg.policy,
        cfg.fair_share,
        cfg.sensitive_pool_size,
        &trace_prices,
    )?;
    let energy_prices = engine.config().energy_prices.clone();
    let tenant_map: Vec<TenantId> = workload.tenants.names().iter().map(|n| engine.add_tenant(n)).collect();
    for (name, q) in &cfg.tenants {
        let Some(i) = workload.tenants.lookup(name) else {
            return Err(SimError::UnusedTenant(name.clone()));
        };
        engine.set_tenant_quota(tenant_map[i as usize], *q);
    }
    for (tenant, projects) in &cfg.projects {
        for (name, q) in projects {
            let (Some(t), Some(p)) = (workload.tenants.lookup(tenant), workload.project_id(tenant, name)) else {
                return Err(SimError::UnusedProject(tenant.clone(), name.clone()));
            };
            engine.set_project_quota(p, tenant_map[t as usize], *q);
        }
    }
    let vc_map: Vec<VClusterId> = workload
        .vclusters
        .names()
        .iter()
        .map(|n| engine.add_vcluster(n))
        .collect();
    for (name, vc) in &cfg.vclusters {
        let id = (0..engine_vclusters(&engine))
            .map(|i| VClusterId(i as u32))
            .find(|&v| engine.vcluster(v).is_some_and(|x| &x.name == name))
            .ok_or_else(|| SimError::UnusedVCluster(name.clone()))?;
        engine.configure_vcluster(id, vc.clone())?;
    }
    Ok(Site {
        engine,
        energy_prices,
        tenant_map,
        vc_map,
    })
}

/// The invariant checker, when the config asks for one; it also checks that promised starts never
/// move later when that must hold (or when the config asks for it).
fn invariant_checker(workload: &Workload, inventory: &Inventory, cfg: &SimConfig) -> Option<InvariantChecker> {
    let has_deps = workload.jobs.iter().any(|j| !j.deps.is_empty());
    cfg.check_invariants.then(|| {
        // Promises only stay monotone under arrival order with one reservation (EASY-style).
        let easy_like = |p: Policy| matches!(p, Policy::PyssEasy) || p == Policy::EASY;
        let arrival_easy = easy_like(cfg.policy)
            && cfg
                .vclusters
                .values()
                .all(|v| easy_like(v.policy) && v.weights.is_none());
        // Per-cycle dimensions (quotas, power, storage, budgets) are not part of reservations, so they may
        // hold a job past its promised start legitimately.
        let per_cycle_limits = cfg
            .tenants
            .values()
            .any(|q| q.max_nodes.is_some() || q.max_concurrent_allocations.is_some())
            || cfg.projects.values().flat_map(|p| p.values()).any(|q| q.is_hard())
            || cfg.sensitive_pool_size.is_some()
            || inventory.power_budget_w.is_some()
            || inventory.storage_bandwidth_gbps.is_some()
            || cfg.vclusters.values().any(|v| v.gpu_hours_budget.is_some())
            // Sensitive claims jump every queue and wipe nodes afterwards.
            || workload.jobs.iter().any(|j| j.spec.sensitive_claim)
            // Lost nodes and requeues legitimately push promised starts back.
            || cfg.failures.is_some()
            // A SIGTERM grace lets jobs overrun their walltime, so the profile under-estimates ends.
            || cfg.walltime_grace > Duration::ZERO
            || !workload.events.is_empty();
        InvariantChecker::new(
            cfg.check_all_promises
                || (arrival_easy && cfg.commit_latency == Duration::ZERO && !has_deps && !per_cycle_limits),
        )
    })
}

/// The fake world of a replay, with the trace's cluster events queued (`rank_end`: the rank of the
/// world's reports at equal times).
fn fake_world<'w>(
    workload: &'w Workload,
    inventory: &Inventory,
    cfg: &SimConfig,
    pyss: bool,
    rank_end: u8,
    names: &SiteNames,
) -> world::FakeWorld<'w> {
    let mut world = world::FakeWorld {
        q: EventQueue::default(),
        rank_end,
        quorum: FakeQuorum::new(inventory.nodes.len(), cfg.sensitive_pool_size),
        commit_latency: cfg.commit_latency,
        fake: world::FakeNodes::default(),
        workload,
        node_names: inventory.nodes.iter().map(|n| n.name.clone()).collect(),
        trace_of: Vec::with_capacity(workload.jobs.len()),
        walltime_grace: cfg.walltime_grace,
        wipe: cfg.wipe,
        boot: cfg.hardened_boot,
        wipe_rng: {
            use rand_chacha::rand_core::SeedableRng;
            rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5EED_5E45_u64)
        },
        wakeups: BTreeSet::new(),
        pyss,
        pyss_ends: BTreeSet::new(),
        checkpoint_attempts: 0,
        checkpoint_ok: 0,
    };
    world.quorum.project_names = vec![String::new(); workload.projects.len()];
    for (_, name, p) in &names.projects {
        world.quorum.project_names[p.index()] = name.clone();
    }
    for (i, e) in workload.events.iter().enumerate() {
        world.q.push(e.time, RANK_NODE, EventKind::Trace(i));
    }
    world
}

/// Staging metrics: allocations staged, the queue time staging used, stalls and alerts.
fn staging_metrics(summary: &mut Summary, engine: &Engine, stall_ms: u64) {
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
fn service_metrics(summary: &mut Summary, engine: &Engine, until: Time) {
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
fn controller_stats(summary: &mut Summary, ctl: &Controller) {
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
}

/// Sensitive claims and the longest wait of one that started.
fn sensitive_metrics(summary: &mut Summary, engine: &Engine) {
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
fn workflow_metrics(
    workload: &Workload,
    trace_of: &[usize],
    jobs: &[JobRecord],
) -> (
    BTreeMap<String, metrics::DagMetrics>,
    BTreeMap<String, metrics::TaskGroupMetrics>,
) {
    let mut rec: Vec<Option<&JobRecord>> = vec![None; workload.jobs.len()];
    for (a, &t) in trace_of.iter().enumerate() {
        rec[t] = jobs.get(a);
    }
    let run = |i: usize| rec[i].and_then(|r| r.run_s).unwrap_or(0.0);
    let mut dags: BTreeMap<String, metrics::DagMetrics> = BTreeMap::new();
    // Longest path (run times) ending at each job; deps always point to earlier jobs.
    let mut path = vec![0.0f64; workload.jobs.len()];
    for (i, j) in workload.jobs.iter().enumerate() {
        let before = j.deps.iter().map(|&(d, _)| path[d]).fold(0.0, f64::max);
        path[i] = before + run(i);
        let Some(d) = &j.dag else { continue };
        let m = dags.entry(d.clone()).or_insert_with(|| metrics::DagMetrics {
            submit_s: j.submit.as_secs_f64(),
            ..Default::default()
        });
        m.allocations += 1;
        let r = rec[i];
        match r.map(|r| r.state) {
            Some("completed") => m.completed += 1,
            Some("failed") => m.failed += 1,
            Some("cancelled") => m.cancelled += 1,
            _ => m.unfinished += 1,
        }
        if let Some(e) = r.and_then(|r| r.end_s) {
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
        let Some(g) = &j.group_name else { continue };
        let m = groups.entry(g.clone()).or_insert_with(|| metrics::TaskGroupMetrics {
            first_start_s: f64::INFINITY,
            ..Default::default()
        });
        m.elements += 1;
        if let Some(r) = rec[i] {
            if r.state == "completed" {
                m.completed += 1;
            }
            if let Some(s) = r.start_s {
                m.first_start_s = m.first_start_s.min(s);
            }
            if let Some(e) = r.end_s {
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

/// `(start, end, kW)` of every run that ended (current runs of requeued/preempted allocations only).
fn summary_jobs_energy(engine: &Engine, power_w: &[u32]) -> Vec<(Time, Time, f64)> {
    engine
        .allocations()
        .iter()
        .filter_map(|a| {
            let kw = a.nodes.iter().map(|n| power_w[n.index()] as f64).sum::<f64>() / 1000.0;
            Some((a.started?, a.ended?, kw))
        })
        .collect()
}

/// Energy (kWh) and its cost under the price series (price per kWh, step function; before the first
/// point the first price applies; no series = cost 0).
fn energy_use(runs: &[(Time, Time, f64)], prices: &[(Time, f64)]) -> (f64, f64) {
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
fn load_demand(
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
fn draw_exp(rng: &mut rand_chacha::ChaCha8Rng, mean: Duration) -> Duration {
    use rand_chacha::rand_core::Rng;
    let u = ((rng.next_u64() >> 11) as f64 + 1.0) / ((1u64 << 53) as f64 + 1.0);
    Duration((-(u.ln()) * mean.as_millis() as f64).round().max(1.0) as u64)
}

/// `(gpus, group, conformance fingerprint)` per node.
type NodeFacts = [(u32, u32, u64)];

/// (groups spanned, nodes in the largest same-fingerprint subset) of a placement; O(nodes × distinct).
fn placement_shape(nodes: &[lattice_engine::NodeId], facts: &NodeFacts) -> (u32, u32) {
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

fn records(engine: &Engine, workload: &Workload, trace_of: &[usize], facts: &NodeFacts) -> Vec<JobRecord> {
    // One group and one fingerprint everywhere (every SWF replay): every placement spans 1 group.
    let uniform = facts.windows(2).all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
    engine
        .allocations()
        .iter()
        .map(|a| {
            let job = &workload.jobs[trace_of[a.id.index()]];
            let shape = a.started.map(|_| {
                if uniform {
                    (1, a.nodes.len() as u32)
                } else {
                    placement_shape(&a.nodes, facts)
                }
            });
            // A preempted allocation waited until its first start; its run spans every run since.
            let first = a.first_started;
            let wait = first.map(|s| s.since(a.submitted));
            let bsld = match (first, a.ended) {
                (Some(s), Some(e)) => Some(metrics::bounded_slowdown(s.since(a.submitted), e.since(s))),
                _ => None,
            };
            JobRecord {
                id: job.id.clone(),
                submit_s: a.submitted.as_secs_f64(),
                start_s: first.map(Time::as_secs_f64),
                end_s: first.and(a.ended).map(Time::as_secs_f64),
                nodes: if a.started.is_some() {
                    a.nodes.len() as u32
                } else {
                    a.spec.nodes.min
                },
                wait_s: wait.map(Duration::as_secs_f64),
                bsld,
                backfilled: a.backfilled && a.started.is_some(),
                tenant: engine.tenant(a.spec.tenant).map(|t| t.name).unwrap_or_default(),
                vcluster: engine.vcluster(a.spec.vcluster).map(|v| v.name).unwrap_or_default(),
                state: a.state.as_str(),
                reason: a.end_reason.map_or("", |r| r.as_str()),
                gpus: a.nodes.iter().map(|n| facts[n.index()].0).sum(),
                groups: shape.map(|s| s.0),
                conformance: shape
                    .filter(|_| !a.nodes.is_empty())
                    .map(|s| metrics::round6(s.1 as f64 / a.nodes.len() as f64)),
                class: a.spec.preemption_class.get(),
                score: a.start_score.as_ref().map(|s| metrics::round6(s.total)),
                preempted: a.preempted,
                borrowed: engine.borrowed_nodes(a.id),
                run_s: None,
            }
        })
        .collect()
    // Allocation ids follow submission order, which is the workload's (trace) order: no sort needed.
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    workload: &Workload,
    engine: &Engine,
    cfg: &SimConfig,
    jobs: &[JobRecord],
    skipped: BTreeMap<String, u64>,
    joined: &[Time],
    quorum: &FakeQuorum,
    notes: Vec<String>,
) -> Summary {
    let total_nodes = engine.nodes().len() as u32;
    let first_submit = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let last_end = jobs.iter().filter_map(|j| j.end_s).fold(f64::NEG_INFINITY, f64::max);
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
    let mut by_tenant: BTreeMap<&str, Vec<&JobRecord>> = BTreeMap::new();
    let mut by_vcluster: BTreeMap<&str, Vec<&JobRecord>> = BTreeMap::new();
    for j in jobs {
        by_tenant.entry(&j.tenant).or_default().push(j);
        by_vcluster.entry(&j.vcluster).or_default().push(j);
    }
    let group = |m: BTreeMap<&str, Vec<&JobRecord>>| -> BTreeMap<String, GroupMetrics> {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), metrics::group_metrics(v.into_iter(), capacity)))
            .collect()
    };
    let mut by_class: BTreeMap<String, Vec<&JobRecord>> = BTreeMap::new();
    for j in jobs {
        by_class.entry(format!("{:02}", j.class)).or_default().push(j);
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
    let spans: Vec<u32> = jobs.iter().filter_map(|j| j.groups).collect();
    let conf: Vec<f64> = jobs.iter().filter_map(|j| j.conformance).collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            metrics::round6(v.iter().sum::<f64>() / v.len() as f64)
        }
    };
    let count = |s: AllocState| engine.allocations().iter().filter(|a| a.state == s).count() as u64;
    let ended: Vec<&JobRecord> = jobs.iter().filter(|j| j.end_s.is_some()).collect();
    let turnaround: f64 = ended.iter().map(|j| j.end_s.unwrap_or(0.0) - j.submit_s).sum();
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
        unfinished: jobs.iter().filter(|j| j.end_s.is_none()).count() as u64,
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
