//! `lattice-agent` — will own the node agent: registration and heartbeats, capability and GPU discovery,
//! conformance fingerprint, process launch with walltime enforcement, logs, telemetry, checkpoint signalling.
//!
//! Status: not built yet (its issue has not come). Nothing here is implemented.
