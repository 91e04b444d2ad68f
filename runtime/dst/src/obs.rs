//! What the harness and the simulated hosts share: the site's constants, the observations (event
//! log, acknowledgements, violations, the agents' processes) and the lock around them. The bottom of
//! the crate: it imports none of its modules.

use lattice_runtime::server::Shared;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Simulated time per step.
pub const TICK: Duration = Duration::from_millis(10);
/// After the faults heal: within this, a leader serves and every acknowledged allocation has ended.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(90);
/// The simulated wall clock's start (2026-01-01).
pub const EPOCH_MS: u64 = 1_767_225_600_000;
pub const GRPC_PORT: u16 = 9000;
pub const REST_PORT: u16 = 8080;
/// Simulated nodes of the site.
pub const NODES: u32 = 12;
/// The tenant with a hard quota, and its limit (nodes).
pub const QUOTA_TENANT: &str = "capped";
pub const QUOTA_NODES: u32 = 3;

/// What the harness and the simulated hosts share: the event log, what clients were told, the
/// members' handles, and every violation seen.
#[derive(Default)]
pub struct Obs {
    pub log: Vec<String>,
    /// Acknowledged id → (idempotency key, when).
    pub acked: BTreeMap<String, (String, u64)>,
    /// Idempotency key → the id acknowledged for it.
    pub key_ids: BTreeMap<String, String>,
    pub violations: Vec<String>,
    /// The simulation's time (ms) as the harness last stepped it, for events it logs itself.
    pub now_ms: u64,
    /// Member index → its current incarnation's shared state.
    pub members: Vec<Option<Weak<Shared>>>,
    /// Clock offset of each member's wall clock (ms; jumps).
    pub clock_offsets: Vec<i64>,
    /// With agent hosts: each node's running processes by allocation (they outlive their agent).
    pub procs: Vec<BTreeMap<String, Proc>>,
    /// Each agent's lease (when its last accepted heartbeat was sent, ms; its length), kept with
    /// its processes as the real agent keeps its state file.
    pub leases: Vec<Option<(u64, u64)>>,
    /// Each agent's exits not yet taken by the control plane, kept as the real agent keeps its exits
    /// file: a restarted agent still reports them.
    pub exits: Vec<Vec<lattice_agent::protocol::Exit>>,
    /// The operator's drains: node → true once a drain was acknowledged (the serving leader must
    /// hold it), false while an order for it is in flight (either outcome is allowed).
    pub drained: BTreeMap<String, bool>,
    /// The operator's weights for vCluster `default` (their `priority`, in tenths): the last
    /// acknowledged, and those in flight or never answered (each may have been committed, even
    /// after a later one). The serving leader must schedule with one of them.
    pub weights: Option<(u32, Vec<u32>)>,
    /// The same for its configuration's `reference_wait` (in hours).
    pub reference_wait: Option<(u32, Vec<u32>)>,
    /// The same for tenant `physics`'s `fair_share_target` (in tenths): a tenant's contract.
    pub fair_share: Option<(u32, Vec<u32>)>,
    /// Acknowledged DAG members → the members they depend on (condition `success`).
    pub dag_deps: BTreeMap<String, Vec<String>>,
    /// The faults have healed (the operator lifts its drains).
    pub healed: bool,
}

impl Obs {
    /// Appends to the event log (simulated ms first).
    pub fn event(&mut self, what: String) {
        let t = turmoil::sim_elapsed().map_or(self.now_ms, |d| d.as_millis() as u64);
        self.log.push(format!("{t:>8} {what}"));
    }

    pub fn violation(&mut self, what: String) {
        self.event(format!("VIOLATION {what}"));
        self.violations.push(what);
    }
}

pub type SharedObs = Arc<Mutex<Obs>>;

pub fn lock(o: &SharedObs) -> std::sync::MutexGuard<'_, Obs> {
    o.lock().unwrap_or_else(|p| p.into_inner())
}

/// A quorum member's host name.
pub fn host_name(i: u64) -> String {
    format!("m{i}")
}

/// A simulated process of one allocation on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proc {
    /// The nodes of the launch that started it (one start of the allocation).
    pub nodes: Vec<String>,
    pub started_ms: u64,
    pub ends_ms: u64,
    /// Stopped by the fence (its agent collects it as fenced: exit code 143).
    pub fenced: bool,
}
