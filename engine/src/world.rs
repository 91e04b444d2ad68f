//! The abstract cluster: the ports through which the [`Controller`](crate::controller::Controller)
//! carries out the engine's decisions, and the decisions themselves.
//!
//! Two worlds implement the ports: `lattice-sim`'s fake world (an event queue for a clock, a fake
//! quorum with latency, fake nodes that run, checkpoint, suspend and wipe) and `lattice-runtime`'s real
//! one (openraft, node agents, VAST, the fabric manager). Every port method is required — there are no
//! default bodies — and [`Decision::dispatch`] is the one exhaustive `match` from a decision to its
//! port: a new kind of decision does not compile until it has a port method, and a new port method does
//! not compile until both worlds implement it.
//!
//! Ports see the engine read-only (`view`): a world may look up what it needs (an allocation's spec,
//! its nodes) but changes nothing; what happens in the world comes back to the controller as an
//! [`Input`](crate::controller::Input).

use crate::engine::{Engine, Proposal};
use crate::ids::{AllocId, NodeId};
use crate::network::DomainName;
pub use crate::preempt::PreemptHow;
use crate::preempt::PreemptReason;
use crate::time::{Duration, Time};

/// An entry of the quorum's hash-chained audit log for a sensitive claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AuditEvent {
    /// The claim's nodes were committed to it.
    Claim,
    /// The claim ended; its nodes go to the secure wipe.
    Release,
    /// The wipe succeeded: the nodes are back in the pool.
    Wipe,
    /// The wipe failed: the nodes are quarantined (Down).
    Quarantine,
    /// The claim's nodes booted the hardened image; it launches.
    Boot,
    /// An operator retries a quarantined node's wipe.
    WipeRetry,
    /// The claim was refused: its nodes were held (by whom, in the entry's nodes) or out.
    ClaimRefused,
    /// It starts on its nodes (what runs there: the world's note names its software and data).
    Start,
    /// Its prologue failed on the node (an image that could not be pulled, or is not signed as
    /// `sign_required` asks): the world's note says why.
    PrologueFailure,
    /// The checkpoint broker asked it to write a checkpoint.
    Checkpoint,
    /// Its checkpoint was written (the next run resumes there), or failed.
    CheckpointDone,
    CheckpointFailed,
}

impl AuditEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditEvent::Claim => "claim",
            AuditEvent::Release => "release",
            AuditEvent::Wipe => "wipe",
            AuditEvent::Quarantine => "quarantine",
            AuditEvent::Boot => "boot",
            AuditEvent::WipeRetry => "wipe_retry",
            AuditEvent::ClaimRefused => "claim_refused",
            AuditEvent::PrologueFailure => "prologue_failure",
            AuditEvent::Start => "start",
            AuditEvent::Checkpoint => "checkpoint",
            AuditEvent::CheckpointDone => "checkpoint_done",
            AuditEvent::CheckpointFailed => "checkpoint_failed",
        }
    }
}

/// One victim of a preemption decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreemptOrder {
    pub alloc: AllocId,
    /// The allocation its nodes go to.
    pub for_alloc: AllocId,
    pub reason: PreemptReason,
    /// When the sequence starts: now, or after the borrower's return grace period for a reclaim.
    pub at: Time,
    pub how: PreemptHow,
}

/// Why a run stops without having ended by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// One of its nodes was lost (hardware failure, heartbeat grace expired, disabled).
    NodeLost(NodeId),
    /// It was cancelled.
    Cancelled,
    /// It was being preempted and its stop was not reported in time: taken as stopped (whatever
    /// still runs of it is not this run any more).
    Unreported,
}

/// A record the quorum's members keep beside the Raft log, which a start may wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durable {
    /// The allocation's submission (acknowledged to its owner once a majority holds it).
    Submission(AllocId),
    /// How the allocation ended.
    End(AllocId),
    /// How an allocation the controller does not hold ended (it ended before this control plane
    /// took over), by the number the world names it with.
    PriorEnd(u64),
}

impl std::fmt::Display for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durable::Submission(a) => write!(f, "submission {a}"),
            Durable::End(a) => write!(f, "end {a}"),
            Durable::PriorEnd(n) => write!(f, "prior end {n}"),
        }
    }
}

/// Why the controller refused a proposal before it reached the quorum.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// Its network domain does not exist and the VNI pool has none left for it.
    VniPoolExhausted {
        domain: DomainName,
        used: usize,
        total: usize,
    },
    /// Records it waits for are not yet on a majority of the quorum members' disks (its
    /// submission; a dependency's end): proposed again at the next pass.
    NotDurable { awaiting: Vec<Durable> },
    /// A sensitive claim its pool could not give the nodes at once: unlike the others, it does not
    /// stay Pending — it ended, refused (claims are immediate or refused).
    Claim(crate::refusal::ClaimRefusal),
}

/// One decision the controller carries out through a port.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Quorum: give `nodes` to the allocation.
    Propose(Proposal),
    /// The controller refused a proposal before it reached the quorum (its network domain would
    /// need a VNI the pool has not; a record it waits for is not durable yet): the allocation
    /// stays Pending and the world tells its owner why. A refused sensitive claim
    /// ([`Refusal::Claim`]) has ended instead.
    Refuse { alloc: AllocId, why: Refusal },
    /// Quorum: put the record on a majority of the members' disks (a start waits for it); the
    /// world reports [`Input::Durable`](crate::controller::Input) when it is.
    Persist(Durable),
    /// Quorum: the allocation no longer holds its nodes.
    Release { alloc: AllocId, nodes: Vec<NodeId> },
    /// Quorum: a reactive allocation grew (`added`) or shrank by one node.
    Scale { alloc: AllocId, node: NodeId, added: bool },
    /// Quorum: append to the sensitive audit log.
    Audit {
        alloc: AllocId,
        event: AuditEvent,
        nodes: Vec<NodeId>,
    },
    /// Fleet: start the committed allocation on its nodes, resuming from `resume_from` of work a
    /// checkpoint kept (zero: from the start). `staging_remaining_s`: seconds of data staging still
    /// outstanding (it started before its data was fully staged: an I/O stall).
    ///
    /// `vni`: its network domain's VNI (when domains are modelled and it belongs to one).
    Launch {
        alloc: AllocId,
        nodes: Vec<NodeId>,
        resume_from: Duration,
        staging_remaining_s: f64,
        vni: Option<u32>,
    },
    /// Fleet: stop the allocation's processes (its run is over; later reports of it are stale).
    Stop { alloc: AllocId, why: StopReason },
    /// Fleet: preempt a victim.
    Preempt(PreemptOrder),
    /// Fleet: the checkpoint broker's hint (the allocation keeps running).
    Checkpoint { alloc: AllocId },
    /// Fleet: securely wipe the nodes a sensitive claim released.
    Wipe { alloc: AllocId, nodes: Vec<NodeId> },
    /// Fleet: boot a committed sensitive claim's nodes into the hardened image (OpenCHAMI BSS)
    /// before it launches; the world reports each node with `Input::Booted`.
    Boot { alloc: AllocId, nodes: Vec<NodeId> },
    /// Fleet: the node's conformance fingerprint drifted from its baseline (`drifted`), or conforms
    /// again. The world signals the infrastructure (OpenCHAMI flags the node for remediation); for a
    /// `sensitive` node it also appends a `drift` / `conformant` entry to the audit log.
    Drift {
        node: NodeId,
        drifted: bool,
        sensitive: bool,
    },
    /// Fleet: the node missed a heartbeat; report [`Input::GraceExpired`](crate::controller::Input)
    /// if it is still silent after `grace`.
    Watch { node: NodeId, grace: Duration },
    /// Clock: run a pass at `at` (a cycle tick, an energy window, a staging end).
    WakeAt(Time),
}

/// What the fleet port is told of a launch ([`Decision::Launch`]'s fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Launch<'a> {
    pub alloc: AllocId,
    pub nodes: &'a [NodeId],
    pub resume_from: Duration,
    pub staging_remaining_s: f64,
    pub vni: Option<u32>,
}

/// The quorum port: ownership changes and the audit log.
pub trait Quorum {
    /// Proposes a start. `Some(committed)` when the world decides at once (a zero-latency fake
    /// quorum, or a refusal before it reaches the quorum); `None` when the answer comes later as
    /// an input.
    fn propose(&mut self, view: &Engine, now: Time, p: &Proposal) -> Option<bool>;
    /// A start refused before it reached the quorum (it stays Pending).
    fn refuse(&mut self, view: &Engine, now: Time, alloc: AllocId, why: &Refusal);
    /// Puts the record on a majority of the members' disks; reported later as an input.
    fn persist(&mut self, view: &Engine, now: Time, record: Durable);
    fn release(&mut self, view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]);
    fn scale(&mut self, view: &Engine, now: Time, alloc: AllocId, node: NodeId, added: bool);
    fn audit(&mut self, view: &Engine, now: Time, alloc: AllocId, event: AuditEvent, nodes: &[NodeId]);
}

/// The fleet port: node agents and what runs on the nodes.
pub trait Fleet {
    fn launch(&mut self, view: &Engine, now: Time, launch: &Launch<'_>);
    fn stop(&mut self, view: &Engine, now: Time, alloc: AllocId, why: StopReason);
    fn preempt(&mut self, view: &Engine, now: Time, order: &PreemptOrder);
    /// A broker hint. `Some(false)` when it fails at once (nowhere to write it); `None` when the
    /// outcome comes later as an input.
    fn checkpoint(&mut self, view: &Engine, now: Time, alloc: AllocId) -> Option<bool>;
    fn wipe(&mut self, view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]);
    /// Boots the nodes into the hardened image; each node's outcome comes later as an input.
    fn boot(&mut self, view: &Engine, now: Time, alloc: AllocId, nodes: &[NodeId]);
    fn drift(&mut self, view: &Engine, now: Time, node: NodeId, drifted: bool, sensitive: bool);
    fn watch(&mut self, view: &Engine, now: Time, node: NodeId, grace: Duration);
}

/// The clock port.
pub trait Timer {
    fn wake_at(&mut self, at: Time);
}

/// A whole world: the ports the controller needs.
pub trait World: Quorum + Fleet + Timer {}
impl<T: Quorum + Fleet + Timer> World for T {}

impl Decision {
    /// Carries the decision out through its port (the one exhaustive match); what the port decided
    /// at once, if anything.
    pub fn dispatch(&self, world: &mut dyn World, view: &Engine, now: Time) -> Option<bool> {
        match self {
            Decision::Propose(p) => world.propose(view, now, p),
            Decision::Refuse { alloc, why } => {
                world.refuse(view, now, *alloc, why);
                None
            }
            Decision::Persist(record) => {
                world.persist(view, now, *record);
                None
            }
            Decision::Release { alloc, nodes } => {
                world.release(view, now, *alloc, nodes);
                None
            }
            Decision::Scale { alloc, node, added } => {
                world.scale(view, now, *alloc, *node, *added);
                None
            }
            Decision::Audit { alloc, event, nodes } => {
                world.audit(view, now, *alloc, *event, nodes);
                None
            }
            Decision::Launch {
                alloc,
                nodes,
                resume_from,
                staging_remaining_s,
                vni,
            } => {
                let launch = Launch {
                    alloc: *alloc,
                    nodes,
                    resume_from: *resume_from,
                    staging_remaining_s: *staging_remaining_s,
                    vni: *vni,
                };
                world.launch(view, now, &launch);
                None
            }
            Decision::Stop { alloc, why } => {
                world.stop(view, now, *alloc, *why);
                None
            }
            Decision::Preempt(order) => {
                world.preempt(view, now, order);
                None
            }
            Decision::Checkpoint { alloc } => world.checkpoint(view, now, *alloc),
            Decision::Wipe { alloc, nodes } => {
                world.wipe(view, now, *alloc, nodes);
                None
            }
            Decision::Boot { alloc, nodes } => {
                world.boot(view, now, *alloc, nodes);
                None
            }
            Decision::Drift {
                node,
                drifted,
                sensitive,
            } => {
                world.drift(view, now, *node, *drifted, *sensitive);
                None
            }
            Decision::Watch { node, grace } => {
                world.watch(view, now, *node, *grace);
                None
            }
            Decision::WakeAt(at) => {
                world.wake_at(*at);
                None
            }
        }
    }
}

impl std::fmt::Display for Decision {
    /// One line of the decision log (allocation and node indices; the same in every world).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |n: &[NodeId]| n.iter().map(|x| x.0.to_string()).collect::<Vec<_>>().join(",");
        match self {
            Decision::Propose(p) => write!(
                f,
                "propose {} on [{}]{}",
                p.alloc,
                list(&p.nodes),
                if p.backfilled { " backfilled" } else { "" }
            ),
            Decision::Release { alloc, nodes } => write!(f, "release {alloc} [{}]", list(nodes)),
            Decision::Scale { alloc, node, added } => {
                write!(f, "scale {alloc} {} {}", if *added { "+" } else { "-" }, node.0)
            }
            Decision::Audit { alloc, event, nodes } => {
                write!(f, "audit {} {alloc} [{}]", event.as_str(), list(nodes))
            }
            Decision::Launch {
                alloc,
                nodes,
                resume_from,
                vni,
                ..
            } => {
                write!(f, "launch {alloc} on [{}] from {}ms", list(nodes), resume_from.0)?;
                match vni {
                    Some(v) => write!(f, " vni {v}"),
                    None => Ok(()),
                }
            }
            Decision::Refuse { alloc, why } => match why {
                Refusal::VniPoolExhausted { domain, used, total } => {
                    write!(f, "refuse {alloc} vni_pool_exhausted {domain} ({used}/{total})")
                }
                Refusal::NotDurable { awaiting } => {
                    let list: Vec<String> = awaiting.iter().map(|r| r.to_string()).collect();
                    write!(f, "refuse {alloc} not_durable [{}]", list.join(", "))
                }
                Refusal::Claim(why) => write!(f, "refuse {alloc} {why}"),
            },
            Decision::Persist(record) => write!(f, "persist {record}"),
            Decision::Stop { alloc, why } => match why {
                StopReason::NodeLost(n) => write!(f, "stop {alloc} node {} lost", n.0),
                StopReason::Cancelled => write!(f, "stop {alloc} cancelled"),
                StopReason::Unreported => write!(f, "stop {alloc} unreported"),
            },
            Decision::Preempt(o) => {
                let how = match o.how {
                    PreemptHow::CheckpointThenStop { deadline } => format!("checkpoint-then-stop {}ms", deadline.0),
                    PreemptHow::Stop { grace } => format!("stop {}ms", grace.0),
                    PreemptHow::Kill { grace } => format!("kill {}ms", grace.0),
                };
                write!(
                    f,
                    "preempt {} for {} ({}) at {} {how}",
                    o.alloc,
                    o.for_alloc,
                    o.reason.as_str(),
                    o.at.0
                )
            }
            Decision::Checkpoint { alloc } => write!(f, "checkpoint {alloc}"),
            Decision::Wipe { alloc, nodes } => write!(f, "wipe {alloc} [{}]", list(nodes)),
            Decision::Boot { alloc, nodes } => write!(f, "boot {alloc} [{}]", list(nodes)),
            Decision::Drift {
                node,
                drifted,
                sensitive,
            } => write!(
                f,
                "{} node {}{}",
                if *drifted { "drift" } else { "conformant" },
                node.0,
                if *sensitive { " sensitive" } else { "" }
            ),
            Decision::Watch { node, grace } => write!(f, "watch node {} {}ms", node.0, grace.0),
            Decision::WakeAt(t) => write!(f, "wake at {}", t.0),
        }
    }
}
