//! Equal requests share one [`AllocSpec`]: a site's history repeats the same request (owner,
//! vCluster, size, walltime, class, constraints) many times, and a replay's engine keeps the trace's
//! own copy, so a year of jobs holds each distinct request once.

use lattice_engine::AllocSpec;
use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;

/// The distinct requests seen so far, by a hash of their serialized form (only looked up, never
/// iterated: the order of what is stored never shows).
#[derive(Default)]
pub(crate) struct SharedSpecs {
    by_hash: HashMap<u64, Vec<Arc<AllocSpec>>>,
}

/// Feeds what serde writes into a hasher.
struct HashWriter(std::hash::DefaultHasher);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedSpecs {
    /// `spec`, or an equal request seen before (then `spec` is dropped).
    pub fn share(&mut self, spec: Arc<AllocSpec>) -> Arc<AllocSpec> {
        let mut h = HashWriter(std::hash::DefaultHasher::new());
        if serde_json::to_writer(&mut h, &*spec).is_err() {
            return spec;
        }
        let bucket = self.by_hash.entry(h.0.finish()).or_default();
        if let Some(same) = bucket.iter().find(|s| ***s == *spec) {
            return same.clone();
        }
        bucket.push(spec.clone());
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_engine::{Duration, TenantId, VClusterId};

    #[test]
    fn equal_requests_share_one_and_different_ones_do_not() {
        let mut s = SharedSpecs::default();
        let spec = |nodes| {
            Arc::new(AllocSpec::simple(
                TenantId(0),
                VClusterId(0),
                nodes,
                Duration::from_hours(1),
            ))
        };
        let a = s.share(spec(2));
        let b = s.share(spec(2));
        let c = s.share(spec(3));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!((a.nodes.min, c.nodes.min), (2, 3));
    }
}
