//! The agent's loop: register (again whenever the control plane no longer knows it), heartbeat every
//! `heartbeat` interval with a strictly increasing sequence, poll for work every `poll` interval,
//! start what it is given with the seed's environment, stop what it is told to, and report every exit
//! — retried until the control plane takes it, so a report is never lost to a transient failure,
//! and kept on disk until then (the exits file beside the state file), so not to an agent restart
//! either. What to send when, and what each answer means, is [`crate::protocol`]; this loop does the
//! I/O and runs the processes.
//! During a partition the agent runs its allocations autonomously and buffers the heartbeats it could
//! not deliver (at most [`MAX_BUFFERED`], oldest dropped and counted); when the control plane is back
//! they are replayed in order with the next heartbeat (book: "Network Partition: Node ↔ Quorum").
//! Output goes to the log store in zstd chunks every `log_flush` and when a process ends; while
//! someone follows an allocation (the control plane lists it in `tail`), its new output rides along
//! with each poll (at most [`TAIL_BYTES_PER_POLL`]; the first poll replays the newest [`TAIL_REPLAY`]).
//!
//! The loop is a state machine (`agent/tick.rs`): the agent's state between rounds, set up once
//! (taking over what a previous agent left, `agent/takeover.rs`), then one round after another, a
//! method per phase. Beside it: the configuration (`agent/config.rs`), the node as found at start
//! (`agent/node.rs`), what a launch needs before its process starts (`agent/launch.rs`), the control
//! plane's other orders (`agent/orders.rs`), output (`agent/output.rs`) and the state and exits files
//! (`agent/files.rs`).

mod config;
mod files;
mod launch;
mod node;
mod orders;
mod output;
mod takeover;
mod tick;

pub use config::AgentConfig;
pub use files::{read_exits, read_state, write_state};
pub use launch::{environment, scratch_of};
pub use node::discover;
pub use output::{TAIL_BYTES_PER_POLL, TAIL_REPLAY};

use crate::client::Client;
use crate::protocol;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tick::Agent;

/// Heartbeats kept during a partition (a day at the default 10 s interval).
pub const MAX_BUFFERED: usize = protocol::MAX_BUFFERED;

/// Runs until `stop` is set; then stops its processes (and reports them) before returning.
pub fn run(client: &Client, cfg: &AgentConfig, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    run_with(client, cfg, stop, crate::gpu::default_provider())
}

/// [`run`] with a given GPU provider (tests use a fake one): the agent set up, then one round of its
/// loop every `poll` until `stop` is set, then shut down.
pub fn run_with(
    client: &Client,
    cfg: &AgentConfig,
    stop: Arc<AtomicBool>,
    gpu: Box<dyn crate::gpu::GpuProvider>,
) -> anyhow::Result<()> {
    let mut agent = Agent::new(client, cfg, &stop, gpu)?;
    while !stop.load(Ordering::SeqCst) {
        agent.tick();
        std::thread::sleep(cfg.poll);
    }
    agent.shutdown();
    Ok(())
}
