//! A node's own reports: how a process ended there, and heartbeats it could not deliver in time.

use serde::{Deserialize, Serialize};

/// A heartbeat the agent could not deliver when it was due (during a partition), kept and replayed
/// later: its sequence number and when it was due (the agent's clock, ms since the epoch).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Buffered {
    pub seq: u64,
    pub at_ms: u64,
}

/// How a process ended on one node. The agent also keeps it in its exits file: never rename a variant.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    /// Exited by itself with its exit code.
    Exited,
    /// The agent killed it at its walltime.
    Walltime,
    /// Preempted: the agent stopped it after its checkpoint was written.
    Checkpointed,
    /// Preempted: the agent stopped it without a (complete) checkpoint.
    Preempted,
    /// The agent stopped it itself: cut off from the control plane past its lease, when the
    /// allocation may be requeued elsewhere. A node-side failure: requeued per its policy if it
    /// still runs here.
    Fenced,
    /// The agent could not prepare the run on its node (its software environment could not be
    /// pulled or read): a prologue failure, retried on other nodes first up to the engine's limit.
    Prologue,
    /// Its agent stopped it after its liveness probe failed `failure_threshold` times in a row.
    Liveness,
    /// Killed at its walltime while a checkpoint it was asked for was still in progress (the book's
    /// walltime/checkpoint race: walltime wins; counted in `lattice_checkpoint_walltime_conflict_total`).
    WalltimeCheckpoint,
}

/// `POST /v1/nodes/{id}/register` (an empty body is the default: no fingerprint, no capabilities).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    pub fingerprint: Option<String>,
    /// What the agent discovered on its node, opaque to the control plane (shown in the node's view).
    pub capabilities: Option<serde_json::Value>,
    /// Where the agent's own service listens (`host:port`): task launches' fences go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

/// `POST /v1/nodes/{id}/heartbeat`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    pub seq: u64,
    /// Heartbeats buffered during a partition, replayed in order (book: "Network Partition").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffered: Vec<Buffered>,
    /// The round trip of the agent's previous heartbeat (ms): `lattice_agent_heartbeat_latency_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
}

/// `POST /v1/allocations/{id}/exit`: how the allocation's process ended on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitReport {
    pub node: String,
    pub kind: ExitKind,
    #[serde(default)]
    pub exit_code: i32,
    /// The newest stdout (at most 64 KiB are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
    /// The newest stderr (likewise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err_tail: Option<String>,
}
