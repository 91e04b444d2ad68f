//! The real world's side of the controller's ports. The controller runs under the control plane's
//! lock, so its ports here only record each decision ([`Outbox`]); [`crate::Control`] turns
//! them into [`Action`]s with names the quorum and the agents know, and the server carries each out
//! (openraft proposals, agent orders, VAST, the fabric manager) after the lock is released — one
//! exhaustive `match` on each side, so a new kind of decision does not compile until the runtime
//! handles it.

use lattice_engine::{
    AllocId, AuditEvent, Decision, Duration, Engine, Fleet, Launch, NodeId, PreemptOrder, Proposal, Quorum, Refusal,
    StopReason, Time, Timer,
};

/// An ownership change for the quorum.
#[derive(Clone, Debug)]
pub struct PendingProposal {
    /// The control plane that made it (`Control::incarnation`): an answer arriving after a
    /// leadership change belongs to a control plane that is gone.
    pub incarnation: u64,
    pub alloc: AllocId,
    pub name: String,
    pub tenant: String,
    /// The submitting user (the audit log's subject for sensitive claims).
    pub user: String,
    pub nodes: Vec<String>,
    pub sensitive: bool,
    /// Started ahead of an earlier-queued allocation that still waits.
    pub backfilled: bool,
    /// Its project within the tenant (as submitted; `None`: `default`).
    pub project: Option<String>,
    /// Its network domain (the API's name) and the VNI it will have, recorded with the start.
    pub network: Option<(String, u32)>,
}

/// The decisions of one or more controller calls, in order, with their times.
#[derive(Debug, Default)]
pub struct Outbox(pub Vec<(Time, Decision)>);

impl Quorum for Outbox {
    fn propose(&mut self, _view: &Engine, now: Time, p: &Proposal) -> Option<bool> {
        self.0.push((now, Decision::Propose(p.clone())));
        None
    }
    fn persist(&mut self, _view: &Engine, now: Time, record: lattice_engine::Durable) {
        self.0.push((now, Decision::Persist(record)));
    }
    fn refuse(&mut self, _view: &Engine, now: Time, alloc: AllocId, why: &Refusal) {
        self.0.push((
            now,
            Decision::Refuse {
                alloc,
                why: why.clone(),
            },
        ));
    }
    fn release(&mut self, _view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]) {
        self.0.push((
            now,
            Decision::Release {
                alloc,
                nodes: nodes.to_vec(),
            },
        ));
    }
    fn scale(&mut self, _view: &Engine, now: Time, alloc: AllocId, node: NodeId, added: bool) {
        self.0.push((now, Decision::Scale { alloc, node, added }));
    }
    fn audit(&mut self, _view: &Engine, now: Time, alloc: AllocId, event: AuditEvent, nodes: &[NodeId]) {
        self.0.push((
            now,
            Decision::Audit {
                alloc,
                event,
                nodes: nodes.to_vec(),
            },
        ));
    }
}

impl Fleet for Outbox {
    fn launch(&mut self, _view: &Engine, now: Time, l: &Launch<'_>) {
        self.0.push((
            now,
            Decision::Launch {
                alloc: l.alloc,
                nodes: l.nodes.to_vec(),
                resume_from: l.resume_from,
                staging_remaining_s: l.staging_remaining_s,
                vni: l.vni,
            },
        ));
    }
    fn stop(&mut self, _view: &Engine, now: Time, alloc: AllocId, why: StopReason) {
        self.0.push((now, Decision::Stop { alloc, why }));
    }
    fn preempt(&mut self, _view: &Engine, now: Time, order: &PreemptOrder) {
        self.0.push((now, Decision::Preempt(*order)));
    }
    fn checkpoint(&mut self, _view: &Engine, now: Time, alloc: AllocId) -> Option<bool> {
        self.0.push((now, Decision::Checkpoint { alloc }));
        None
    }
    fn wipe(&mut self, _view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]) {
        self.0.push((
            now,
            Decision::Wipe {
                alloc,
                nodes: nodes.to_vec(),
            },
        ));
    }
    fn boot(&mut self, _view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]) {
        self.0.push((
            now,
            Decision::Boot {
                alloc,
                nodes: nodes.to_vec(),
            },
        ));
    }
    fn watch(&mut self, _view: &Engine, now: Time, node: NodeId, grace: Duration) {
        self.0.push((now, Decision::Watch { node, grace }));
    }
    fn drift(&mut self, _view: &Engine, now: Time, node: NodeId, drifted: bool, sensitive: bool) {
        self.0.push((
            now,
            Decision::Drift {
                node,
                drifted,
                sensitive,
            },
        ));
    }
}

impl Timer for Outbox {
    fn wake_at(&mut self, at: Time) {
        self.0.push((at, Decision::WakeAt(at)));
    }
}

/// What the server carries out, in order, outside the control plane's lock.
#[derive(Clone, Debug)]
pub enum Action {
    /// Propose the start to the quorum; its answer goes back to the controller.
    Propose(PendingProposal),
    /// The controller refused the start before the quorum (it stays Pending, retried next cycle):
    /// `message` is what its owner reads as the allocation's `last_rejection`.
    Refuse {
        alloc: AllocId,
        name: String,
        why: Refusal,
        message: String,
    },
    /// Put the record on a majority of the members' disks (a start waits for it): the scheduling
    /// loop's `settle_ends` records it and tells the controller.
    Persist {
        record: lattice_engine::Durable,
        name: String,
    },
    /// Free the allocation's nodes at the quorum (its end is recorded first; it leaves its network
    /// domain).
    Release {
        alloc: AllocId,
        name: String,
        nodes: Vec<String>,
    },
    /// A reactive allocation grows or shrinks by a node at the quorum.
    Scale {
        alloc: AllocId,
        name: String,
        node: String,
        added: bool,
    },
    /// Append to the quorum's audit log.
    Audit {
        alloc: AllocId,
        user: String,
        name: String,
        event: AuditEvent,
        nodes: Vec<String>,
        /// For a wipe or quarantine: each node's wipe start and failure reason.
        note: String,
    },
    /// The allocation runs on its nodes from `resume_from` (simulated agents run the rest of its
    /// duration; real agents get it at their next poll, with `LATTICE_RESTART_FROM`).
    Launch {
        alloc: AllocId,
        name: String,
        nodes: Vec<String>,
        vni: Option<u32>,
        resume_from: Duration,
        /// Seconds of its input still being staged when it started (an I/O stall at start).
        staging_remaining_s: f64,
    },
    /// Its run is over (cancelled, or lost with a node): real agents learn it at their next poll
    /// (and kill what still runs); a simulated run sees it is over.
    Stop {
        alloc: AllocId,
        name: String,
        why: StopReason,
    },
    /// Preempt a victim: checkpoint-then-stop, stop, or kill, starting at `order.at`.
    Preempt { name: String, order: PreemptOrder },
    /// The broker's checkpoint hint.
    Checkpoint { alloc: AllocId, name: String },
    /// Securely wipe the nodes a sensitive claim released.
    Wipe {
        alloc: AllocId,
        name: String,
        nodes: Vec<String>,
    },
    /// Boot a committed sensitive claim's nodes into the hardened image through OpenCHAMI (BSS, a
    /// PCS reboot); each node's outcome goes back to the control plane.
    Boot {
        alloc: AllocId,
        name: String,
        nodes: Vec<String>,
    },
    /// A node's heartbeats stopped: it goes Down if none arrives within `grace` (the control plane
    /// keeps the deadline; its agent watch applies it).
    Watch { node: NodeId, grace: Duration },
    /// A node drifted from its conformance baseline (or conforms again): OpenCHAMI flags it for
    /// remediation (`Warning` with the fingerprints) or clears the flag; a sensitive node's change
    /// is audited (`claim`: the sensitive claim holding it, if any).
    Drift {
        node: NodeId,
        name: String,
        drifted: bool,
        sensitive: bool,
        /// `expected=…, actual=…` as the agent's report showed it.
        message: String,
        claim: Option<String>,
    },
}
