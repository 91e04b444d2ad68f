//! `lattice-agent-protocol` — the wire between a node agent (`lattice-agent`) and the control plane
//! (`lattice-runtime`): REST/JSON, each type declared once and read and written by both sides, and
//! the rules both sides apply to names a request carries (uenv names, OCI references, mount targets).
//! The agent's poll answer ([`Work`]: launches, kills, hints, preemptions, wipes, task launches,
//! cache orders), what the agent reports with a poll ([`Output`], [`Outcome`], [`Metric`],
//! [`TaskEnd`], [`CacheOutcome`], [`CachedImage`], [`Startup`]), how a process ended
//! ([`ExitKind`]) and heartbeats it could not deliver ([`Buffered`]); the bodies an agent sends
//! ([`RegisterBody`], [`HeartbeatBody`], [`WorkPoll`], [`ExitReport`]).
//!
//! Pure data and rules: no I/O, no clock. The state machine that drives the protocol (when to
//! register, heartbeat, poll, fence) is `lattice_agent::protocol`; the HTTP is each side's own.

mod names;
mod node;
mod poll;
mod spec;
mod work;

pub use names::{BadImageRef, BadUenvName, parse_image_ref, uenv_layout, valid_target};
pub use node::{Buffered, ExitKind, ExitReport, HeartbeatBody, RegisterBody};
pub use poll::{
    CacheOutcome, CachedImage, DataAccess, ImageUse, Metric, Outcome, Output, RankEnd, Startup, Stream, TaskEnd,
    WorkPoll,
};
pub use spec::{DataMount, ProbeSpec};
pub use work::{CacheOrder, Launch, PreemptWork, TaskGroup, TaskLaunch, TaskPeer, Work};
