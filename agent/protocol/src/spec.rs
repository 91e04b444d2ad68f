//! What an allocation asks of its node's agent beyond the entrypoint: data mounts and a liveness probe.

use serde::{Deserialize, Serialize};

/// One mount an allocation declares (`data.mounts[i]` with a `target`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataMount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

/// The seed's `LivenessProbeSpec`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct ProbeSpec {
    /// `tcp` or `http`.
    pub probe_type: String,
    pub port: u16,
    /// HTTP only (default `/`).
    #[serde(default)]
    pub path: Option<String>,
    pub period_secs: u32,
    pub initial_delay_secs: u32,
    pub failure_threshold: u32,
    pub timeout_secs: u32,
}
