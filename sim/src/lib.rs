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
mod config;
pub mod events;
pub mod facts;
mod host;
pub mod invariants;
pub mod metrics;
pub mod quorum;
mod replay;
mod summary;
pub mod timeline;
mod world;

pub use config::{
    BootModel, DEFAULT_SLO_WAIT, DurabilityModel, FailureModel, NetworkModel, ReportModel, SimConfig, SimError,
    SimResult, WipeModel,
};
pub use host::{Host, SiteNames};
pub use invariants::InvariantChecker;
pub use metrics::{EngineCost, GroupMetrics, JobRecord, Summary};
pub use replay::Replay;
pub use timeline::{RunSpan, Timeline, TimelineEvent, TimelineKind};

use lattice_engine::Controller;
use lattice_traces::{Inventory, Workload};

/// Numbers the workload's vClusters as a replay's engine numbers them — the inventory's first, in
/// its order, then the trace's others in theirs — so each arrival hands the trace's own request to
/// the engine rather than a copy with its vCluster id rewritten (one copy of each request). Call it
/// on a workload before replaying it on `inventory` (or sharing it between replays on it); names,
/// and so every output, are unchanged. Returns whether any id changed.
pub fn align_ids(workload: &mut Workload, inventory: &Inventory) -> bool {
    let mut engine_order = lattice_engine::Registry::default();
    for n in inventory.vclusters.names() {
        engine_order.intern(n);
    }
    let map: Vec<u32> = workload
        .vclusters
        .names()
        .iter()
        .map(|n| engine_order.intern(n))
        .collect();
    if map.iter().enumerate().all(|(i, &m)| i as u32 == m) {
        return false;
    }
    workload.vclusters = engine_order;
    // Jobs sharing a request share its renumbered copy: keyed by the shared request's address, the
    // request itself kept alive beside it so no other can take that address meanwhile.
    type Spec = std::sync::Arc<lattice_engine::AllocSpec>;
    let mut renumbered: std::collections::BTreeMap<usize, (Spec, Spec)> = std::collections::BTreeMap::new();
    for j in &mut workload.jobs {
        let v = map[j.spec.vcluster.index()];
        if v != j.spec.vcluster.0 {
            let key = std::sync::Arc::as_ptr(&j.spec) as usize;
            let (_, copy) = renumbered.entry(key).or_insert_with(|| {
                let mut s = (*j.spec).clone();
                s.vcluster = lattice_engine::VClusterId(v);
                (j.spec.clone(), std::sync::Arc::new(s))
            });
            j.spec = copy.clone();
        }
    }
    true
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

/// [`simulate_with`] keeping no records, with the replay's controller: each record is handed to
/// `sink` as it is built, in submission order ([`Replay::finish_streaming`]); the result's `jobs` is
/// empty and its summary is the one [`simulate`] gives.
pub fn simulate_streaming(
    workload: &Workload,
    inventory: &Inventory,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
    sink: &mut dyn FnMut(&JobRecord),
) -> Result<(SimResult, Controller), SimError> {
    let mut replay = Replay::new(workload, inventory, cfg, |ctl, _| ctl)?;
    while replay.step(progress)? {}
    replay.finish_streaming(sink)
}
