//! `lattice-adapters` — will own the real implementations of the engine's ports: the openraft quorum, NVML GPU
//! discovery, eBPF telemetry (aya), the Slingshot fabric manager, VAST REST and the TSDB client, each behind a
//! cargo feature where it pulls heavy or platform dependencies.
//!
//! Status: not built yet (its issue has not come). Nothing here is implemented.
