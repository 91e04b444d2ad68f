//! `lattice-runtime` — will own the production control plane: gRPC (tonic/prost) and REST API, the openraft
//! quorum, and the very same `lattice-engine` driven by the wall clock, plus trace capture in the format
//! `lattice-traces` reads and Prometheus `/metrics`.
//!
//! Status: not built yet (its issue has not come). Nothing here is implemented.
