//! The fake world: the simulator's implementation of the controller's ports. The event queue is the
//! clock; a fake quorum commits proposals after a latency (validating ownership and quotas); fake nodes
//! run each allocation for its trace run time (minus the work it resumes from), kill it at its walltime
//! (after the SIGTERM grace), fail prologues on nodes with a broken image cache, write checkpoints in
//! the time the broker's model gives, stop preempted victims, and wipe released sensitive nodes.

use crate::audit;
use crate::config::WipeModel;
use crate::events::{EventKind, EventQueue};
use crate::events::{RANK_END, RANK_NODE, RANK_WAKEUP};
use crate::quorum::FakeQuorum;
use crate::timeline::{self, RunSpan, Timeline, TimelineEvent, TimelineKind};
use lattice_engine::{
    AllocId, AuditEvent, Duration, EndReason, Engine, Fleet, NodeId, PreemptHow, PreemptOrder, Proposal, Quorum,
    StopReason, Time, Timer,
};
use lattice_traces::Workload;
use std::collections::{BTreeMap, BTreeSet};

/// How long after its start a failing prologue is reported.
const PROLOGUE_TIME: Duration = Duration(5_000);

/// The simulator's world.
pub(crate) struct FakeWorld<'a> {
    pub q: EventQueue,
    /// Rank of the world's reports at equal times (pyss orders them after arrivals).
    pub rank_end: u8,
    pub quorum: FakeQuorum,
    pub commit_latency: Duration,
    pub fake: FakeNodes,
    pub workload: &'a Workload,
    /// Node names by index (the audit log names nodes).
    pub node_names: Vec<String>,
    /// Trace index of each engine allocation.
    pub trace_of: Vec<usize>,
    /// SIGTERM → SIGKILL grace at the walltime.
    pub walltime_grace: Duration,
    pub wipe: WipeModel,
    pub boot: Option<crate::config::BootModel>,
    pub wipe_rng: rand_chacha::ChaCha8Rng,
    /// Lost preemption reports, drawn from their own stream.
    pub reports: Option<crate::config::ReportModel>,
    /// The mirrors' latency (`None`: records are durable at once).
    pub durability: Option<crate::config::DurabilityModel>,
    pub report_rng: rand_chacha::ChaCha8Rng,
    pub wakeups: BTreeSet<Time>,
    /// pyss: allocations by estimated end, to release their nodes in the quorum at that time.
    pub pyss: bool,
    pub pyss_ends: BTreeSet<(Time, AllocId)>,
    pub checkpoint_attempts: u64,
    pub checkpoint_ok: u64,
}

impl Quorum for FakeWorld<'_> {
    fn propose(&mut self, view: &Engine, now: Time, p: &Proposal) -> Option<bool> {
        let id = p.alloc;
        self.quorum.propose(p.clone());
        if self.commit_latency == Duration::ZERO {
            Some(self.quorum.decide(view, id))
        } else {
            self.q.push(now + self.commit_latency, RANK_END, EventKind::Commit(id));
            None
        }
    }

    /// The end is on a majority of the mirrors after their latency.
    fn persist(&mut self, _view: &Engine, now: Time, record: lattice_engine::Durable) {
        let latency = self.durability.map_or(Duration::ZERO, |m| m.end_latency);
        self.q.push(now + latency, RANK_END, EventKind::Durable(record));
    }

    /// The allocation stays Pending (the controller counts the refusal; the next pass retries it).
    fn refuse(&mut self, _view: &Engine, _now: Time, _alloc: AllocId, _why: &lattice_engine::Refusal) {}

    fn release(&mut self, view: &Engine, _now: Time, alloc: AllocId, _nodes: &[NodeId]) {
        self.quorum.release(view, alloc);
    }

    fn scale(&mut self, _view: &Engine, _now: Time, alloc: AllocId, node: NodeId, added: bool) {
        self.quorum.scale(alloc, node, added);
    }

    fn audit(&mut self, view: &Engine, now: Time, alloc: AllocId, event: AuditEvent, nodes: &[NodeId]) {
        audit_claim(
            &mut self.quorum.audit,
            view,
            self.workload,
            &self.trace_of,
            &self.node_names,
            alloc,
            now,
            event.as_str(),
            nodes,
        );
    }
}

impl Fleet for FakeWorld<'_> {
    fn launch(&mut self, view: &Engine, now: Time, l: &lattice_engine::Launch<'_>) {
        let id = l.alloc;
        self.start_run(view, now, id, l.nodes, l.resume_from, l.staging_remaining_s);
        if self.pyss
            && let Some(e) = view.allocation(id).and_then(|a| a.estimated_end())
        {
            self.pyss_ends.insert((e, id));
        }
    }

    fn stop(&mut self, _view: &Engine, now: Time, alloc: AllocId, _why: StopReason) {
        self.fake.bump(alloc, now);
    }

    fn preempt(&mut self, view: &Engine, now: Time, o: &PreemptOrder) {
        self.fake.event(now, TimelineKind::Preemption(o.reason.as_str()));
        if let Some(m) = self.reports {
            use rand_chacha::rand_core::Rng;
            let draw = (self.report_rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            if draw < m.lost_probability {
                // Its agents never report how it stopped: the controller's report grace decides.
                return;
            }
        }
        let epoch = self.fake.epoch(o.alloc);
        let at = o.at;
        match o.how {
            PreemptHow::Kill { grace } => {
                // Storage outage: no checkpoint can be written; the victim is killed.
                self.checkpoint_attempts += 1;
                self.fake.event(at, TimelineKind::CheckpointFailed);
                self.q.push(
                    at + grace,
                    self.rank_end,
                    EventKind::Completion(o.alloc, EndReason::PreemptionKilled, epoch),
                );
            }
            PreemptHow::Stop { grace } => {
                // SIGTERM, grace, then it stops without a checkpoint.
                self.q
                    .push(at + grace, self.rank_end, EventKind::Suspend(o.alloc, epoch, false));
            }
            PreemptHow::CheckpointThenStop { deadline } => {
                self.checkpoint_attempts += 1;
                let Some(a) = view.allocation(o.alloc) else { return };
                let minutes = a
                    .spec
                    .checkpoint
                    .estimated_minutes
                    .unwrap_or(lattice_engine::preempt::DEFAULT_CHECKPOINT_MINUTES);
                let factor = a.spec.checkpoint.mechanism.duration_factor();
                let took = Duration((minutes * factor * 60_000.0).round() as u64);
                if took <= deadline {
                    self.checkpoint_ok += 1;
                    self.fake.event(at + took, TimelineKind::CheckpointDone);
                    self.q
                        .push(at + took, self.rank_end, EventKind::Suspend(o.alloc, epoch, true));
                } else {
                    self.fake.event(at + deadline, TimelineKind::CheckpointFailed);
                    self.q.push(
                        at + deadline,
                        self.rank_end,
                        EventKind::Completion(o.alloc, EndReason::PreemptionKilled, epoch),
                    );
                }
            }
        }
    }

    fn checkpoint(&mut self, view: &Engine, now: Time, alloc: AllocId) -> Option<bool> {
        let t = view.checkpoint_write_time_s(alloc);
        let epoch = self.fake.epoch(alloc);
        self.checkpoint_attempts += 1;
        if t.is_finite() {
            self.q.push(
                now + Duration((t * 1000.0).round() as u64),
                self.rank_end,
                EventKind::CheckpointDone(alloc, epoch),
            );
            None
        } else {
            self.fake.event(now, TimelineKind::CheckpointFailed);
            Some(false)
        }
    }

    fn wipe(&mut self, view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]) {
        let whole = view.allocation(alloc).is_some_and(|a| a.nodes == nodes);
        if whole {
            let (took, ok) = draw_wipe(&mut self.wipe_rng, &self.wipe);
            self.q.push(now + took, self.rank_end, EventKind::WipeDone(alloc, ok));
        } else {
            // Part of a claim's nodes (an operator's retry of a quarantined node): each on its own.
            for &n in nodes {
                let (took, ok) = draw_wipe(&mut self.wipe_rng, &self.wipe);
                self.q
                    .push(now + took, self.rank_end, EventKind::NodeWiped(alloc, n, ok));
            }
        }
    }

    fn boot(&mut self, _view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]) {
        let m = self.boot.unwrap_or_default();
        let model = WipeModel {
            min: m.min,
            max: m.max,
            failure_probability: m.failure_probability,
            timeout: None,
        };
        for &n in nodes {
            let (took, ok) = draw_wipe(&mut self.wipe_rng, &model);
            self.q.push(now + took, self.rank_end, EventKind::Booted(alloc, n, ok));
        }
    }

    fn watch(&mut self, _view: &Engine, now: Time, node: NodeId, grace: Duration) {
        self.q.push(now + grace, RANK_NODE, EventKind::Grace(node.0));
    }

    /// The fake infrastructure takes the flag (a drifted node stays drifted until the trace says it
    /// conforms); a sensitive node's drift is audited with the claim holding it, if any.
    fn drift(&mut self, view: &Engine, now: Time, node: NodeId, drifted: bool, sensitive: bool) {
        self.fake.drift_flags += u64::from(drifted);
        if !sensitive {
            return;
        }
        let action = if drifted { "drift" } else { "conformant" };
        let name = self.node_names.get(node.index()).map_or("", String::as_str);
        let claim = view.node(node).and_then(|n| n.owner).map(|o| o.alloc);
        let alloc = claim.map_or_else(String::new, |a| self.workload.jobs[self.trace_of[a.index()]].id.clone());
        self.quorum
            .audit
            .append(now.as_millis(), action, &alloc, "lattice", name);
    }
}

impl Timer for FakeWorld<'_> {
    fn wake_at(&mut self, at: Time) {
        if self.wakeups.insert(at) {
            self.q.push(at, RANK_WAKEUP, EventKind::Wakeup);
        }
    }
}

impl FakeWorld<'_> {
    /// The fake node starts a committed allocation: it ends at start + the rest of its run, or is
    /// killed at its walltime.
    fn start_run(
        &mut self,
        view: &Engine,
        now: Time,
        id: AllocId,
        nodes: &[NodeId],
        resume_from: Duration,
        staging_remaining_s: f64,
    ) {
        // Started before its data was fully staged: an I/O stall at start.
        let stall = Duration((staging_remaining_s * 1000.0).round() as u64);
        self.fake.stall_ms += stall.0;
        let job = &self.workload.jobs[self.trace_of[id.index()]];
        let walltime = job.spec.lifecycle.walltime();
        let (run, known) = match (job.runtime, walltime) {
            (Some(r), _) => (Some(r), true),
            (None, Some(w)) => {
                if self.fake.epoch(id) == 0 {
                    self.fake.defaulted_runtime += 1;
                }
                (Some(w), false)
            }
            (None, None) => (None, false),
        };
        // A resumed allocation only has the rest of its work left; a stall adds to it. One whose run
        // time the trace does not give runs to its walltime, every run (its work is not known, only
        // that it never ended by itself).
        let run = run.map(|r| {
            let rest = if known { r.0.saturating_sub(resume_from.0) } else { r.0 };
            Duration(rest + stall.0)
        });
        self.fake.started(id, now, nodes);
        let borrowed = view.borrowed_nodes(id);
        if borrowed > 0 {
            self.fake.event(now, TimelineKind::Borrow(borrowed));
        }
        let epoch = self.fake.epoch(id);
        // The prologue (uenv pull/mount) fails on a node with a broken image cache: the agent reports it
        // a few seconds after the start, and the allocation never runs its entrypoint.
        if let Some(bad) = nodes.iter().find(|n| self.fake.bad_image.contains(n)).copied() {
            self.q.push(
                now + PROLOGUE_TIME,
                self.rank_end,
                EventKind::PrologueFail(id, bad.0, epoch),
            );
            return;
        }
        match (run, walltime) {
            // Past its walltime: SIGTERM at the walltime, SIGKILL after the grace period (the job ends at
            // the earlier of its own end and the kill).
            (Some(r), Some(w)) if r > w => self.q.push(
                now + Duration((w.0 + self.walltime_grace.0).min(r.0)),
                self.rank_end,
                EventKind::Completion(id, EndReason::WalltimeExceeded, epoch),
            ),
            (Some(r), _) => {
                let reason = if job.exit_ok {
                    EndReason::Success
                } else {
                    EndReason::ExitFailure
                };
                self.q
                    .push(now + r, self.rank_end, EventKind::Completion(id, reason, epoch));
            }
            (None, _) => {} // unbounded, never ends in this trace
        }
    }
}

/// Appends a sensitive audit entry for claim `id` on `nodes`.
#[allow(clippy::too_many_arguments)]
fn audit_claim(
    log: &mut audit::AuditLog,
    engine: &Engine,
    workload: &Workload,
    trace_of: &[usize],
    node_names: &[String],
    id: AllocId,
    now: Time,
    event: &str,
    nodes: &[NodeId],
) {
    let Some(a) = engine.allocation(id) else { return };
    let job = &workload.jobs[trace_of[id.index()]];
    let user = job
        .user()
        .map(str::to_string)
        .or_else(|| engine.tenant(a.spec.tenant).map(|t| t.name))
        .unwrap_or_default();
    let names: Vec<&str> = nodes
        .iter()
        .map(|n| node_names.get(n.index()).map_or("", String::as_str))
        .collect();
    log.append(now.as_millis(), event, &job.id, &user, &names.join(","));
}

/// Draws a wipe (or a boot): its duration, uniform in the model's range, and whether it succeeds.
fn draw_wipe(rng: &mut rand_chacha::ChaCha8Rng, m: &WipeModel) -> (Duration, bool) {
    use rand_chacha::rand_core::Rng;
    let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let span = m.max.as_millis().saturating_sub(m.min.as_millis()) as f64;
    let took = Duration(m.min.as_millis() + (unit() * span) as u64);
    (took, unit() >= m.failure_probability)
}

/// The fake nodes' view of each allocation: which run is current (stale events are ignored), and the
/// timeline of runs and point events.
#[derive(Debug, Default)]
pub(crate) struct FakeNodes {
    epoch: Vec<u32>,
    /// Drifted nodes flagged to the (fake) infrastructure.
    pub drift_flags: u64,
    pub defaulted_runtime: u64,
    /// I/O stalls of allocations started before their staging finished.
    pub stall_ms: u64,
    /// Nodes whose local image cache is broken: every prologue there fails (until `node_recover`).
    pub bad_image: BTreeSet<NodeId>,
    pub prologue_failures: u64,
    /// The timeline (kept only with `keep_timeline`): runs (the open run of each allocation is
    /// `open[id]`) and point events.
    pub timeline: Timeline,
    pub keep_timeline: bool,
    open: Vec<Option<OpenRun>>,
    /// Each allocation's time on nodes, seconds, summed over its ended runs (the `run` of the
    /// node-time metrics).
    pub held_s: Vec<f64>,
}

/// An allocation's current run: when it started, and its entry in the timeline's runs (`NOT_KEPT`
/// without a timeline).
#[derive(Clone, Copy, Debug)]
struct OpenRun {
    run: u32,
    start_s: f64,
}

const NOT_KEPT: u32 = u32::MAX;

impl FakeNodes {
    /// Fake nodes; the timeline of runs and events is kept only when `keep_timeline` (reports).
    /// Fake nodes for a replay of about `allocations` allocations (room made for them up front: a
    /// year's lists grown by doubling would hold up to twice that).
    pub fn new(keep_timeline: bool, allocations: usize) -> FakeNodes {
        FakeNodes {
            keep_timeline,
            epoch: Vec::with_capacity(allocations),
            open: Vec::with_capacity(allocations),
            held_s: Vec::with_capacity(allocations),
            ..FakeNodes::default()
        }
    }

    fn grow(&mut self, id: AllocId) {
        if self.epoch.len() <= id.index() {
            self.epoch.resize(id.index() + 1, 0);
            self.open.resize(id.index() + 1, None);
            self.held_s.resize(id.index() + 1, 0.0);
        }
    }

    pub fn event(&mut self, now: Time, kind: TimelineKind) {
        if self.keep_timeline {
            self.timeline.events.push(TimelineEvent {
                time_s: now.as_secs_f64(),
                kind,
            });
        }
    }

    /// Ends the allocation's open run (if any) at `now`.
    fn close(&mut self, id: AllocId, now: Time) {
        self.grow(id);
        if let Some(o) = self.open[id.index()].take() {
            let end = now.as_secs_f64();
            self.held_s[id.index()] += end - o.start_s;
            if o.run != NOT_KEPT {
                self.timeline.runs[o.run as usize].end_s = Some(end);
            }
        }
    }

    pub fn epoch(&mut self, id: AllocId) -> u32 {
        self.grow(id);
        self.epoch[id.index()]
    }

    fn started(&mut self, id: AllocId, now: Time, nodes: &[NodeId]) {
        self.close(id, now);
        let start_s = now.as_secs_f64();
        let mut run = NOT_KEPT;
        if self.keep_timeline {
            run = self.timeline.runs.len() as u32;
            self.timeline.runs.push(RunSpan {
                job: id.index() as u32,
                start_s,
                end_s: None,
                nodes: timeline::node_ranges(nodes),
            });
        }
        self.open[id.index()] = Some(OpenRun { run, start_s });
    }

    /// The current run ended at `now` (completion, kill, suspension, prologue failure, lost node):
    /// events still queued for it are stale.
    pub fn bump(&mut self, id: AllocId, now: Time) {
        self.close(id, now);
        self.epoch[id.index()] += 1;
    }
}

/// Preemption counts by reason, as the summary keys them.
pub(crate) fn by_reason(m: &BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
    m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}
