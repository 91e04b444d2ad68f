//! What the metrics read of a replayed allocation, and a compact form of it.
//!
//! A year's replay has some 100,000-200,000 allocations. Its `jobs.csv` rows (`JobRecord`) are
//! written as they are built when nothing else needs them, and only [`JobFacts`] — the fields the
//! summary's metrics read, a third of a record's size, with no per-row string — are kept for the
//! summary. Every metric is computed through [`JobFields`], so both forms give the same summary.

use lattice_engine::AllocState;
use std::sync::Arc;

/// The fields of a replayed allocation that the metrics (DESIGN.md §3) read.
pub trait JobFields {
    fn submit_s(&self) -> f64;
    /// First start.
    fn start_s(&self) -> Option<f64>;
    fn end_s(&self) -> Option<f64>;
    fn wait_s(&self) -> Option<f64>;
    fn bsld(&self) -> Option<f64>;
    /// Time it held nodes, summed over its runs, when it ended.
    fn run_s(&self) -> Option<f64>;
    fn nodes(&self) -> u32;
    fn gpus(&self) -> u32;
    fn borrowed(&self) -> u32;
    fn groups(&self) -> Option<u32>;
    fn conformance(&self) -> Option<f64>;
    fn class(&self) -> u8;
    fn backfilled(&self) -> bool;
    fn tenant(&self) -> &str;
    fn vcluster(&self) -> &str;
    /// Its state's name (`completed`, `failed`, `cancelled`, `running`, ...).
    fn state(&self) -> &'static str;
}

/// The fields of a `JobRecord` the metrics read, compactly: absent times are NaN (no replayed
/// time is NaN), an absent group count is `u32::MAX`, and names are shared.
#[derive(Clone, Debug)]
pub struct JobFacts {
    pub(crate) submit_s: f64,
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    pub(crate) wait_s: f64,
    pub(crate) bsld: f64,
    pub(crate) run_s: f64,
    pub(crate) conformance: f64,
    pub(crate) tenant: Arc<str>,
    pub(crate) vcluster: Arc<str>,
    pub(crate) nodes: u32,
    pub(crate) gpus: u32,
    pub(crate) borrowed: u32,
    pub(crate) groups: u32,
    pub(crate) class: u8,
    pub(crate) backfilled: bool,
    pub(crate) state: AllocState,
}

pub(crate) fn pack(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::NAN)
}

fn unpack(x: f64) -> Option<f64> {
    (!x.is_nan()).then_some(x)
}

impl JobFields for JobFacts {
    fn submit_s(&self) -> f64 {
        self.submit_s
    }
    fn start_s(&self) -> Option<f64> {
        unpack(self.start_s)
    }
    fn end_s(&self) -> Option<f64> {
        unpack(self.end_s)
    }
    fn wait_s(&self) -> Option<f64> {
        unpack(self.wait_s)
    }
    fn bsld(&self) -> Option<f64> {
        unpack(self.bsld)
    }
    fn run_s(&self) -> Option<f64> {
        unpack(self.run_s)
    }
    fn nodes(&self) -> u32 {
        self.nodes
    }
    fn gpus(&self) -> u32 {
        self.gpus
    }
    fn borrowed(&self) -> u32 {
        self.borrowed
    }
    fn groups(&self) -> Option<u32> {
        (self.groups != u32::MAX).then_some(self.groups)
    }
    fn conformance(&self) -> Option<f64> {
        unpack(self.conformance)
    }
    fn class(&self) -> u8 {
        self.class
    }
    fn backfilled(&self) -> bool {
        self.backfilled
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn vcluster(&self) -> &str {
        &self.vcluster
    }
    fn state(&self) -> &'static str {
        self.state.as_str()
    }
}
