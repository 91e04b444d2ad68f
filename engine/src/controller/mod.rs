//! The one controller both worlds run: it owns the [`Engine`], applies what happens in the world
//! ([`Input`]) at one `now`, runs passes, and carries out *every* engine output through the ports of
//! [`crate::world`] — proposals, scale changes, preemptions, checkpoint hints, releases, audit entries,
//! launches with their resume point, wipes, heartbeat watches and wake-ups.
//!
//! `lattice-sim` drives it on a virtual clock with a fake world; `lattice-runtime` on the wall clock
//! with openraft and node agents. Pure like the engine: no I/O, no clock, no randomness.
//!
//! Checkpoints are tracked here, so both worlds resume from them the same way: each run has a start
//! and the work it resumed from; a checkpoint (a broker hint or a preemption's) that completes keeps the
//! work done up to its hint; a run that is lost (node failure, prologue failure, a stop without
//! checkpoint) resumes from the last kept checkpoint, and only the work since it counts as lost.

use crate::AllocSpec;
use crate::alloc::{AllocState, EndReason};
use crate::engine::{Engine, PassStats};
use crate::error::{EngineError, SubmitError};
use crate::ids::{AllocId, NodeId, VClusterId};
use crate::node::NodeEvent;
use crate::preempt::{Command, PreemptReason};
use crate::time::{Duration, Time};
use crate::weights::CostWeights;
use crate::world::{AuditEvent, Decision, PreemptHow, PreemptOrder, StopReason, World};
use std::collections::BTreeMap;

mod claims;
mod domains;
mod durability;
mod nodes;
mod preemption;
pub mod settings;

use crate::world::Durable;

/// What happens in the world, applied at a `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Input {
    /// The quorum committed a proposal.
    Committed(AllocId),
    /// The quorum rejected a proposal.
    Rejected(AllocId),
    /// The allocation's run ended (by itself, a walltime kill, or a preemption kill).
    Exited(AllocId, EndReason),
    /// Its prologue (image pull, mount) failed on a node.
    PrologueFailed(AllocId, NodeId),
    /// A preempted allocation stopped; `true` when its checkpoint was written.
    Suspended(AllocId, bool),
    /// A broker checkpoint finished (`true`) or failed.
    Checkpointed(AllocId, bool),
    /// The secure wipe of a released claim's nodes ended (`true`: they return to the pool).
    WipeDone(AllocId, bool),
    /// The secure wipe of one of a released claim's nodes ended (`true`: it returns to the pool,
    /// else it is quarantined) — real agents report each node's own outcome.
    NodeWiped(AllocId, NodeId, bool),
    /// A node changed (agent registration, heartbeat, operator, hardware).
    Node(NodeId, NodeEvent),
    /// A watched node's heartbeat grace ran out.
    GraceExpired(NodeId),
    /// Checkpoint storage went down (`false`) or came back.
    Storage(bool),
    /// The checkpoint store's measured write bandwidth, GB/s: the broker's write-time estimate from
    /// now on (a value that is not a positive number changes nothing).
    CheckpointBandwidth(f64),
    /// The memory of each of the node's GPUs, GB, as its agent reported it: the broker's estimate
    /// of checkpoint sizes there from now on (a value that is not a positive number changes nothing).
    GpuMemory(NodeId, f64),
    /// A reactive allocation's scaling metric.
    Metric(AllocId, f64),
    Cancel(AllocId),
    /// A new walltime.
    Walltime(AllocId, Duration),
    /// The data prefetch of a staging allocation failed.
    StagingFailed(AllocId),
    /// An administrator set a vCluster's cost weights (hot reload).
    Weights(VClusterId, CostWeights),
    /// An administrator set a vCluster's whole scheduler configuration (policy, cycle interval,
    /// weights, ...): it schedules with it from its next pass.
    VCluster(VClusterId, crate::policy::VClusterConfig),
    /// A tenant's contract changed (committed at the quorum): every pool runs a pass, since a raised
    /// hard quota may let the tenant's waiting work start anywhere.
    TenantQuota(crate::ids::TenantId, crate::quota::TenantQuota),
    /// A project's contract changed (committed at the quorum): as for a tenant's.
    ProjectQuota(crate::ids::ProjectId, crate::ids::TenantId, crate::quota::ProjectQuota),
    /// The node's agent reported a conformance fingerprint that differs from its baseline (`true`),
    /// or one that matches it again (`false`) (book: "Drift Response").
    Conformance(NodeId, bool),
    /// A node of a committed sensitive claim finished booting the hardened image (`true`), or its
    /// boot failed (book: "Booting → Failed").
    Booted(AllocId, NodeId, bool),
    /// An operator retries the wipe of a quarantined node (book: "Wipe Failure Handling": `lattice
    /// admin node wipe <id> --force`): wiped, it returns to the pool; failed, it stays quarantined.
    RetryWipe(NodeId),
    /// An operator's standing order for a node, as the quorum recorded it (the default order lifts
    /// it). It holds until lifted: whatever else happens to the node (its agent registers, a wipe
    /// returns it, it conforms again), a drained node that is up drains and a disabled one is Down.
    /// Lifting an order brings the node back as the operator's `undrain` or `enable` does (a
    /// drained node that is not drifted undrains; a Down node is enabled).
    Order(NodeId, NodeOrder),
    /// The record is not yet on a majority of the quorum members' disks (a submission not yet
    /// acknowledged; an end or a prior end this control plane read only from its own copy).
    NotDurable(Durable),
    /// The record is on a majority of the quorum members' disks.
    Durable(Durable),
    /// The allocation depends on an allocation the controller does not hold (it ended, its
    /// dependency met, before this control plane took over): it starts only once that end is
    /// durable ([`Durable::PriorEnd`]).
    AwaitsPrior(AllocId, u64),
}

/// An operator's standing order for a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeOrder {
    pub drained: bool,
    pub disabled: bool,
}

/// Why an input or output was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A decision broke one of the scheduler's rules (checked when
    /// [`Controller::check_preemptions`] is on).
    #[error("{0}")]
    Invariant(String),
    /// A wipe retry of a node that is not quarantined (its wipe did not fail, or it was retried
    /// already and is being wiped).
    #[error("node {0} is not quarantined after a failed wipe")]
    NotQuarantined(NodeId),
}

/// Heartbeat grace before a silent node goes Down, by what it runs (book: 5 min for sensitive
/// nodes, shorter for borrowed ones).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeartbeatGrace {
    pub sensitive: Duration,
    pub borrowed: Duration,
    pub default: Duration,
}

impl Default for HeartbeatGrace {
    fn default() -> Self {
        HeartbeatGrace {
            sensitive: Duration::from_mins(5),
            borrowed: Duration::from_secs(30),
            default: Duration::from_secs(60),
        }
    }
}

/// How long a node may stay drifted before it is taken out of service (book: "Drift Response":
/// `drift_remediation_timeout`, 24 h; 4 h for sensitive nodes): it goes Down and an operator must
/// investigate and bring it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriftTimeout {
    pub standard: Duration,
    pub sensitive: Duration,
}

impl Default for DriftTimeout {
    fn default() -> Self {
        DriftTimeout {
            standard: Duration::from_hours(24),
            sensitive: Duration::from_hours(4),
        }
    }
}

pub use crate::preempt::PREEMPT_GRACE;

/// Counters of what the controller did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControlStats {
    /// Preemption decisions by reason.
    pub preemptions: BTreeMap<&'static str, u64>,
    pub broker_hints: u64,
    /// Broker checkpoints that completed.
    pub broker_checkpoints: u64,
    /// Preemptions whose victim stopped with a written checkpoint.
    pub preemption_checkpoints: u64,
    /// Node-seconds of work lost with lost runs (since each run's last kept checkpoint).
    pub lost_node_s: f64,
    /// Wipes that returned nodes to the pool (a claim's, or one node's when agents report each).
    pub wipes: u64,
    pub quarantined_nodes: u64,
    /// Nodes found drifted from their conformance baseline.
    pub drifts: u64,
    /// Drifted nodes not remediated within the drift remediation timeout (taken Down).
    pub drift_timeouts: u64,
    /// Nodes that did not finish booting within their kind's boot timeout (Failed).
    pub boot_timeouts: u64,
    /// Nodes booted into the hardened image for a sensitive claim.
    pub hardened_boots: u64,
    /// Hardened boots that failed or timed out (the node Down, the claim failed).
    pub boot_failures: u64,
    /// Proposals refused before the quorum: their network domain needed a VNI the pool had not.
    pub vni_refusals: u64,
    /// Sensitive claims refused: their pool could not give them the nodes at once.
    pub claims_refused: u64,
    /// Nodes whose wipe was not confirmed within the wipe timeout (quarantined, like a failure).
    pub wipe_timeouts: u64,
    /// Preemptions the world did not report within the order's limit and the report grace: taken
    /// as stopped without a checkpoint.
    pub preemption_report_timeouts: u64,
    /// Proposals refused before the quorum because a record they wait for was not yet durable.
    pub durability_holds: u64,
}

/// A sensitive claim committed but not launched: its nodes boot the hardened image.
#[derive(Clone, Debug)]
struct Booting {
    /// Nodes still booting.
    waiting: std::collections::BTreeSet<NodeId>,
    /// When the boot fails for the nodes still booting.
    deadline: Time,
    staging_remaining_s: f64,
}

/// What the controller knows of the records' durability.
#[derive(Clone, Debug, Default)]
struct Durability {
    /// Submissions not yet on a majority.
    unacknowledged: std::collections::BTreeSet<AllocId>,
    /// Ends on a majority (read only with [`Controller::durable_ends`]).
    settled: std::collections::BTreeSet<AllocId>,
    /// Prior ends on a majority.
    settled_prior: std::collections::BTreeSet<u64>,
    /// Dependencies the controller does not hold: allocation → the prior ends it waits for.
    prior: BTreeMap<AllocId, std::collections::BTreeSet<u64>>,
    /// Records asked of the world ([`Decision::Persist`]) and not yet durable.
    asked: std::collections::BTreeSet<Durable>,
}

/// The checkpoint bookkeeping of one allocation.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    /// When the current run started.
    start: Time,
    /// Work the current run resumed from.
    base: Duration,
    /// Work kept by the last completed checkpoint (what the next run resumes from).
    saved: Duration,
    /// The work a preemption checkpoint in flight will keep (progress when the victim is signalled).
    pending: Option<Duration>,
    /// The work a broker checkpoint in flight will keep (progress at its hint).
    hinted: Option<Duration>,
}

impl Run {
    fn progress(&self, now: Time) -> Duration {
        Duration(self.base.0 + now.since(self.start).0)
    }
}

pub struct Controller {
    pub engine: Engine,
    pub grace: HeartbeatGrace,
    pub drift_timeout: DriftTimeout,
    /// Sensitive claims boot their nodes into the hardened image before they launch (book:
    /// "OpenCHAMI boots N1-N4 with hardened sensitive image (if not already)"), each boot given this
    /// long (the book's boot timeout, 10 min); `None`: claims launch at once (no hardened image).
    pub hardened_boot: Option<Duration>,
    /// `sensitive.boot_timeout`: the hardened boot's deadline where claims boot one (kept as a
    /// setting everywhere, [`settings`]).
    pub hardened_boot_timeout: Duration,
    /// No heartbeat for this long and a node is Degraded (`agents.heartbeat_timeout`): the
    /// runtime's agent watch reports the miss; a replay's heartbeat losses come from its trace.
    pub heartbeat_timeout: Duration,
    /// A wipe not confirmed within this fails (book: "Wipe Failure Handling": the node is
    /// quarantined; 30 min by default in the runtime); `None`: the controller waits for every outcome.
    pub wipe_timeout: Option<Duration>,
    /// How long past a preemption order's own limit (the checkpoint deadline and the SIGTERM grace,
    /// or the grace of a stop or kill) the world may take to report how the victim stopped
    /// (`agents.preemption_report_grace` in the runtime); then it is taken to have stopped without
    /// a checkpoint — what its agents would have reported: a checkpoint order or a kill fails the
    /// victim (`PreemptionKilled`), a stop suspends it. `None`: every report is waited for.
    pub preemption_report_grace: Option<Duration>,
    /// Check every preemption decision against the rules (only down, never a sensitive victim).
    pub check_preemptions: bool,
    /// Network domains and their VNI pool (`None`: not modelled — no domains, no refusals).
    pub network: Option<crate::network::NetworkDomains>,
    /// How long a node may stay Booting (its agent not yet healthy) before it is Failed, by node
    /// kind (none: nodes boot for as long as it takes).
    pub node_boot: crate::node::BootTimeouts,
    /// Booting nodes and when they fail unless healthy by then.
    node_boot_due: BTreeMap<NodeId, Time>,
    /// Every end counts as not durable until the world reports it is ([`Input::Durable`]): a
    /// dependent starts only once its dependencies' ends are on a majority (the runtime's mirrors).
    /// `false`: ends are durable at once (and only submissions the world names are waited for).
    pub durable_ends: bool,
    pub stats: ControlStats,
    runs: Vec<Run>,
    log: Option<Vec<String>>,
    /// The last wake-up asked of the world (it is not asked twice).
    last_wake: Option<Time>,
    /// Nodes drifted from their conformance baseline (drained by the drift), since when.
    drifted: BTreeMap<NodeId, Time>,
    /// Drifted nodes already taken Down for not being remediated in time.
    drift_expired: std::collections::BTreeSet<NodeId>,
    /// Nodes running the hardened image (booted for a claim; a wipe keeps the image).
    hardened: std::collections::BTreeSet<NodeId>,
    /// Claims whose nodes boot the hardened image before they launch.
    booting: BTreeMap<AllocId, Booting>,
    /// Victims being preempted, with the order's mode and when their report is overdue (with a
    /// report grace).
    preempting: BTreeMap<AllocId, (PreemptHow, Time)>,
    /// Victims taken as stopped for want of a report, not yet taken by the world
    /// ([`Controller::take_unreported`]).
    unreported: Vec<(AllocId, PreemptHow)>,
    /// Wipes under way: per released claim, the nodes whose outcome is awaited, and when they fail
    /// for want of one (with a wipe timeout).
    wiping: BTreeMap<AllocId, (std::collections::BTreeSet<NodeId>, Option<Time>)>,
    /// Operators' standing orders by node.
    orders: BTreeMap<NodeId, NodeOrder>,
    /// Cancels that came while the allocation's start was at the quorum: carried out once the
    /// quorum answers (a committed start is stopped and its nodes released).
    cancel_after_answer: std::collections::BTreeSet<AllocId>,
    /// Nodes quarantined after a failed wipe, with the claim whose wipe it was (`None` while an
    /// operator's retry is under way).
    quarantined: BTreeMap<NodeId, (AllocId, bool)>,
    /// What the controller knows of the records' durability.
    durability: Durability,
}

impl Controller {
    pub fn new(engine: Engine) -> Controller {
        Controller {
            engine,
            grace: HeartbeatGrace::default(),
            drift_timeout: DriftTimeout::default(),
            check_preemptions: false,
            wipe_timeout: None,
            preemption_report_grace: None,
            preempting: Default::default(),
            orders: Default::default(),
            cancel_after_answer: Default::default(),
            unreported: Vec::new(),
            wiping: Default::default(),
            network: None,
            node_boot: Default::default(),
            node_boot_due: Default::default(),
            durable_ends: false,
            durability: Default::default(),
            stats: ControlStats::default(),
            runs: Vec::new(),
            log: None,
            last_wake: None,
            drifted: Default::default(),
            drift_expired: Default::default(),
            hardened_boot: None,
            hardened_boot_timeout: Duration::from_mins(10),
            heartbeat_timeout: Duration::from_secs(30),
            hardened: Default::default(),
            booting: Default::default(),
            quarantined: Default::default(),
        }
    }

    /// Keeps a log of every decision from now on (`"<ms> <decision>"` lines).
    pub fn enable_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// Room for `additional` more allocations in the engine and the controller's own per-allocation
    /// state ([`Engine::reserve_allocations`]).
    pub fn reserve_allocations(&mut self, additional: usize) {
        self.engine.reserve_allocations(additional);
        self.runs.reserve_exact(additional);
    }

    pub fn take_log(&mut self) -> Vec<String> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn run(&mut self, id: AllocId) -> &mut Run {
        if self.runs.len() <= id.index() {
            self.runs.resize(id.index() + 1, Run::default());
        }
        &mut self.runs[id.index()]
    }

    /// Work the allocation has done by `now` in its current run, counting the work that run resumed
    /// from (its whole work when the run ends by itself).
    pub fn work_done(&self, id: AllocId, now: Time) -> Duration {
        self.runs.get(id.index()).map_or(Duration::ZERO, |r| r.progress(now))
    }

    /// Work the allocation's next run resumes from (kept by its last completed checkpoint).
    pub fn resume_point(&self, id: AllocId) -> Duration {
        self.runs.get(id.index()).map_or(Duration::ZERO, |r| r.saved)
    }

    fn emit(&mut self, world: &mut dyn World, now: Time, d: Decision) -> Option<bool> {
        // Whatever ends a run's hold on its nodes also takes it out of its network domain.
        // (and a victim that gave its nodes back was reported).
        if let Decision::Release { alloc, .. } = &d {
            if let Some(n) = self.network.as_mut() {
                n.leave(*alloc, now);
            }
            self.preempting.remove(alloc);
        }
        if let Some(log) = self.log.as_mut() {
            log.push(format!("{} {d}", now.0));
        }
        d.dispatch(world, &self.engine, now)
    }

    /// Recovery: a queued allocation that still holds `nodes` at the quorum since `started` (its
    /// agents kept running it) runs there again. Its run counts from `started`, from the work the
    /// controller knows it kept (none, in a fresh controller). Its network domain keeps `vni`, the
    /// VNI its start was recorded with, when the pool has it free.
    pub fn adopt(
        &mut self,
        now: Time,
        id: AllocId,
        nodes: &[NodeId],
        (submitted, started): (Time, Time),
        vni: Option<u32>,
    ) -> Result<(), ControlError> {
        self.engine.handle_adopt(now, id, nodes, submitted, started)?;
        self.join_domain(id, vni);
        let r = self.run(id);
        r.start = started;
        r.base = r.saved;
        r.pending = None;
        r.hinted = None;
        Ok(())
    }

    /// Recovery: a queued allocation was first submitted at `submitted` (it keeps its place).
    pub fn resubmitted(&mut self, now: Time, id: AllocId, submitted: Time) -> Result<(), ControlError> {
        self.engine.handle_resubmitted(now, id, submitted)?;
        Ok(())
    }

    /// A new allocation.
    pub fn submit(&mut self, now: Time, spec: impl Into<std::sync::Arc<AllocSpec>>) -> Result<AllocId, SubmitError> {
        let id = self.engine.handle_submit(now, spec)?;
        self.run(id);
        Ok(id)
    }

    /// A node joins the running site ([`Engine::add_node`]): the inventory (SMD) gained it. It is
    /// scheduled from the next pass on.
    pub fn add_node(&mut self, now: Time, spec: crate::NodeSpec) -> Result<NodeId, ControlError> {
        let id = self.engine.add_node(now, spec)?;
        self.track_boot(now, id);
        Ok(id)
    }

    /// The node's capabilities are now `caps` ([`Engine::set_capabilities`]): what its agent
    /// discovered where the inventory left them unset, as the quorum recorded it. Its pool runs a
    /// pass, so work waiting for such a node starts; a held node takes them when it is released
    /// (`Ok(false)` until then).
    pub fn set_capabilities(
        &mut self,
        now: Time,
        id: NodeId,
        caps: crate::NodeCapabilities,
    ) -> Result<bool, ControlError> {
        Ok(self.engine.set_capabilities(now, id, caps)?)
    }

    /// Applies one input at `now` (inputs of one timestamp in DESIGN.md's order, then
    /// [`Controller::schedule`] and [`Controller::dispatch`]).
    pub fn apply(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError> {
        let applied = self.apply_one(now, input, world);
        // Whatever the input did to the nodes, the operators' standing orders still hold.
        self.enforce_orders(now, world)?;
        applied
    }

    fn apply_one(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError> {
        if let Input::Committed(id) | Input::Rejected(id) = input {
            let answered = self.apply_input(now, input, world);
            // A cancel that came while the start was at the quorum is carried out now.
            if self.cancel_after_answer.remove(&id) {
                self.apply_one(now, Input::Cancel(id), world)?;
            }
            return answered;
        }
        if let Input::Cancel(id) = input
            && self.engine.is_proposed(id)
        {
            self.cancel_after_answer.insert(id);
            return Ok(());
        }
        self.apply_input(now, input, world)
    }

    fn apply_input(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError> {
        match input {
            Input::Committed(id) => self.commit(now, id, world)?,
            Input::Rejected(id) => {
                if let Some(n) = self.network.as_mut() {
                    n.unreserve(id);
                }
                self.engine.handle_reject(now, id)?
            }
            Input::Exited(id, reason) => {
                let Some(a) = self.engine.allocation(id) else {
                    return Err(EngineError::UnknownAlloc(id).into());
                };
                if a.state != AllocState::Running {
                    return Ok(()); // a late report of a run that already ended
                }
                let nodes = a.nodes.clone();
                self.emit(world, now, Decision::Release { alloc: id, nodes });
                self.engine.handle_completion(now, id, reason)?;
                self.after_end(now, id, world);
            }
            Input::PrologueFailed(id, node) => {
                let nodes = self.engine.allocation(id).map(|a| a.nodes.clone()).unwrap_or_default();
                self.audit_sensitive(world, now, id, AuditEvent::PrologueFailure, vec![node]);
                self.emit(world, now, Decision::Release { alloc: id, nodes });
                self.engine.handle_prologue_failure(now, id, node)?;
                self.lost_run(id);
            }
            Input::Suspended(id, checkpointed) => {
                let nodes = self.engine.allocation(id).map(|a| a.nodes.clone()).unwrap_or_default();
                self.emit(world, now, Decision::Release { alloc: id, nodes });
                self.engine.handle_suspended(now, id, checkpointed)?;
                let r = self.run(id);
                let kept = r.pending.take();
                r.hinted = None;
                if checkpointed {
                    // The victim wrote its state when signalled: the next run resumes there.
                    r.saved = r.saved.max(kept.unwrap_or(r.base));
                    self.stats.preemption_checkpoints += 1;
                }
                // Stopped without one: the last completed checkpoint (if any) is still the resume point.
            }
            Input::Checkpointed(id, ok) => {
                self.engine.handle_checkpointed(now, id, ok)?;
                let nodes = self.engine.allocation(id).map(|a| a.nodes.clone()).unwrap_or_default();
                let event = if ok {
                    AuditEvent::CheckpointDone
                } else {
                    AuditEvent::CheckpointFailed
                };
                self.audit_sensitive(world, now, id, event, nodes);
                let r = self.run(id);
                let kept = r.hinted.take();
                if ok && let Some(k) = kept {
                    r.saved = r.saved.max(k);
                    self.stats.broker_checkpoints += 1;
                }
            }
            // The outcome of every node still awaited (a late report, after the wipe timed out,
            // changes nothing).
            Input::WipeDone(id, ok) => {
                let Some((nodes, _)) = self.wiping.remove(&id) else {
                    return Ok(());
                };
                let nodes = self.in_claim_order(id, &nodes);
                self.wiped(now, id, nodes, ok, world);
            }
            Input::NodeWiped(id, node, ok) => {
                let held = self.engine.allocation(id).is_some_and(|a| a.nodes.contains(&node));
                if !held {
                    return Err(EngineError::UnknownNode(node).into());
                }
                if !self.wipe_awaited(id, node) {
                    return Ok(());
                }
                if let Some((waiting, _)) = self.wiping.get_mut(&id) {
                    waiting.remove(&node);
                    if waiting.is_empty() {
                        self.wiping.remove(&id);
                    }
                }
                self.wiped(now, id, vec![node], ok, world);
            }
            // A node rebooting into the hardened image is silent until its agent is back: the boot's
            // own timeout governs it, not the heartbeat grace.
            Input::Node(node, NodeEvent::HeartbeatMiss) if self.booting.values().any(|b| b.waiting.contains(&node)) => {
            }
            Input::Node(node, event) => self.node_event(now, node, event, world)?,
            Input::GraceExpired(node) => {
                if self
                    .engine
                    .node(node)
                    .is_some_and(|n| n.state == crate::node::NodeState::Degraded)
                {
                    self.node_event(now, node, NodeEvent::GraceTimeout, world)?;
                }
            }
            Input::Storage(up) => self.engine.handle_storage(now, up),
            Input::CheckpointBandwidth(gbps) => self.engine.set_checkpoint_bandwidth(gbps),
            Input::GpuMemory(node, gb) => self.engine.set_gpu_memory(node, gb)?,
            Input::Metric(id, value) => self.engine.handle_metric(now, id, value)?,
            Input::Cancel(id) => {
                let (state, nodes) = match self.engine.allocation(id) {
                    Some(a) => (a.state, a.nodes.clone()),
                    None => return Err(EngineError::UnknownAlloc(id).into()),
                };
                self.engine.handle_cancel(now, id)?;
                // A proposal at the quorum gives up the VNI it held.
                if let Some(n) = self.network.as_mut() {
                    n.unreserve(id);
                }
                if state == AllocState::Running {
                    self.emit(
                        world,
                        now,
                        Decision::Stop {
                            alloc: id,
                            why: StopReason::Cancelled,
                        },
                    );
                }
                if matches!(state, AllocState::Running | AllocState::Staging) {
                    self.emit(world, now, Decision::Release { alloc: id, nodes });
                }
                if state == AllocState::Running {
                    self.after_end(now, id, world);
                }
            }
            Input::Walltime(id, walltime) => self.engine.handle_walltime_update(now, id, walltime)?,
            Input::StagingFailed(id) => self.engine.handle_staging_failure(now, id)?,
            Input::Weights(vc, weights) => {
                let mut cfg = self
                    .engine
                    .vcluster_config(vc)
                    .cloned()
                    .ok_or(EngineError::UnknownVCluster(vc))?;
                cfg.weights = Some(weights);
                self.engine.configure_vcluster(vc, cfg)?;
            }
            Input::VCluster(vc, cfg) => {
                self.engine.configure_vcluster(vc, cfg)?;
                self.engine.mark_all_due(now);
            }
            Input::TenantQuota(tenant, quota) => {
                self.engine.set_tenant_quota(tenant, quota);
                self.engine.mark_all_due(now);
            }
            Input::ProjectQuota(project, tenant, quota) => {
                self.engine.set_project_quota(project, tenant, quota);
                self.engine.mark_all_due(now);
            }
            Input::Conformance(node, drifted) => self.conformance(now, node, drifted, world)?,
            Input::Booted(id, node, ok) => self.booted(now, id, node, ok, world)?,
            Input::RetryWipe(node) => {
                let down = self
                    .engine
                    .node(node)
                    .is_some_and(|x| x.state == crate::node::NodeState::Down);
                let Some((id, retrying)) = self.quarantined.get_mut(&node).filter(|q| !q.1 && down) else {
                    return Err(ControlError::NotQuarantined(node));
                };
                *retrying = true;
                let id = *id;
                self.emit(
                    world,
                    now,
                    Decision::Audit {
                        alloc: id,
                        event: AuditEvent::WipeRetry,
                        nodes: vec![node],
                    },
                );
                self.wipe(now, id, vec![node], world);
            }
            Input::NotDurable(_) | Input::Durable(_) | Input::AwaitsPrior(..) => self.apply_durability(input),
            Input::Order(node, order) => {
                if self.engine.node(node).is_none() {
                    return Err(EngineError::UnknownNode(node).into());
                }
                let was = self.order(node);
                if order == NodeOrder::default() {
                    self.orders.remove(&node);
                } else {
                    self.orders.insert(node, order);
                }
                use crate::node::NodeState as S;
                let state = self.engine.node(node).map(|x| x.state);
                if was.disabled && !order.disabled && state == Some(S::Down) {
                    self.node_event(now, node, NodeEvent::Enable, world)?;
                }
                let state = self.engine.node(node).map(|x| x.state);
                let drained = matches!(state, Some(S::Draining | S::Drained));
                if was.drained && !order.drained && drained && !self.drifted.contains_key(&node) {
                    self.node_event(now, node, NodeEvent::Undrain, world)?;
                }
            }
        }
        Ok(())
    }

    /// When the controller wants its next pass: the engine's next wake-up (a cycle tick, an energy
    /// window, a staging end), the next drift remediation deadline, hardened boot deadline or
    /// drained network domain's release, whichever is first.
    pub fn next_wakeup(&self) -> Option<Time> {
        let drift_due = self.drifted.keys().filter_map(|n| self.drift_deadline(*n)).min();
        let boot_due = self.booting.values().map(|b| b.deadline).min();
        let wipe_due = self.wiping.values().filter_map(|w| w.1).min();
        let report_due = self.preempting.values().map(|p| p.1).min();
        let domain_due = self.network.as_ref().and_then(|n| n.next_expiry());
        let node_boot_due = self.node_boot_due.values().min().copied();
        [
            self.engine.next_wakeup(),
            node_boot_due,
            drift_due,
            boot_due,
            wipe_due,
            report_due,
            domain_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The run was lost: checkpoints in flight are lost with it; the next run resumes from the last
    /// completed one.
    fn lost_run(&mut self, id: AllocId) {
        let r = self.run(id);
        r.pending = None;
        r.hinted = None;
    }

    fn commit(&mut self, now: Time, id: AllocId, world: &mut dyn World) -> Result<(), ControlError> {
        // Started before its data was fully staged (the >80 % rule): the world sees the stall.
        let staging_remaining_s = self.engine.staging_remaining_s(id);
        self.engine.handle_commit(now, id)?;
        let Some(a) = self.engine.allocation(id) else {
            return Ok(());
        };
        let nodes = a.nodes.clone();
        let claim = a.spec.sensitive_claim;
        if claim {
            self.emit(
                world,
                now,
                Decision::Audit {
                    alloc: id,
                    event: AuditEvent::Claim,
                    nodes: nodes.clone(),
                },
            );
        }
        // A node that went out while the start was at the quorum (which does not know node
        // health): the run is lost at once, as under a node failure — nothing launches.
        let out = nodes
            .iter()
            .copied()
            .find(|n| !self.engine.node(*n).is_some_and(|x| x.state.runs_allocations()));
        if let Some(node) = out {
            self.engine.handle_run_lost(now, id)?;
            self.run_lost(now, id, node, nodes, 0.0, world);
            return Ok(());
        }
        self.join_domain(id, None);
        if claim && let Some(timeout) = self.hardened_boot {
            // Its nodes boot the hardened image first (those not running it already).
            let boot: Vec<NodeId> = nodes.iter().copied().filter(|n| !self.hardened.contains(n)).collect();
            if !boot.is_empty() {
                self.booting.insert(
                    id,
                    Booting {
                        waiting: boot.iter().copied().collect(),
                        deadline: now + timeout,
                        staging_remaining_s,
                    },
                );
                self.emit(world, now, Decision::Boot { alloc: id, nodes: boot });
                return Ok(());
            }
        }
        self.launch(now, id, nodes, staging_remaining_s, world);
        Ok(())
    }

    /// The committed allocation runs from its resume point.
    /// An audit entry of `id`'s, when it is a sensitive allocation.
    fn audit_sensitive(
        &mut self,
        world: &mut dyn World,
        now: Time,
        id: AllocId,
        event: AuditEvent,
        nodes: Vec<NodeId>,
    ) {
        if self.engine.is_sensitive(id) {
            self.emit(
                world,
                now,
                Decision::Audit {
                    alloc: id,
                    event,
                    nodes,
                },
            );
        }
    }

    fn launch(&mut self, now: Time, id: AllocId, nodes: Vec<NodeId>, staging_remaining_s: f64, world: &mut dyn World) {
        let r = self.run(id);
        r.start = now;
        r.base = r.saved;
        r.pending = None;
        let resume_from = r.base;
        let vni = self.vni_of(id);
        // What starts on a sensitive allocation's nodes is audited first.
        self.audit_sensitive(world, now, id, AuditEvent::Start, nodes.clone());
        self.emit(
            world,
            now,
            Decision::Launch {
                alloc: id,
                nodes,
                resume_from,
                staging_remaining_s,
                vni,
            },
        );
    }

    /// One scheduling pass at `now` (the caller may time it); then [`Controller::dispatch`].
    pub fn schedule(&mut self, now: Time) -> PassStats {
        self.engine.schedule(now)
    }

    /// Carries out everything the pass decided: scale changes, proposals (and the commits a world
    /// decides at once), preemptions and checkpoint hints, and the next wake-up.
    pub fn dispatch(&mut self, now: Time, world: &mut dyn World) -> Result<(), ControlError> {
        // A drift whose remediation time ran out takes its node Down, as a node event would before
        // the pass: the pass runs again with the node out (its work requeued).
        let drifts = self.expire_drifts(now, world)?;
        let wipes = self.expire_wipes(now, world);
        let reports = self.expire_preemptions(now, world)?;
        let failed_boots = self.expire_node_boots(now, world)?;
        if self.expire_boots(now, world)? || drifts || wipes || reports || failed_boots {
            self.engine.schedule(now);
        }
        for (alloc, node, added) in self.engine.drain_scale_log() {
            self.emit(world, now, Decision::Scale { alloc, node, added });
        }
        // Drained network domains whose grace ran out give their VNIs back first.
        if let Some(n) = self.network.as_mut() {
            n.expire(now);
        }
        // Every proposal of the pass holds its network domain's VNI before the quorum answers any
        // (the runtime's quorum answers after the pass; a fake one that answers at once must not
        // free a VNI a later proposal of the same pass would then get).
        // Claims the passes refused have ended: audited (the nodes in their way), their owners told.
        for (id, why) in self.engine.take_claim_refusals() {
            self.stats.claims_refused += 1;
            let nodes = why.nodes();
            self.emit(
                world,
                now,
                Decision::Audit {
                    alloc: id,
                    event: AuditEvent::ClaimRefused,
                    nodes,
                },
            );
            self.emit(
                world,
                now,
                Decision::Refuse {
                    alloc: id,
                    why: crate::world::Refusal::Claim(why),
                },
            );
        }
        let mut proposals = Vec::new();
        while let Some(p) = self.engine.poll_proposal() {
            let id = p.alloc;
            // A start whose submission, or a dependency's end, is not yet durable waits for it.
            if self.hold_for_durability(now, id, world)? {
                continue;
            }
            // A start whose network domain would need a VNI the pool has not stays Pending (retried
            // next cycle, when a domain may have drained).
            match self.reserve_domain(id, p.nodes.len()) {
                Ok(()) => proposals.push(p),
                Err(why) => {
                    self.engine.handle_refused(now, id)?;
                    self.stats.vni_refusals += 1;
                    self.emit(world, now, Decision::Refuse { alloc: id, why });
                }
            }
        }
        for p in proposals {
            let id = p.alloc;
            match self.emit(world, now, Decision::Propose(p)) {
                Some(true) => self.commit(now, id, world)?,
                Some(false) => {
                    if let Some(n) = self.network.as_mut() {
                        n.unreserve(id);
                    }
                    self.engine.handle_reject(now, id)?
                }
                None => {}
            }
        }
        while let Some(cmd) = self.engine.poll_command() {
            match cmd {
                Command::Checkpoint { alloc } => {
                    self.stats.broker_hints += 1;
                    let nodes = self
                        .engine
                        .allocation(alloc)
                        .map(|a| a.nodes.clone())
                        .unwrap_or_default();
                    self.audit_sensitive(world, now, alloc, AuditEvent::Checkpoint, nodes);
                    let progress = self.run(alloc).progress(now);
                    self.run(alloc).hinted = Some(progress);
                    if self.emit(world, now, Decision::Checkpoint { alloc }) == Some(false) {
                        self.run(alloc).hinted = None;
                        let _ = self.engine.handle_checkpointed(now, alloc, false);
                    }
                }
                Command::Preempt {
                    alloc,
                    for_alloc,
                    reason,
                } => {
                    let order = self.preempt_order(now, alloc, for_alloc, reason)?;
                    *self.stats.preemptions.entry(reason.as_str()).or_default() += 1;
                    if let Some(grace) = self.preemption_report_grace {
                        self.preempting
                            .insert(alloc, (order.how, order.at + order.how.limit() + grace));
                    }
                    self.emit(world, now, Decision::Preempt(order));
                }
            }
        }
        // Cycle ticks, energy windows, staging ends, drift deadlines: woken once per time.
        if let Some(t) = self.next_wakeup()
            && t > now
            && self.last_wake != Some(t)
        {
            self.last_wake = Some(t);
            self.emit(world, now, Decision::WakeAt(t));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, NodeSpec, Policy};

    /// An adopted run counts its work from when it really started, not from the new leader's start.
    #[test]
    fn an_adopted_run_counts_from_its_start() {
        let mut engine = Engine::new(
            EngineConfig::new(Policy::EASY),
            (0..4).map(|i| NodeSpec::plain(format!("n{i}"))).collect(),
        )
        .unwrap();
        let t = engine.add_tenant("t");
        let vc = engine.add_vcluster("v");
        let mut c = Controller::new(engine);
        let spec = AllocSpec::simple(t, vc, 2, Duration::from_hours(1));
        let now = Time(100_000);
        let id = c.submit(now, spec).unwrap();
        c.adopt(now, id, &[NodeId(0), NodeId(1)], (Time(10_000), Time(40_000)), None)
            .unwrap();
        assert_eq!(c.work_done(id, Time(160_000)), Duration(120_000));
        assert!(
            c.adopt(now, id, &[NodeId(2)], (Time(10_000), Time(40_000)), None)
                .is_err(),
            "adopted once"
        );
        c.resubmitted(now, id, Time(5_000)).unwrap();
        assert_eq!(c.engine.allocation(id).unwrap().submitted, Time(5_000));
    }
}
