//! Helpers the runtime's integration tests share (each test file uses some of them): the workspace's
//! test kit, and a control plane without a server for tests that drive it on a virtual clock.

#[allow(unused_imports)]
pub use lattice_testkit::*;

/// A control plane (no server) on `nodes` plain nodes with `profiles/balanced.yaml`'s vClusters, for
/// tests that drive it directly on a virtual clock.
#[allow(dead_code)]
pub fn balanced_control(nodes: u32) -> lattice_control::Control {
    let inv = lattice_traces::homogeneous(nodes);
    let prof = lattice_traces::read_profile(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiles/balanced.yaml"
    )))
    .unwrap();
    let vcs = prof
        .vclusters
        .iter()
        .map(|(n, p)| (n.clone(), p.config(None)))
        .collect();
    lattice_control::Control::new(&inv, vcs, &Default::default(), None).unwrap()
}
