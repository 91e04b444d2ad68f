//! What the control plane keeps besides the controller, one struct per responsibility. [`crate::Control`]
//! holds one of each; the methods that read and change them are grouped the same way in the crate's
//! other modules.

use crate::request::{DataIn, EnvironmentIn, ExposeIn};
use crate::types::{AllocationView, LIVE_BYTES, LOG_TAIL_BYTES, LOGS_KEPT, LiveOutput, Partition};
use lattice_agent_protocol::{Output as OutputIn, Stream};
use lattice_engine::{AllocId, PreemptHow, ProjectId, TenantId, Time, VClusterId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Per-allocation details the engine does not keep.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub(crate) name: String,
    pub(crate) user: Option<String>,
    pub(crate) project: Option<String>,
    pub(crate) entrypoint: Option<String>,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) run: std::time::Duration,
    pub(crate) last_rejection: Option<String>,
    pub(crate) telemetry: String,
    pub(crate) checkpoints: u32,
    pub(crate) last_checkpoint_ms: Option<u64>,
    /// Why it was last preempted ("priority for a-000009").
    pub(crate) preempted_for: Option<String>,
    /// Reactive: the metric it scales on.
    pub(crate) metric: Option<String>,
    pub(crate) environment: Option<EnvironmentIn>,
    pub(crate) data: Option<DataIn>,
    /// Its exposed ports and its liveness probe.
    pub(crate) expose: Vec<ExposeIn>,
    pub(crate) liveness: Option<lattice_agent_protocol::ProbeSpec>,
    /// The loopback port of its gRPC checkpoint callback, when it declared one.
    pub(crate) checkpoint_port: Option<u16>,
}

impl Meta {
    pub(crate) fn new(name: String, run: std::time::Duration) -> Meta {
        Meta {
            name,
            user: None,
            project: None,
            entrypoint: None,
            tags: BTreeMap::new(),
            run,
            last_rejection: None,
            telemetry: "prod".into(),
            checkpoints: 0,
            last_checkpoint_ms: None,
            preempted_for: None,
            metric: None,
            environment: None,
            data: None,
            expose: Vec::new(),
            liveness: None,
            checkpoint_port: None,
        }
    }
}

/// A victim's preemption in progress.
#[derive(Clone, Debug)]
pub(crate) struct Preempting {
    pub(crate) how: PreemptHow,
    /// When the sequence starts (a reclaim's grace period later).
    pub(crate) at: Time,
    /// Nodes whose agent has not been told yet.
    pub(crate) to_tell: BTreeSet<u32>,
}

/// A released claim's wipe on real agents (the controller awaits the outcomes and times them out).
#[derive(Clone, Debug)]
pub(crate) struct Wiping {
    /// Nodes whose agents are to be told, once the wipe is carried out — after the release's audit
    /// entry is committed ([`crate::Control::wipe_orders_out`]): an agent never reports a wipe the
    /// audit log has no release before.
    pub(crate) pending: BTreeSet<u32>,
    /// Nodes whose agent may be told at its next poll.
    pub(crate) to_tell: BTreeSet<u32>,
    /// When the wipe started (ms since the epoch).
    pub(crate) started_ms: u64,
}

/// The names the API shows and the details the engine does not keep: tenants, projects,
/// vClusters, nodes and allocations by name, idempotency keys, DAGs, and the records of what ended
/// before this control plane took over.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// (tenant, idempotency key) → the id its first submission got.
    pub(crate) keys: BTreeMap<(String, String), String>,
    pub(crate) tenants: BTreeMap<String, TenantId>,
    /// (tenant, project) → the engine's project id (a project belongs to one tenant).
    pub(crate) projects: BTreeMap<(String, String), lattice_engine::ProjectId>,
    /// Project names by id (the inverse of `projects`).
    pub(crate) project_of_id: Vec<String>,
    pub(crate) vclusters: BTreeMap<String, VClusterId>,
    pub(crate) default_vcluster: String,
    pub(crate) meta: Vec<Meta>,
    pub(crate) by_name: BTreeMap<String, AllocId>,
    pub(crate) node_names: Vec<String>,
    pub(crate) next: u64,
    /// DAG id → (member name, allocation id) in submission order.
    pub(crate) dags: BTreeMap<String, Vec<(String, String)>>,
    /// Allocations that ended before this control plane took over: their final records (from the
    /// durable copy), by id.
    pub(crate) history: BTreeMap<String, AllocationView>,
    pub(crate) node_by_name: BTreeMap<String, u32>,
}

/// The node agents as this control plane hears them: registrations, heartbeats and their grace,
/// partitions, what each runs and reported, and the starts and stops still to be shown by them.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    /// Per node: when its heartbeat grace runs out (ms), once it missed one.
    pub(crate) grace_until: BTreeMap<u32, u64>,
    /// Per node: the agent's last heartbeat sequence number and when it arrived (ms), once registered
    /// ([`SEQ_UNKNOWN`] for a node taken over with a re-attached allocation, until its agent registers).
    pub(crate) agents: Vec<Option<(u64, u64)>>,
    /// Real agents: per running allocation, the nodes whose agent reported its exit (node → code).
    pub(crate) exits: BTreeMap<AllocId, BTreeMap<u32, i32>>,
    /// (node, allocation) of starts not yet launched on that node: a process of the allocation the
    /// node's agent still runs there is from an earlier start, stopped first ([`Control::work`]).
    pub(crate) fresh_starts: BTreeSet<(u32, AllocId)>,
    /// Allocations that left nodes (ended, requeued, preempted) whose agents have not yet shown
    /// they stopped them there: a next start waits for these ([`Control::work`]).
    pub(crate) stopping_on: BTreeMap<AllocId, BTreeSet<u32>>,
    /// Where agents last said (in their work polls) each allocation runs: node indexes.
    pub(crate) running_where: BTreeMap<String, BTreeSet<u32>>,
    /// Each node's last running list.
    pub(crate) agent_running: BTreeMap<u32, Vec<String>>,
    /// Nodes whose agents have not polled this control plane since it took over, and when it did:
    /// they may still run anything (under a predecessor's lease) until that lease is surely over.
    pub(crate) unheard: BTreeSet<u32>,
    pub(crate) took_over_ms: u64,
    /// Allocations taken over from the durable queue (a predecessor may have started them; ones
    /// submitted since cannot run anywhere yet).
    pub(crate) taken_over: BTreeSet<AllocId>,
    /// Per node: the fingerprint and capabilities its agent reported.
    pub(crate) agent_info: BTreeMap<u32, (Option<String>, Option<serde_json::Value>)>,
    /// Per node: where its agent's own service listens (task launches' fences between agents).
    pub(crate) peer_addr: BTreeMap<u32, String>,
    /// Per node: the last partition its agent replayed heartbeats for.
    pub(crate) partitions: BTreeMap<u32, Partition>,
    /// Per node whose inventory entry leaves capabilities unset: which, and the entry's own.
    pub(crate) unset: BTreeMap<u32, (lattice_engine::UnsetCapabilities, lattice_engine::NodeCapabilities)>,
    /// Per node: what its agent discovered, as the quorum recorded it.
    pub(crate) discovered: BTreeMap<u32, lattice_engine::DiscoveredCapabilities>,
}

/// The nodes' conformance fingerprints: what each must match, what it reported and when, and the
/// drift seen.
#[derive(Debug, Default)]
pub(crate) struct Conformance {
    /// Per node: when its agent last reported the fingerprint (ms), and whether a fresh one is asked.
    pub(crate) fingerprint_ms: BTreeMap<u32, u64>,
    pub(crate) fingerprint_asked: BTreeSet<u32>,
    /// Per node: the conformance baseline it must match (from the inventory: OpenCHAMI's groups).
    pub(crate) baselines: BTreeMap<u32, String>,
    /// Per node: the first fingerprint this control plane saw (the baseline when nothing else says).
    pub(crate) first_fingerprint: BTreeMap<u32, String>,
    /// Per drifted node: (expected, actual) fingerprints.
    pub(crate) drift_seen: BTreeMap<u32, (String, String)>,
}

/// Allocations' output: the tails agents reported with exits, and the live output of followed
/// allocations.
#[derive(Debug, Default)]
pub(crate) struct Output {
    /// The output tails agents reported with exits: allocation → node → text (the newest
    /// [`LOGS_KEPT`] allocations).
    pub(crate) logs: BTreeMap<AllocId, BTreeMap<(String, Stream), String>>,
    /// Allocations someone follows (until when, ms) and the live output their agents sent.
    pub(crate) followed: BTreeMap<AllocId, u64>,
    pub(crate) live: BTreeMap<AllocId, BTreeMap<(String, Stream), VecDeque<OutputIn>>>,
}

/// Preemptions and checkpoint hints in flight on real agents: who is told, who reported, since when.
#[derive(Debug, Default)]
pub(crate) struct Stops {
    /// Victims being preempted (until their agents report them stopped): how, from when, and the
    /// nodes whose (real) agent has not been told yet.
    pub(crate) preempting: BTreeMap<AllocId, Preempting>,
    /// Real agents: per allocation with a checkpoint hint out, what each node's agent reported.
    pub(crate) hint_reports: BTreeMap<AllocId, BTreeMap<u32, bool>>,
    /// Checkpoint hints not yet handed to the agents: allocation → nodes still to tell.
    pub(crate) checkpoint_hints: BTreeMap<AllocId, BTreeSet<u32>>,
    /// When each allocation's last checkpoint hint went out (its duration ends at the report).
    pub(crate) hinted_at: BTreeMap<AllocId, Time>,
}

/// Released sensitive claims' wipes on real agents, and the notes their audit entries carry.
#[derive(Debug, Default)]
pub(crate) struct Wipes {
    /// Real agents: per released sensitive claim, the nodes still to wipe (not yet told, told) and
    /// each node's outcome.
    pub(crate) wiping: BTreeMap<AllocId, Wiping>,
    /// Per (claim, node): when its wipe started and why it failed, or why its prologue failed,
    /// for the audit entry.
    pub(crate) wipe_notes: BTreeMap<(AllocId, u32), String>,
}

/// What is not yet on a majority of the members' disks: submissions being mirrored, ends the
/// controller asked to be, and the ends from before a take-over a start may wait for.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    /// Submissions queued here not yet known to be on a majority's disks: id → whether a request
    /// is mirroring it right now.
    pub(crate) unacked: BTreeMap<String, bool>,
    /// Ends the controller asked to be put on a majority ([`Decision::Persist`]): recorded there by
    /// the scheduling loop.
    pub(crate) settle_wanted: BTreeSet<String>,
    /// Dependencies that ended before this control plane took over (in `history`), by the number
    /// the controller knows them by ([`lattice_engine::Durable::PriorEnd`]).
    pub(crate) prior_ends: BTreeMap<String, u64>,
}

/// External services' state around the engine's inputs: VAST prefetches for staging and the fabric
/// manager's CXI services.
#[derive(Debug, Default)]
pub(crate) struct Services {
    /// Staging allocations: whether their VAST prefetch is issued, and how many times it failed.
    pub(crate) prefetched: BTreeMap<AllocId, (bool, u32)>,
    /// CXI services created for running allocations: name → (service id, auth key).
    pub(crate) cxi: BTreeMap<String, (String, String)>,
    /// CXI services a new leader took over from the quorum whose auth key is still to be read:
    /// name → (service id, whether its key was asked for).
    pub(crate) cxi_taken_over: BTreeMap<String, (String, bool)>,
}

impl Output {
    /// Keeps `node`'s output tail of `stream` for `id` (its last [`LOG_TAIL_BYTES`]; the newest
    /// [`LOGS_KEPT`] allocations).
    pub(crate) fn keep_tail(&mut self, id: AllocId, node: &str, stream: Stream, tail: &str) {
        let start = tail.len().saturating_sub(LOG_TAIL_BYTES);
        let start = (start..=tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        self.logs
            .entry(id)
            .or_default()
            .insert((node.to_string(), stream), tail[start..].to_string());
        while self.logs.len() > LOGS_KEPT {
            self.logs.pop_first();
        }
    }

    /// The output tails of `stream` kept for `id`, by node.
    pub(crate) fn tails(&self, id: AllocId, stream: Stream) -> BTreeMap<String, String> {
        self.logs
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|((_, s), _)| *s == stream)
            .map(|((n, _), t)| (n.clone(), t.clone()))
            .collect()
    }

    /// `id` is followed until `until` (ms); its live output of `stream` after `after` (node →
    /// offset; from the oldest kept when a node is absent).
    pub(crate) fn follow(
        &mut self,
        id: AllocId,
        until: u64,
        stream: Stream,
        after: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, LiveOutput> {
        self.followed.insert(id, until);
        let mut out = BTreeMap::new();
        let of_stream = self
            .live
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|((_, s), _)| *s == stream);
        for ((node, _), segs) in of_stream {
            let from = after.get(node).copied().unwrap_or(0);
            let mut o = LiveOutput {
                offset: u64::MAX,
                data: String::new(),
                next: from,
            };
            for s in segs.iter().filter(|s| s.next > from) {
                o.offset = o.offset.min(s.offset.max(from));
                // A segment that straddles `from` contributes its part after it (offsets are bytes).
                let skip = from.saturating_sub(s.offset) as usize;
                let start = (skip.min(s.data.len())..=s.data.len())
                    .find(|i| s.data.is_char_boundary(*i))
                    .unwrap_or(s.data.len());
                o.data.push_str(&s.data[start..]);
                o.next = s.next;
            }
            if o.offset == u64::MAX {
                o.offset = from;
            }
            out.insert(node.clone(), o);
        }
        out
    }

    /// New live output of `id` from `node` (a resend ignored; the newest [`LIVE_BYTES`] per node,
    /// the newest [`LOGS_KEPT`] allocations).
    pub(crate) fn add_live(&mut self, id: AllocId, node: &str, o: OutputIn) {
        let segs = self
            .live
            .entry(id)
            .or_default()
            .entry((node.to_string(), o.stream))
            .or_default();
        if segs.back().is_some_and(|last| o.offset < last.next) {
            return; // already have it (a resend)
        }
        segs.push_back(o);
        let mut kept: usize = segs.iter().map(|s| s.data.len()).sum();
        while kept > LIVE_BYTES && segs.len() > 1 {
            kept -= segs.pop_front().map_or(0, |s| s.data.len());
        }
        while self.live.len() > LOGS_KEPT {
            self.live.pop_first();
        }
    }
}

impl Registry {
    /// The names of `nodes`.
    pub(crate) fn names_of(&self, nodes: &[lattice_engine::NodeId]) -> Vec<String> {
        nodes.iter().map(|n| self.node_names[n.index()].clone()).collect()
    }

    /// Names `tenant`'s project `project` with the engine's `id`.
    pub(crate) fn name_project(&mut self, tenant: &str, project: &str, id: ProjectId) {
        self.projects.insert((tenant.to_string(), project.to_string()), id);
        if self.project_of_id.len() <= id.index() {
            self.project_of_id.resize(id.index() + 1, String::new());
        }
        self.project_of_id[id.index()] = project.to_string();
    }

    /// The engine's id of `tenant`'s project `project`, registering it if new.
    pub(crate) fn project_id(&mut self, tenant: &str, project: &str) -> ProjectId {
        let key = (tenant.to_string(), project.to_string());
        if let Some(id) = self.projects.get(&key) {
            return *id;
        }
        let id = ProjectId(self.project_of_id.len() as u32);
        self.name_project(tenant, project, id);
        id
    }

    /// An allocation's name (empty for an unknown id).
    pub(crate) fn name_of(&self, id: AllocId) -> String {
        self.meta.get(id.index()).map(|m| m.name.clone()).unwrap_or_default()
    }
}
