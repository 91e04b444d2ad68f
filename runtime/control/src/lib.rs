//! `lattice-control` — the control plane without its transports: no tokio, no sockets, no quorum.
//! `lattice-runtime` wraps it in the scheduling loop, the effects that carry its actions out and the
//! REST/gRPC services; the parity replay drives it on a virtual clock.
//!
//! The control plane's local (eventually consistent) state: the very same `lattice-engine` the
//! simulator drives, fed from the API and the wall clock, plus the names and request details the API
//! shows. Node ownership itself is decided by the quorum; this side only proposes.
//!
//! [`Control`] and the controller calls every change goes through are here; its other methods are
//! grouped by responsibility in the child modules (submissions, the allocation's lifecycle after a
//! start is proposed, agents, task launches, sensitive boots and wipes, logs, network domains,
//! administration, read-only queries). What a request may say is [`request`]; what the control plane
//! answers with is [`types`].

mod admin;
mod agents;
pub mod cache;
mod discovery;
mod fabric;
mod launches;
mod lifecycle;
mod logs;
pub mod network;
mod queries;
mod request;
pub mod settings;
mod state;
mod submit;
pub mod tasks;
mod types;
mod wipes;
pub mod world;

pub use request::*;
pub use types::*;

pub use crate::world::PendingProposal;
use crate::world::{Action, Outbox};
/// The agent wire types (declared once, with the agent: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{
    Buffered as BufferedBeat, ExitKind, Launch, Metric as MetricIn, Outcome, Output as OutputIn, PreemptWork,
    TaskGroup as TaskGroupView, Work,
};
use lattice_engine::PreemptHow;
use lattice_engine::{AllocId, Controller, Decision, Input, Policy, Time, VClusterConfig, VClusterId};
use state::{Acks, Conformance, Fleet, Meta, Output, Preempting, Registry, Services, Stops, Wipes, Wiping};
use std::collections::BTreeMap;

/// What happened since the metrics last took it ([`Control::take_tally`]): the events behind the
/// seed's preemption, checkpoint and wipe metrics. Counts by label, durations (at most
/// [`TALLY_SAMPLES`] between two takes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// (victim's vCluster, reason) → preemptions ordered.
    pub preemptions: BTreeMap<(String, String), u64>,
    pub victim_requeues: u64,
    pub failed_checkpoints: u64,
    pub wipe_failures: u64,
    /// Drifted nodes taken Down for not being remediated in time.
    pub drift_timeouts: u64,
    /// Hardened boots of claimed nodes that failed or timed out (the node out, the claim failed).
    pub boot_failures: u64,
    pub checkpoints_ok: u64,
    pub checkpoints_failed: u64,
    /// Preemption checkpoints: hint to the last node's report, seconds.
    pub preemption_checkpoint_s: Vec<f64>,
    /// Checkpoint hints to their completion, seconds.
    pub checkpoint_s: Vec<f64>,
    /// Heartbeat round trips the agents measured, seconds.
    pub heartbeat_rtt_s: Vec<(String, f64)>,
    /// Runs killed at their walltime with a checkpoint in progress.
    pub walltime_conflicts: u64,
}

/// See [`Tally`].
pub const TALLY_SAMPLES: usize = 4096;

fn sample<T>(v: &mut Vec<T>, x: T) {
    if v.len() < TALLY_SAMPLES {
        v.push(x);
    }
}

pub struct Control {
    /// The controller `rm-replay` runs, with the engine it owns.
    pub ctl: Controller,
    /// The Raft term in which this control plane adopted the durable queue (`None`: it did not; a
    /// follower's, or a fresh one).
    pub adopted_term: Option<u64>,
    /// Unique per control plane in this process (its engine's ids mean nothing to another).
    pub incarnation: u64,
    /// The controller's decisions not yet turned into [`Action`]s.
    outbox: Outbox,
    /// Reactive allocations: each node's latest sample of the metric they scale on.
    metric_samples: BTreeMap<AllocId, BTreeMap<u32, f64>>,
    /// OpenCHAMI wipes released claims' nodes (agents are not told to).
    pub wipe_by_openchami: bool,
    /// The fabric manager is in use: a launch waits for its CXI service.
    pub fabric: bool,
    /// A replay's virtual clock (`None`: [`Control::wall`]).
    clock: Option<Time>,
    /// The member's clock ([`Clock`]).
    pub wall: Clock,
    capture: Option<std::fs::File>,
    /// Re-attached allocations whose simulated agents must resume (drained by the loop).
    resumed: Vec<AllocId>,
    /// Real agents run the work: a node is Booting (not schedulable) until its agent registers.
    pub real_agents: bool,
    /// Task launches within running allocations (`lattice launch`): leader state, not replicated.
    pub launches: crate::tasks::Launches,
    /// The secret each allocation's launch token is derived from (random per leader; zeros in tests).
    pub launch_secret: [u8; 32],
    /// The nodes' image caches: operators' warm/evict orders and what the agents report.
    pub caches: crate::cache::Caches,
    /// Events for the metrics since they last took them.
    tally: Tally,
    /// Names, ids and request details ([`Registry`]).
    registry: Registry,
    /// The node agents as heard here ([`Fleet`]).
    fleet: Fleet,
    /// The nodes' conformance fingerprints ([`Conformance`]).
    conformance: Conformance,
    /// Allocations' output tails and live output ([`Output`]).
    output: Output,
    /// Preemptions and checkpoint hints in flight ([`Stops`]).
    stops: Stops,
    /// Released claims' wipes ([`Wipes`]).
    wipes: Wipes,
    /// What is not yet on a majority's disks ([`Acks`]).
    acks: Acks,
    /// VAST prefetches and CXI services ([`Services`]).
    services: Services,
}

/// What a submission queued: its id (a task group's own id) and each allocation with the request
/// that recreates it.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub id: String,
    pub elements: Vec<(String, SubmitRequest)>,
}

/// What an agent reports with a poll besides what it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentReports {
    /// Outcomes of checkpoint hints on its node.
    pub checkpointed: Vec<Outcome>,
    /// Outcomes of wipes it ran.
    pub wiped: Vec<Outcome>,
    /// Scaling-metric samples of allocations on its node.
    pub metrics: Vec<MetricIn>,
    /// Task launches that ended on its node.
    pub task_ends: Vec<crate::tasks::TaskEndIn>,
    /// Task launches that run on its node now.
    pub tasks_running: Vec<String>,
    /// Outcomes of image cache orders, and the cache's contents when they changed.
    pub cache_done: Vec<crate::cache::CacheOutcome>,
    pub cache: Option<Vec<crate::cache::CachedImage>>,
}

impl Control {
    /// The site's engine (the same builder `rm-replay` uses: [`lattice_traces::site_engine`]) with the
    /// inventory's vClusters, then the profile's (or one EASY vCluster `default` when there are none).
    pub fn new(
        inventory: &lattice_traces::Inventory,
        vclusters: BTreeMap<String, VClusterConfig>,
        contracts: &lattice_traces::Contracts,
        capture: Option<&std::path::Path>,
    ) -> anyhow::Result<Control> {
        let node_names = inventory.nodes.iter().map(|n| n.name.clone()).collect();
        let mut engine = lattice_traces::site_engine(
            inventory,
            Policy::EASY,
            lattice_engine::FairShareConfig::default(),
            inventory.sensitive_pool_size,
            &[],
        )?;
        let mut vcs: BTreeMap<String, VClusterId> = inventory
            .vclusters
            .names()
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), VClusterId(i as u32)))
            .collect();
        let mut default_vcluster = inventory
            .vclusters
            .names()
            .first()
            .cloned()
            .unwrap_or_else(|| "default".to_string());
        for (i, (name, cfg)) in vclusters.into_iter().enumerate() {
            let id = match vcs.get(&name) {
                Some(&id) => id,
                None => engine.add_vcluster(&name),
            };
            engine.configure_vcluster(id, cfg)?;
            if i == 0 {
                default_vcluster = name.clone();
            }
            vcs.insert(name, id);
        }
        if vcs.is_empty() {
            vcs.insert("default".to_string(), engine.add_vcluster("default"));
        }
        let mut ctl = Controller::new(engine);
        ctl.network = Some(crate::network::NetworkConfig::default().domains()?);
        let mut c = Control::with_controller(ctl, node_names, vcs, default_vcluster)?;
        for (name, unset) in &inventory.unset {
            if let Some(id) = c.node_index(name) {
                c.leave_to_discovery(id, *unset);
            }
        }
        for (t, q) in &contracts.tenants {
            let id = c.tenant_id(t);
            c.ctl.engine.set_tenant_quota(id, *q);
        }
        for (t, p, q) in contracts.project_list() {
            let (tenant, project) = (c.tenant_id(t), c.registry.project_id(t, p));
            c.ctl.engine.set_project_quota(project, tenant, *q);
        }
        if let Some(path) = capture {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            c.capture = Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?);
        }
        Ok(c)
    }

    /// A control plane around a controller already set up (a replay's, for the parity test): node
    /// `i` is `node_names[i]`; vClusters by name.
    pub fn with_controller(
        ctl: Controller,
        node_names: Vec<String>,
        vclusters: BTreeMap<String, VClusterId>,
        default_vcluster: String,
    ) -> anyhow::Result<Control> {
        let node_by_name = node_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        let agents = vec![None; node_names.len()];
        Ok(Control {
            clock: None,
            wall: Clock::system(),
            adopted_term: None,
            incarnation: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            ctl,
            outbox: Outbox::default(),
            metric_samples: BTreeMap::new(),
            wipe_by_openchami: false,
            fabric: false,
            capture: None,
            launches: Default::default(),
            launch_secret: [0; 32],
            caches: Default::default(),
            tally: Tally::default(),
            resumed: Vec::new(),
            real_agents: false,
            registry: Registry {
                vclusters,
                default_vcluster,
                node_names,
                node_by_name,
                next: 1,
                ..Default::default()
            },
            fleet: Fleet {
                agents,
                ..Default::default()
            },
            conformance: Conformance::default(),
            output: Output::default(),
            stops: Stops::default(),
            wipes: Wipes::default(),
            acks: Acks::default(),
            services: Services::default(),
        })
    }

    /// The engine's clock never goes back ([`Clock`] is monotonic; and never before the engine's
    /// last input). A replay sets a virtual clock instead ([`Control::set_clock`]).
    pub fn now(&self) -> Time {
        match self.clock {
            Some(t) => t,
            None => Time(self.wall.now_ms()).max(self.ctl.engine.now()),
        }
    }

    /// Appends the trace capture to `path` from now on (a replay's, for the round trip).
    pub fn capture_to(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.capture = Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?);
        Ok(())
    }

    /// Runs on a virtual clock from now on: every input and pass happens at `t` until the next call.
    pub fn set_clock(&mut self, t: Time) {
        self.clock = Some(t);
    }

    /// Runs a scheduling pass at `now`; what it decided is in [`Control::take_actions`]. How long the
    /// pass took (the engine's CPU time, for `/metrics`).
    pub fn schedule(&mut self) -> (lattice_engine::PassStats, std::time::Duration) {
        let now = self.now();
        let t0 = std::time::Instant::now();
        let stats = self.ctl.schedule(now);
        let took = t0.elapsed();
        let expired = self.ctl.stats.drift_timeouts;
        let boot_failures = self.ctl.stats.boot_failures;
        if let Err(e) = self.ctl.dispatch(now, &mut self.outbox) {
            tracing::error!("carrying out the pass's decisions: {e}");
        }
        self.unreported_preemptions();
        let timed_out = self.ctl.stats.boot_failures - boot_failures;
        if timed_out > 0 {
            self.tally.boot_failures += timed_out;
            tracing::error!(
                "{timed_out} claimed node(s) not booted into the hardened image within sensitive.boot_timeout: \
                 out of service, their claims failed (an operator must investigate)"
            );
        }
        let expired = self.ctl.stats.drift_timeouts - expired;
        if expired > 0 {
            self.tally.drift_timeouts += expired;
            tracing::error!(
                "{expired} drifted node(s) not remediated within the drift remediation timeout: taken Down \
                 (an operator must investigate and bring them back)"
            );
        }
        (stats, took)
    }

    /// Victims the controller took as stopped without a checkpoint because their agents did not
    /// report the preemption within the order's limit and `agents.preemption_report_grace` (a
    /// checkpoint order or a kill failed them, a stop suspended them): logged and counted.
    fn unreported_preemptions(&mut self) {
        for (id, how) in self.ctl.take_unreported() {
            self.stops.preempting.remove(&id);
            self.fleet.exits.remove(&id);
            tracing::warn!(
                "{}: its agents did not report the preemption in time; taken as stopped without a checkpoint",
                self.name_of(id)
            );
            if matches!(how, PreemptHow::CheckpointThenStop { .. }) {
                self.tally.failed_checkpoints += 1;
                self.tally.checkpoints_failed += 1;
            }
        }
    }

    /// Applies what happened in the world (an agent's report, a quorum answer, a node change) at
    /// the current time; what it caused is in [`Control::take_actions`].
    pub fn input(&mut self, input: Input) -> Result<(), lattice_engine::ControlError> {
        let now = self.now();
        self.ctl.apply(now, input, &mut self.outbox)?;
        self.capture_input(now, input);
        Ok(())
    }

    /// The capture's line for an input that came from outside the world `rm-replay` models: an
    /// owner's cancel or walltime change, a node's failure, recovery, drain or undrain, a metric
    /// sample, checkpoint storage going down or up. (Commits, exits, checkpoints and wipes are the
    /// world's answers: a replay's fake world gives them again.)
    fn capture_input(&mut self, now: Time, input: Input) {
        use lattice_engine::NodeEvent as E;
        if self.capture.is_none() {
            return;
        }
        let ts = now.0 as f64 / 1000.0;
        let node = |n: lattice_engine::NodeId| self.registry.node_names.get(n.index()).cloned().unwrap_or_default();
        let line = match input {
            Input::Cancel(id) => serde_json::json!({"ts": ts, "type": "cancel", "alloc_id": self.name_of(id)}),
            Input::Walltime(id, w) => serde_json::json!({
                "ts": ts, "type": "walltime", "alloc_id": self.name_of(id), "walltime": w.as_secs_f64()
            }),
            Input::Metric(id, value) => {
                let mut v =
                    serde_json::json!({"ts": ts, "type": "metric", "alloc_id": self.name_of(id), "value": value});
                if let Some(m) = self.registry.meta.get(id.index()).and_then(|m| m.metric.clone()) {
                    v["metric"] = m.into();
                }
                v
            }
            Input::Storage(up) => serde_json::json!({
                "ts": ts, "type": if up { "storage_recover" } else { "storage_outage" }
            }),
            Input::Weights(vc, weights) => serde_json::json!({
                "ts": ts,
                "type": "weights",
                "vcluster": self.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default(),
                "weights": weights,
            }),
            Input::VCluster(vc, config) => serde_json::json!({
                "ts": ts,
                "type": "vcluster",
                "vcluster": self.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default(),
                "config": lattice_traces::config_json(&config),
            }),
            Input::Node(n, ev) => {
                let (kind, mode) = match ev {
                    E::Drain => ("drain", None),
                    E::Undrain => ("undrain", None),
                    E::HardwareFailure => ("node_fail", Some("hardware")),
                    E::HeartbeatMiss => ("node_fail", Some("heartbeat")),
                    E::Enable | E::HeartbeatResume => ("node_recover", None),
                    // Registration, boot and health checks: a replay's nodes start ready; a grace
                    // that runs out follows from the heartbeat failure.
                    _ => return,
                };
                let mut v = serde_json::json!({"ts": ts, "type": kind, "node": node(n)});
                if let Some(m) = mode {
                    v["mode"] = m.into();
                }
                v
            }
            Input::Conformance(n, drifted) => serde_json::json!({
                "ts": ts, "type": if drifted { "drift" } else { "conform" }, "node": node(n)
            }),
            Input::RetryWipe(n) => serde_json::json!({"ts": ts, "type": "wipe_retry", "node": node(n)}),
            Input::CheckpointBandwidth(gbps) => {
                serde_json::json!({"ts": ts, "type": "checkpoint_bandwidth", "gbps": gbps})
            }
            Input::GpuMemory(n, gb) => serde_json::json!({"ts": ts, "type": "gpu_memory", "node": node(n), "gb": gb}),
            _ => return,
        };
        self.capture_line(line);
    }

    /// When the engine wants its next pass (a cycle tick, an energy window, a staging end).
    /// Asked of the engine as it is now, not as the pass left it: proposals the quorum committed
    /// since (their runs, their ends) move it.
    pub fn next_wakeup(&self) -> Option<Time> {
        let now = self.now();
        self.ctl.next_wakeup().filter(|t| *t > now)
    }

    /// The controller's decisions since the last call, as actions for the server (in order). Watches
    /// and wake-ups are kept here; a start that would need a VNI the pool cannot give stays pending.
    pub fn take_actions(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while !self.outbox.0.is_empty() {
            let decisions = std::mem::take(&mut self.outbox.0);
            for (t, d) in decisions {
                out.extend(self.action_of(t, d));
            }
        }
        out
    }

    /// A preemption ordered: noted for the victim's owners and the metrics, and for its agents.
    fn preempt_action(&mut self, o: lattice_engine::PreemptOrder) -> Action {
        tracing::info!(
            "{} preempted for {} ({}): {:?}",
            self.name_of(o.alloc),
            self.name_of(o.for_alloc),
            o.reason.as_str(),
            o.how
        );
        let why = format!("{} for {}", o.reason.as_str(), self.name_of(o.for_alloc));
        let vcluster = self
            .ctl
            .engine
            .allocation(o.alloc)
            .and_then(|a| self.ctl.engine.vcluster(a.spec.vcluster))
            .map(|v| v.name)
            .unwrap_or_default();
        *self
            .tally
            .preemptions
            .entry((vcluster, o.reason.as_str().to_string()))
            .or_default() += 1;
        if let Some(m) = self.registry.meta.get_mut(o.alloc.index()) {
            m.preempted_for = Some(why);
        }
        let to_tell = self
            .ctl
            .engine
            .allocation(o.alloc)
            .map(|a| a.nodes.iter().map(|n| n.0).collect())
            .unwrap_or_default();
        self.stops.preempting.insert(
            o.alloc,
            Preempting {
                how: o.how,
                at: o.at,
                to_tell,
            },
        );
        Action::Preempt {
            name: self.name_of(o.alloc),
            order: o,
        }
    }

    /// The action that carries out decision `d` (made at `t`), with the bookkeeping it needs here
    /// (`None`: nothing to carry out).
    fn action_of(&mut self, t: Time, d: Decision) -> Option<Action> {
        match d {
            Decision::Propose(p) => {
                let a = self.ctl.engine.allocation(p.alloc)?;
                let tenant = self.tenant_name(a.spec.tenant);
                let sensitive = a.spec.sensitive_claim;
                let m = self.registry.meta.get(p.alloc.index());
                let network = self
                    .ctl
                    .proposal_domain(p.alloc)
                    .map(|(d, vni)| (crate::network::domain_name(d, |a| self.name_of(a)), vni));
                Some(Action::Propose(PendingProposal {
                    incarnation: self.incarnation,
                    alloc: p.alloc,
                    name: m.map(|m| m.name.clone()).unwrap_or_default(),
                    tenant,
                    user: m.and_then(|m| m.user.clone()).unwrap_or_default(),
                    nodes: self.registry.names_of(&p.nodes),
                    sensitive,
                    backfilled: p.backfilled,
                    project: m.and_then(|m| m.project.clone()),
                    network,
                }))
            }
            Decision::Persist(record) => {
                let name = self.record_name(record);
                self.acks.settle_wanted.insert(name.clone());
                Some(Action::Persist { record, name })
            }
            Decision::Refuse { alloc, why } => {
                let message = self.refusal_message(&why);
                tracing::info!("{}: start refused: {message}", self.name_of(alloc));
                if let Some(m) = self.registry.meta.get_mut(alloc.index()) {
                    m.last_rejection = Some(message.clone());
                }
                Some(Action::Refuse {
                    alloc,
                    name: self.name_of(alloc),
                    why,
                    message,
                })
            }
            Decision::Release { alloc, nodes } => {
                self.stops.checkpoint_hints.remove(&alloc);
                // A victim that gave its nodes back is no longer being preempted.
                self.stops.preempting.remove(&alloc);
                if self.real_agents {
                    // Until each of these nodes' agents shows it no longer runs the
                    // allocation (or the node is Down: its agent fenced it), a next start
                    // of it waits: never two runs at once.
                    self.fleet
                        .stopping_on
                        .entry(alloc)
                        .or_default()
                        .extend(nodes.iter().map(|n| n.0));
                }
                Some(Action::Release {
                    alloc,
                    name: self.name_of(alloc),
                    nodes: self.registry.names_of(&nodes),
                })
            }
            Decision::Scale { alloc, node, added } => Some(Action::Scale {
                alloc,
                name: self.name_of(alloc),
                node: self.registry.node_names[node.index()].clone(),
                added,
            }),
            Decision::Audit { alloc, event, nodes } => {
                let note = self.audit_note(alloc, event, &nodes);
                Some(Action::Audit {
                    alloc,
                    user: self
                        .registry
                        .meta
                        .get(alloc.index())
                        .and_then(|m| m.user.clone())
                        .unwrap_or_default(),
                    name: self.name_of(alloc),
                    event,
                    note,
                    nodes: self.registry.names_of(&nodes),
                })
            }
            Decision::Launch {
                alloc,
                nodes,
                resume_from,
                staging_remaining_s,
                vni,
            } => {
                let name = self.name_of(alloc);
                // A new start: exits reported in an earlier one (before a requeue) are not
                // this one's.
                self.fleet.exits.remove(&alloc);
                // A new start: a process of this allocation still running on one of its
                // nodes belongs to an earlier start (a requeue onto overlapping nodes).
                if self.real_agents {
                    for n in &nodes {
                        self.fleet.fresh_starts.insert((n.0, alloc));
                    }
                }
                Some(Action::Launch {
                    alloc,
                    vni,
                    name,
                    nodes: self.registry.names_of(&nodes),
                    resume_from,
                    staging_remaining_s,
                })
            }
            Decision::Stop { alloc, why } => {
                tracing::info!("{} stops: {why:?}", self.name_of(alloc));
                Some(Action::Stop {
                    alloc,
                    name: self.name_of(alloc),
                    why,
                })
            }
            Decision::Preempt(o) => Some(self.preempt_action(o)),
            Decision::Checkpoint { alloc } => {
                self.stops.hinted_at.insert(alloc, self.now());
                // Real agents deliver it at their next poll, by the allocation's mechanism.
                if let Some(a) = self.ctl.engine.allocation(alloc) {
                    let nodes = a.nodes.iter().map(|n| n.0).collect();
                    self.stops.checkpoint_hints.insert(alloc, nodes);
                    self.stops.hint_reports.remove(&alloc);
                }
                Some(Action::Checkpoint {
                    alloc,
                    name: self.name_of(alloc),
                })
            }
            Decision::Wipe { alloc, nodes } => {
                // Real agents run the site's wipe command at their next poll, unless
                // OpenCHAMI wipes the nodes.
                let to_tell: std::collections::BTreeSet<u32> = if self.wipe_by_openchami {
                    Default::default()
                } else {
                    nodes.iter().map(|n| n.0).collect()
                };
                // An operator's retry of one node joins the claim's wipe, if under way.
                let w = self.wipes.wiping.entry(alloc).or_insert(Wiping {
                    pending: Default::default(),
                    to_tell: Default::default(),
                    started_ms: t.0,
                });
                w.pending.extend(to_tell);
                w.started_ms = t.0;
                Some(Action::Wipe {
                    alloc,
                    name: self.name_of(alloc),
                    nodes: self.registry.names_of(&nodes),
                })
            }
            Decision::Boot { alloc, nodes } => {
                tracing::info!(
                    "{}: its nodes boot the hardened image before it starts",
                    self.name_of(alloc)
                );
                Some(Action::Boot {
                    alloc,
                    name: self.name_of(alloc),
                    nodes: self.registry.names_of(&nodes),
                })
            }
            Decision::Watch { node, grace } => {
                self.fleet.grace_until.insert(node.0, t.0 + grace.0);
                Some(Action::Watch { node, grace })
            }
            Decision::Drift {
                node,
                drifted,
                sensitive,
            } => {
                let claim = self
                    .ctl
                    .engine
                    .node(node)
                    .and_then(|n| n.owner)
                    .filter(|o| self.ctl.engine.is_sensitive(o.alloc))
                    .map(|o| self.name_of(o.alloc));
                Some(Action::Drift {
                    node,
                    name: self.registry.node_names[node.index()].clone(),
                    drifted,
                    sensitive,
                    message: self.drift_message(node.0),
                    claim,
                })
            }
            // Asked again after every input ([`Control::next_wakeup`]): the quorum commits
            // after the pass decided, and what it commits moves the engine's next wake-up.
            Decision::WakeAt(_) => None,
        }
    }
}
