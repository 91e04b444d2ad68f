//! The replay as a state machine ([`Replay`]): `new` builds the site and queues the trace, `step`
//! handles one timestamp's events (one event under pyss) and its pass, `finish` collects the result.

use crate::audit;
use crate::config::{SimConfig, SimError, SimResult};
use crate::events::{EventKind, EventQueue, PYSS_RANK_ARRIVAL, PYSS_RANK_END, RANK_ARRIVAL, RANK_END, RANK_NODE};
use crate::facts::JobFacts;
use crate::host::{Host, SiteNames};
use crate::invariants::InvariantChecker;
use crate::metrics::{self, EngineCost, JobRecord};
use crate::quorum::FakeQuorum;
use crate::summary;
use crate::summary::*;
use crate::timeline::TimelineKind;
use crate::world;
use lattice_engine::{
    AllocId, AllocState, ControlError, Controller, Dependency, Duration, EndReason, Engine, Input, NodeEvent, NodeId,
    NodeState, Policy, TenantId, Time, VClusterId,
};
use lattice_traces::{Inventory, Workload};
use std::collections::{BTreeMap, BTreeSet};

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
    /// The nodes each ended allocation held at its end, as ranges, by allocation index (the engine
    /// keeps no list for them).
    ended_nodes: Vec<Option<NodeRanges>>,
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
        ctl.wipe_timeout = cfg.wipe.timeout;
        ctl.preemption_report_grace = cfg.preemption_reports.map(|r| r.grace);
        ctl.durable_ends = cfg.durability.is_some();
        if let Some(n) = cfg.network {
            let pool = lattice_engine::VniPool::new(n.vni_pool_start, n.vni_pool_end)?;
            ctl.network = Some(lattice_engine::NetworkDomains::new(pool, n.grace));
        }
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
        ctl.controller_mut().engine.track_ended();
        ctl.controller_mut().reserve_allocations(workload.jobs.len());

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
            ended_nodes: Vec::new(),
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
                self.arrival(now, i, progress)?;
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
            EventKind::Durable(record) => Some(Input::Durable(record)),
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
    fn arrival(&mut self, now: Time, i: usize, progress: &mut dyn FnMut(u64, u64)) -> Result<(), SimError> {
        self.arrived += 1;
        if self.arrived.is_multiple_of(4096) {
            progress(self.arrived, self.total);
        }
        let workload = self.workload;
        let job = &workload.jobs[i];
        // The trace's own request, shared with the engine, unless its ids or dependencies must be
        // rewritten for the engine (then the engine gets a changed copy).
        let mut spec = job.spec.clone();
        let (tenant, vcluster) = (self.tenant_map[spec.tenant.index()], self.vc_map[spec.vcluster.index()]);
        if tenant != spec.tenant || vcluster != spec.vcluster || !job.deps.is_empty() {
            let s = std::sync::Arc::make_mut(&mut spec);
            s.tenant = tenant;
            s.vcluster = vcluster;
            s.depends_on = job
                .deps
                .iter()
                .filter_map(|&(d, condition)| self.alloc_of[d].map(|on| Dependency { on, condition }))
                .collect();
            if s.depends_on.len() != job.deps.len() {
                *self.rejected.entry("dependency_rejected".into()).or_default() += 1;
                return Ok(());
            }
        }
        match self.ctl.submit(now, job, spec) {
            Ok(id) => {
                debug_assert_eq!(id.index(), self.world.trace_of.len());
                self.world.trace_of.push(i);
                self.alloc_of[i] = Some(id);
                if let Some(m) = self.world.durability {
                    // On the leader's disk only, until the mirrors' latency has passed.
                    let record = lattice_engine::Durable::Submission(id);
                    let input = Input::NotDurable(record);
                    self.ctl
                        .apply(now, input, &mut self.world)
                        .map_err(|e| refused(now, input, e))?;
                    self.world
                        .q
                        .push(now + m.record_latency, RANK_END, EventKind::Durable(record));
                }
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
        Ok(())
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
            // An operator's drain is a standing order (it holds through failures and recoveries);
            // an undrain lifts it and undrains the node, as `lattice admin node undrain` does.
            K::Drain { node } | K::Undrain { node } => {
                let drained = matches!(ev.kind, K::Drain { .. });
                match node_of(node) {
                    Some(n) => {
                        let was = self.ctl.controller().order(n);
                        let lifted = was.drained && !drained;
                        let order = lattice_engine::NodeOrder { drained, ..was };
                        let input = Input::Order(n, order);
                        self.ctl
                            .apply(now, input, &mut self.world)
                            .map_err(|e| refused(now, input, e))?;
                        // Lifting the order undrains the node; one drained otherwise (a sensitive
                        // node after a drift) is undrained as such (one not drained has nothing to undrain).
                        let state = self.ctl.controller().engine.node(n).map(|x| x.state);
                        let undrain =
                            !drained && !lifted && matches!(state, Some(NodeState::Draining | NodeState::Drained));
                        if undrain {
                            node_change(node, NodeEvent::Undrain)
                        } else {
                            None
                        }
                    }
                    None => {
                        *self.rejected.entry("unknown_node".into()).or_default() += 1;
                        None
                    }
                }
            }
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
            K::CheckpointBandwidth { gbps } => {
                let input = Input::CheckpointBandwidth(*gbps);
                self.ctl
                    .apply(now, input, &mut self.world)
                    .map_err(|e| refused(now, input, e))?;
                None
            }
            K::GpuMemory { node, gb } => {
                match node_of(node) {
                    Some(n) => {
                        let input = Input::GpuMemory(n, *gb);
                        self.ctl
                            .apply(now, input, &mut self.world)
                            .map_err(|e| refused(now, input, e))?;
                    }
                    None => *self.rejected.entry("unknown_node".into()).or_default() += 1,
                }
                None
            }
            K::NodeAdded(_) => None, // added by `node_added`
            K::NodeCapabilities { node, capabilities } => {
                match node_of(node) {
                    Some(n) => {
                        if let Err(e) = self.ctl.set_capabilities(now, n, capabilities) {
                            *self.rejected.entry("node_capabilities_refused".into()).or_default() += 1;
                            self.notes
                                .push(format!("trace line {}: node_capabilities refused: {e}", ev.line));
                        }
                    }
                    None => *self.rejected.entry("unknown_node".into()).or_default() += 1,
                }
                None
            }
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
            K::Settings { settings } => {
                self.ctl.settings(now, settings);
                None
            }
            K::VCluster { vcluster, config } => {
                let engine = &self.ctl.controller().engine;
                let vc = (0..engine_vclusters(engine))
                    .map(|i| VClusterId(i as u32))
                    .find(|&v| engine.vcluster(v).is_some_and(|x| &x.name == vcluster));
                // The keys given change; the others stay as the vCluster has them now.
                let cfg = vc.and_then(|v| engine.vcluster_config(v).map(|c| (v, c)));
                match cfg.map(|(v, c)| (v, lattice_traces::apply_config(c, config))) {
                    Some((v, Ok(c))) if self.ctl.apply(now, Input::VCluster(v, c), &mut self.world).is_ok() => {}
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
        self.keep_ended_nodes();
        Ok(())
    }

    /// Moves the node list of every allocation that ended out of the engine into ranges (a year's
    /// ended allocations would otherwise hold some 100 node ids each until their records are taken).
    fn keep_ended_nodes(&mut self) {
        let engine = &mut self.ctl.controller_mut().engine;
        for id in engine.take_ended() {
            let nodes = engine.take_nodes(id);
            if nodes.is_empty() {
                continue; // held none, or the engine keeps them (sensitive)
            }
            if self.ended_nodes.len() <= id.index() {
                self.ended_nodes.resize(id.index() + 1, None);
            }
            self.ended_nodes[id.index()] = Some(crate::timeline::node_ranges(&nodes).into_boxed_slice());
        }
    }

    /// Ends the replay: one record per trace job, the metrics and the summary, the audit log, the
    /// timeline and the decision log, with the controller's host. Events still queued (past the
    /// horizon, or when stepping stopped early) are not processed: what runs or waits is unfinished.
    pub fn finish(self) -> Result<(SimResult, H), SimError> {
        self.finish_with(None)
    }

    /// [`Replay::finish`] without keeping the records: each is handed to `sink` as it is built, in
    /// allocation (submission) order, and only the few fields the summary reads are kept
    /// ([`crate::facts::JobFacts`]); the result's `jobs` is empty. A year's replay that writes
    /// `jobs.csv` and its summary needs no more.
    pub fn finish_streaming(self, sink: &mut dyn FnMut(&JobRecord)) -> Result<(SimResult, H), SimError> {
        self.finish_with(Some(sink))
    }

    fn finish_with(self, sink: Option<&mut dyn FnMut(&JobRecord)>) -> Result<(SimResult, H), SimError> {
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
            ended_nodes,
            ..
        } = self;
        let decisions = ctl.controller_mut().take_log();
        let engine = &ctl.controller().engine;
        let world::FakeWorld {
            q,
            mut quorum,
            mut fake,
            trace_of,
            checkpoint_attempts,
            checkpoint_ok,
            ..
        } = world;
        // The queue's storage is not needed for the records, which are the replay's peak of memory.
        drop(q);
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
        let held_nodes = HeldNodes {
            engine,
            ended: &ended_nodes,
        };
        let mut skipped = workload.skipped.clone();
        for (k, v) in rejected {
            *skipped.entry(k).or_default() += v;
        }
        let cost = EngineCost::from_nanos(pass_ns);
        let records = Records::new(&held_nodes, workload, &trace_of, &node_facts, &fake.held_s);
        let at_end = summary::AtEnd {
            workload,
            trace_of: &trace_of,
            engine,
            cfg,
            joined: &joined,
            quorum: &quorum,
        };
        let (jobs, mut summary) = match sink {
            None => {
                let jobs = records.all();
                let summary = at_end.summarize(&jobs, skipped, notes);
                (jobs, summary)
            }
            Some(sink) => {
                let facts: Vec<JobFacts> = engine
                    .allocations()
                    .iter()
                    .map(|a| {
                        let r = records.record(a);
                        sink(&r);
                        JobFacts::from(&r)
                    })
                    .collect();
                (Vec::new(), at_end.summarize(&facts, skipped, notes))
            }
        };
        drop(records);
        summary.cycle_cpu_ms_mean = cost.cycle_cpu_ms_mean;
        summary.cycle_cpu_ms_p99 = cost.cycle_cpu_ms_p99;
        summary.deferred_for_energy = deferred;
        staging_metrics(&mut summary, engine, fake.stall_ms);
        summary.scale_ups = scaling.ups as u64;
        summary.scale_downs = scaling.downs as u64;
        summary.scale_blocked = scaling.blocked as u64;
        summary.scale_metric_unavailable = scaling.metric_unavailable as u64;
        summary.oscillation_alerts = scaling.oscillation_alerts as u64;
        service_metrics(&mut summary, engine, cfg.horizon.unwrap_or(trace_end));
        summary.node_failures = node_failures;
        summary.injected_failures = injected;
        summary.requeues = engine.allocations().iter().map(|a| a.requeues as u64).sum();
        summary.prologue_failures = fake.prologue_failures;
        // Nodes that draw no power (every SWF replay) use none: no walk over every allocation's nodes.
        let (kwh, energy_cost) = if node_power.iter().all(|&w| w == 0) {
            (0.0, 0.0)
        } else {
            energy_use(&summary_jobs_energy(&held_nodes, &node_power), &energy_prices)
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
        engine.configure_vcluster(id, *vc)?;
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
        fake: world::FakeNodes::new(cfg.keep_timeline, workload.jobs.len()),
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
        reports: cfg.preemption_reports,
        durability: cfg.durability,
        report_rng: {
            use rand_chacha::rand_core::SeedableRng;
            rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x0005_7095_u64)
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
