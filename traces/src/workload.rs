//! The replayable workload every importer produces: jobs in submission order plus the names they use and
//! an account of everything skipped.

use crate::error::Problem;
use lattice_engine::{AllocSpec, DependencyCondition, Duration, Registry, Time};
use std::collections::BTreeMap;

/// At most this many problems are kept per reason (all are counted).
pub const PROBLEMS_KEPT_PER_REASON: usize = 20;

/// One job of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    /// The trace's own job id (SWF field 1, the JSONL `id`).
    pub id: String,
    pub submit: Time,
    /// Actual run time from the trace; `None` = runs until its walltime (or forever when unbounded).
    pub runtime: Option<Duration>,
    /// Exit status 0 (a non-zero exit ends the allocation `Failed`).
    pub exit_ok: bool,
    /// The request; `tenant`/`project`/`vcluster` index this workload's registries, `depends_on` is empty
    /// (see `deps`). Shared: a replay hands this very request to its engine when the tenant and
    /// vCluster ids agree (no copy per job); [`TraceJob::spec_mut`] to change it.
    pub spec: std::sync::Arc<AllocSpec>,
    /// Dependencies as indices into `Workload::jobs` (always earlier jobs).
    pub deps: Vec<(usize, DependencyCondition)>,
    /// Line of the trace it came from.
    pub line: u64,
    /// The user, DAG and task group, when the trace names any (boxed: most jobs of a site's
    /// history name none); read with [`TraceJob::user`], [`TraceJob::dag`], [`TraceJob::group_name`].
    pub names: Option<Box<JobNames>>,
}

/// What only some jobs of a trace name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobNames {
    /// The submitting user's identity (sensitive claims must have one).
    pub user: Option<String>,
    /// The DAG it belongs to.
    pub dag: Option<String>,
    /// The task group (by its submitted id) it is an element of.
    pub group_name: Option<String>,
}

impl TraceJob {
    /// The request, to change (copied first if a replay shares it).
    pub fn spec_mut(&mut self) -> &mut AllocSpec {
        std::sync::Arc::make_mut(&mut self.spec)
    }

    /// The names to change (made if it had none).
    pub fn names_mut(&mut self) -> &mut JobNames {
        self.names.get_or_insert_with(Default::default)
    }

    /// The submitting user's identity, when the trace names it.
    pub fn user(&self) -> Option<&str> {
        self.names.as_ref()?.user.as_deref()
    }

    /// The DAG it belongs to.
    pub fn dag(&self) -> Option<&str> {
        self.names.as_ref()?.dag.as_deref()
    }

    /// The task group (by its submitted id) it is an element of.
    pub fn group_name(&self) -> Option<&str> {
        self.names.as_ref()?.group_name.as_deref()
    }
}

/// A non-job event of the trace (cluster dynamics).
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEventKind {
    /// A node fails: `heartbeat` = it stops heartbeating (Degraded, then Down after the grace period
    /// unless it recovers); otherwise a hardware failure (Down at once).
    NodeFail {
        node: String,
        heartbeat: bool,
    },
    /// The node is back (heartbeat resumed, or repaired and re-enabled).
    NodeRecover {
        node: String,
    },
    Drain {
        node: String,
    },
    Undrain {
        node: String,
    },
    /// The node's agent reports a conformance fingerprint off its baseline (`drifted`), or back on it
    /// (`conform` in the event log).
    Drift {
        node: String,
        drifted: bool,
    },
    /// An operator retries the wipe of a quarantined node (`wipe_retry`: `lattice admin node wipe
    /// NODE --force`).
    WipeRetry {
        node: String,
    },
    /// A node joins the site (`node_added`: SMD gained it; the event's `node` is an inventory entry,
    /// one event per node it names).
    NodeAdded(Box<crate::inventory::JoiningNode>),
    /// What a node's agent discovered where the inventory leaves its GPUs, cores or memory unset
    /// (`node_capabilities`): the node is scheduled with them from this time on (once it is free).
    NodeCapabilities {
        node: String,
        capabilities: lattice_engine::DiscoveredCapabilities,
    },
    /// The checkpoint store's measured write bandwidth (GB/s) from this time on.
    CheckpointBandwidth {
        gbps: f64,
    },
    /// The memory of each of the node's GPUs (GB) as its agent reported it, from this time on.
    GpuMemory {
        node: String,
        gb: f64,
    },
    /// The electricity price from this time on.
    EnergyPrice {
        price: f64,
    },
    StorageOutage,
    StorageRecover,
    /// An administrator sets a vCluster's cost weights from this time on.
    Weights {
        vcluster: String,
        weights: lattice_engine::CostWeights,
    },
    /// An administrator sets (or, naming a vCluster the trace has not used yet, creates) a
    /// vCluster's scheduler configuration from this time on: the keys given change, the others stay
    /// ([`crate::vcluster_config`]).
    VCluster {
        vcluster: String,
        config: serde_json::Map<String, serde_json::Value>,
    },
    /// The site settings decisions read (heartbeat grace, drift, boot, wipe and preemption-report
    /// timeouts, by key in ms) from this time on: an operator's change, or a new leader applying what
    /// the quorum holds (`settings`).
    Settings {
        settings: lattice_engine::controller::settings::Settings,
    },
    /// The allocation is cancelled (waiting or running).
    Cancel {
        alloc: String,
    },
    /// The allocation's walltime changes (`PATCH`).
    Walltime {
        alloc: String,
        walltime: Duration,
    },
    /// A sample of a reactive allocation's scaling metric.
    Metric {
        alloc: String,
        value: f64,
    },
    /// The node's local image cache is broken (e.g. a corrupted uenv): every prologue on it fails until
    /// a `node_recover` for the node.
    PrologueFail {
        node: String,
    },
    /// A synthetic load curve for a reactive allocation (instead of `metric` samples): demand in nodes
    /// `base + amplitude·sin(2π·(t − ts)/period)` ± uniform `noise`, sampled every `interval` for
    /// `duration`; the simulator turns it into metric samples `target × demand / nodes held`.
    LoadCurve {
        alloc: String,
        base: f64,
        amplitude: f64,
        period: Duration,
        interval: Duration,
        duration: Duration,
        noise: f64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub time: Time,
    pub kind: TraceEventKind,
    pub line: u64,
}

/// The key of a tenant's project in [`Workload::projects`].
fn project_key(tenant: &str, project: &str) -> String {
    format!("{tenant}/{project}")
}

/// A parsed trace.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Where it came from (file name).
    pub source: String,
    pub jobs: Vec<TraceJob>,
    /// Cluster dynamics (node failures, drains, prices, storage), in time order.
    pub events: Vec<TraceEvent>,
    pub tenants: Registry,
    pub projects: Registry,
    pub vclusters: Registry,
    /// Cluster size the trace declares (SWF `MaxProcs`/`MaxNodes` header, in nodes).
    pub cluster_nodes: Option<u32>,
    /// Skipped lines/jobs by reason.
    pub skipped: BTreeMap<String, u64>,
    /// The first problems per reason, with file, line and field.
    pub problems: Vec<Problem>,
    /// Notes that change nothing but are worth telling (e.g. "trace was not sorted by submit time").
    pub notes: Vec<String>,
    /// Keep every problem, not only the first ones per reason.
    pub keep_all_problems: bool,
}

impl Workload {
    /// The id of `tenant`'s project `project` (a project belongs to one tenant: two tenants'
    /// `default` projects are two projects), registering it if new.
    pub fn intern_project(&mut self, tenant: &str, project: &str) -> lattice_engine::ProjectId {
        lattice_engine::ProjectId(self.projects.intern(&project_key(tenant, project)))
    }

    /// The id of `tenant`'s project `project`, if the trace has it.
    pub fn project_id(&self, tenant: &str, project: &str) -> Option<lattice_engine::ProjectId> {
        self.projects
            .lookup(&project_key(tenant, project))
            .map(lattice_engine::ProjectId)
    }

    /// A job's project name within its tenant (`default` when it has none).
    pub fn project_name(&self, spec: &lattice_engine::AllocSpec) -> &str {
        let tenant = self.tenants.get(spec.tenant.0).unwrap_or_default();
        self.projects
            .get(spec.project.0)
            .and_then(|k| k.strip_prefix(tenant)?.strip_prefix('/'))
            .filter(|p| !p.is_empty())
            .unwrap_or("default")
    }

    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }

    /// Counts a skipped line and keeps its problem if fewer than [`PROBLEMS_KEPT_PER_REASON`] are kept
    /// (all of them with `keep_all_problems`, as `rm-replay validate` wants).
    pub fn skip(&mut self, problem: Problem) {
        let n = self.skipped.entry(problem.reason.clone()).or_insert(0);
        *n += 1;
        if self.keep_all_problems || *n as usize <= PROBLEMS_KEPT_PER_REASON {
            self.problems.push(problem);
        }
    }

    /// Sorts jobs by submit time (stable: trace order breaks ties) and notes it if they were out of order.
    /// Dependencies are remapped.
    pub(crate) fn sort_by_submit(&mut self) {
        if self.jobs.is_sorted_by_key(|j| j.submit) {
            return;
        }
        let mut order: Vec<usize> = (0..self.jobs.len()).collect();
        order.sort_by_key(|&i| self.jobs[i].submit);
        let mut new_index = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new;
        }
        let mut jobs: Vec<Option<TraceJob>> = std::mem::take(&mut self.jobs).into_iter().map(Some).collect();
        self.jobs = order
            .iter()
            .map(|&i| jobs[i].take().expect("each index once"))
            .collect();
        for j in &mut self.jobs {
            for d in &mut j.deps {
                d.0 = new_index[d.0];
            }
        }
        self.notes.push(
            "trace was not sorted by submit time: jobs were replayed in submit order (ties keep trace order)".into(),
        );
    }
}
