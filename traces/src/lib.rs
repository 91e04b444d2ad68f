//! `lattice-traces` — the trace formats Lattice reads and writes.
//!
//! - [`swf`]: Standard Workload Format import (Parallel Workloads Archive), gzip-transparent, every skipped
//!   line counted by reason with file:line:field.
//! - [`jsonl`]: the JSONL event log of the book ("Using RM-Replay"): `submit`, `complete`, … — its
//!   events and the rules that turn a submission into a spec; [`jsonl_parse`] reads a log, one function
//!   per event type.
//! - [`request`]: the one request model — a submission from a trace or the API, checked into a spec.
//! - [`inventory`]: node inventory YAML; [`profile`]: weight profiles and vCluster config YAML.
//! - [`synth`]: seeded synthetic generators; the bundled demo trace lives in `traces/library/`.
//! - [`import`]: Slurm `sacct` dumps and the Alibaba GPU pod list → JSONL, any workload → JSONL, and
//!   anonymisation (stable keyed pseudonyms).
//! - [`library`]: the regression library's six seeded traces (`traces/library/*.jsonl`) with their
//!   inventory, tenants and profiles.
//! - [`scale`]: a seeded large site (10,000 nodes, five vClusters, a year of jobs) for `rm-replay bench scale`.
//!
//! Everything produces a [`Workload`]: jobs in submission order, the names they use, and what was skipped.
//! Importers never panic on bad input and never drop a line silently.

pub mod duration;
pub mod error;
pub mod export;
pub mod fuzz;
pub mod import;
pub mod inventory;
pub mod jsonl;
pub mod jsonl_parse;
pub mod library;
pub mod profile;
pub mod request;
pub mod scale;
mod shared_specs;
pub mod swf;
pub mod synth;
pub mod tenants;
pub mod vcluster_config;
pub mod workload;

pub use duration::{
    MAX_DURATION, MAX_TIMESTAMP_S, MAX_WALLTIME, check_walltime, parse_duration, parse_walltime, secs_to_duration,
};
pub use error::{Problem, TraceError};
pub use export::{SpecNames, alloc_json};
pub use inventory::{
    Inventory, JoiningNode, homogeneous, parse_inventory, parse_node_entry, read_inventory, site_engine,
};
pub use jsonl::MAX_DAG_SIZE;
pub use jsonl_parse::{parse_jsonl, read_jsonl};
pub use profile::{VClusterProfile, WeightProfile, parse_policy, parse_profile, profile_with_weights, read_profile};
pub use request::{checkpoint_spec, parse_tier};
pub use swf::{SwfOptions, TenantField, parse_swf, read_swf};
pub use tenants::{Contracts, parse_tenants, read_tenants};
pub use vcluster_config::{ConfigKeyError, apply_config, config_json};
pub use workload::{JobNames, TraceEvent, TraceEventKind, TraceJob, Workload};

use std::path::Path;

/// [`read_trace`], keeping every problem (for `rm-replay validate`).
pub fn read_trace_all_problems(path: &Path, swf: &SwfOptions) -> Result<Workload, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    let text = swf::decode(bytes).map_err(|e| TraceError::io(path, e))?;
    let name = path.display().to_string();
    let n = path.to_string_lossy();
    Ok(if n.ends_with(".jsonl") || n.ends_with(".jsonl.gz") {
        jsonl_parse::parse_jsonl_with(&name, &text, true)
    } else {
        swf::parse_swf_with(&name, &text, swf, true)
    })
}

/// Reads a trace by its extension: `.jsonl`/`.jsonl.gz` as the event log, anything else as SWF.
pub fn read_trace(path: &Path, swf: &SwfOptions) -> Result<Workload, TraceError> {
    let name = path.to_string_lossy();
    if name.ends_with(".jsonl") || name.ends_with(".jsonl.gz") {
        read_jsonl(path)
    } else {
        read_swf(path, swf)
    }
}
