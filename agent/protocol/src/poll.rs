//! What an agent reports with a poll (`POST /v1/nodes/{id}/work`) besides what it runs.

use serde::{Deserialize, Serialize};

/// `POST /v1/nodes/{id}/work`: an agent's poll — what it runs now, and what it has to report since
/// its last poll (each part omitted when empty).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkPoll {
    /// What it runs now (always sent).
    #[serde(default)]
    pub running: Vec<String>,
    /// New output of followed allocations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output: Vec<Output>,
    /// Outcomes of checkpoint hints on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpointed: Vec<Outcome>,
    /// Outcomes of wipes this node ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wiped: Vec<Outcome>,
    /// Scaling-metric samples of allocations on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metric>,
    /// Task launches that ended on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_ends: Vec<TaskEnd>,
    /// Task launches that run on this node now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
    /// Outcomes of image cache orders, and the cache's contents when they changed (`Some` of an
    /// empty list: it is empty now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_done: Vec<CacheOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Vec<CachedImage>>,
    /// Allocations started on this node since its last poll, and how long each took to start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startups: Vec<Startup>,
    /// The agent's last telemetry collection: CPU time over its period, percent of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection_overhead_pct: Option<f64>,
    /// Audit mode: files sensitive allocations' processes opened under their data mounts since the
    /// last poll, counted per path and access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_access: Vec<DataAccess>,
}

/// Opens of one path by one allocation's processes (audit mode), batched between polls.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DataAccess {
    pub id: String,
    /// Empty: `count` opens on the node that could not be recorded (its buffers were full) while
    /// this allocation was watched — some of them may have been this allocation's.
    pub path: String,
    /// Opened for writing (write or read-write access, or create/truncate); else for reading.
    pub write: bool,
    pub count: u32,
}

/// One of a process's two output streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    #[default]
    Stdout,
    Stderr,
}

impl Stream {
    pub const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    pub fn parse(s: &str) -> Option<Stream> {
        match s {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}

/// New output of a followed allocation: bytes `offset..next` of one of its output streams on one
/// node (as text, invalid UTF-8 replaced).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Output {
    pub id: String,
    /// Which stream (stdout when absent).
    #[serde(default)]
    pub stream: Stream,
    pub offset: u64,
    pub next: u64,
    pub data: String,
}

/// The outcome of a checkpoint hint or a wipe on a node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    pub id: String,
    pub ok: bool,
}

/// One scaling-metric sample of an allocation on a node (built-in or application-reported).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    pub id: String,
    pub name: String,
    pub value: f64,
}

/// How a task launch ended on one node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskEnd {
    pub launch_id: String,
    pub alloc: String,
    #[serde(default)]
    pub ranks: Vec<RankEnd>,
    /// Why the launch was aborted (a rank failed, "PMI fence timeout", the allocation ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// One rank's end: its exit code (128 + signal when a signal ended it) and the newest output. (A
// plain comment: a doc comment would become the schema's description in the API document.)
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "RankEndIn"))]
#[serde(deny_unknown_fields)]
pub struct RankEnd {
    pub rank: u32,
    pub code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

/// An image cache order's outcome on a node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CacheOutcome {
    pub op: String,
    pub image: String,
    pub ok: bool,
    #[serde(default)]
    pub detail: String,
}

/// One cached image on a node, reported when the cache changed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CachedImage {
    /// The cache's file name (`prgenv-gnu_24.11_v1.squashfs`).
    pub file: String,
    pub size: u64,
    pub last_used_ms: u64,
    #[serde(default)]
    pub sticky: bool,
}

/// How long one allocation took to start on a node: seconds from the work answer that assigned it
/// to its processes' start (uenv pull and mount included).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Startup {
    pub id: String,
    pub seconds: f64,
    /// The images its prologue mounted (uenv and tools uenv): for a sensitive allocation's audit
    /// trail (what ran, with its hash; whether it was pulled now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageUse>,
}

/// One image a prologue mounted: its name, the SHA-256 it was verified against, and whether it was
/// pulled from the registry for this start (or found in the node's cache).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageUse {
    pub image: String,
    pub sha256: String,
    pub pulled: bool,
}
