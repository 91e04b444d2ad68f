//! `lattice-testkit` — what the end-to-end tests of the runtime, the agent and the clients share, so
//! each starts a member, an agent or a runtime process the same way and leaves nothing behind:
//!
//! - [`member`]: members started in-process (one leader, a quorum, a control plane for real agents);
//! - [`process`]: `lattice-runtime` and `lattice-agent` processes SIGKILLed when dropped — an agent
//!   together with what it ran, since an allocation's processes outlive their agent by design;
//! - [`http`]: REST calls (blocking, or off an async runtime), stand-in services, free ports, and
//!   waiting on a condition instead of sleeping.
//!
//! A test crate only (a dev-dependency); nothing here is linked into a product binary.

pub mod http;
pub mod member;
pub mod process;

pub use http::{call, free_port, http, serve_on_thread, serve_stand_in, wait_until};
pub use member::{control_plane, start_leader, start_quorum};
pub use process::{
    Agents, Proc, agent_binary, agent_command, agent_process, bin, runtime_process, runtime_process_env,
    runtime_process_with,
};
