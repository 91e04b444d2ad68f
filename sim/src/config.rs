//! What a replay is asked to do and what it returns: the settings ([`SimConfig`]) and the fake
//! world's models (wipes, hardened boots, failures), the errors, and the [`SimResult`].

use crate::audit;
use crate::metrics::{EngineCost, JobRecord, Summary};
use crate::timeline::Timeline;
use lattice_engine::{Duration, Policy, Time, VClusterConfig};
use std::collections::BTreeMap;

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
    /// Network domains and their VNI pool (`None`: not modelled; book: "Network Domains"): a start
    /// whose domain needs a VNI the pool has not is refused and stays Pending.
    pub network: Option<NetworkModel>,
    /// Preemption reports the fake agents lose (`None`: every victim's stop is reported): the
    /// controller takes a victim unreported past the order's limit and `grace` as stopped without
    /// a checkpoint.
    pub preemption_reports: Option<ReportModel>,
    /// The quorum members' mirrors (`None`: not modelled — records are durable at once): each
    /// submission reaches a majority of their disks `record_latency` after it arrives, and an end a
    /// dependent waits for `end_latency` after the controller asks for it; until then the start
    /// waits.
    pub durability: Option<DurabilityModel>,
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
    /// Keep the timeline (every run with its nodes, and the point events) for reports and tables;
    /// `false`: [`SimResult::timeline`] is empty and only each allocation's time on nodes is kept
    /// (a year's replay without a report holds one run span less per start).
    pub keep_timeline: bool,
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
            network: None,
            preemption_reports: None,
            durability: None,
            storage_outages: Vec::new(),
            fairness_window: Duration::from_hours(24),
            failures: None,
            horizon: None,
            walltime_grace: Duration::ZERO,
            decision_log: false,
            keep_timeline: true,
            slo_wait: Vec::new(),
        }
    }
}

/// Lost preemption reports: each victim's report is lost with `lost_probability` (seeded draws);
/// the controller's report grace is `grace`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReportModel {
    pub grace: Duration,
    pub lost_probability: f64,
}

/// How long the quorum members' mirrors take to put a record on a majority of their disks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DurabilityModel {
    pub record_latency: Duration,
    pub end_latency: Duration,
}

/// The VNI pool network domains draw from, and how long a drained domain keeps its VNI.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NetworkModel {
    pub vni_pool_start: u32,
    pub vni_pool_end: u32,
    pub grace: Duration,
}

impl Default for NetworkModel {
    /// The book's defaults: VNIs 1000-4095, a 5-minute grace.
    fn default() -> Self {
        NetworkModel {
            vni_pool_start: 1000,
            vni_pool_end: 4095,
            grace: Duration::from_mins(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("engine setup: {0}")]
    Engine(#[from] lattice_engine::EngineError),
    #[error("network: {0}")]
    Network(#[from] lattice_engine::VniError),
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
    /// The controller's wipe timeout (the runtime's `sensitive.wipe_timeout`): a wipe taking longer
    /// fails at the deadline, its nodes quarantined (`None`: every outcome is waited for).
    pub timeout: Option<Duration>,
}

impl Default for WipeModel {
    fn default() -> Self {
        WipeModel {
            min: Duration::from_mins(10),
            max: Duration::from_mins(30),
            failure_probability: 0.02,
            timeout: None,
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
