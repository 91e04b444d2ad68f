//! What a node's agent discovers is compared with the inventory: a disagreement shows on the node
//! (and counts for `lattice_node_capability_mismatch`), and the node is scheduled as the inventory
//! says.

use lattice_control::Control;
use serde_json::json;

fn control() -> Control {
    let mut gpu = lattice_engine::NodeSpec::plain("gpu-1");
    gpu.capabilities.gpu_count = 4;
    gpu.capabilities.gpu_type = Some("H200".into());
    gpu.capabilities.cpu_cores = 64;
    gpu.capabilities.memory_gb = 512;
    let inv = lattice_traces::Inventory {
        nodes: vec![gpu, lattice_engine::NodeSpec::plain("cpu-1")],
        ..Default::default()
    };
    Control::new(&inv, Default::default(), &Default::default(), None).unwrap()
}

#[test]
fn discovered_capabilities_that_disagree_with_the_inventory_show_on_the_node() {
    let mut c = control();
    let agrees =
        json!({"cpu_cores": 64, "memory_gib": 503.2, "gpu_count": 4, "gpu_model": "NVIDIA H200", "features": []});
    c.register_agent_with("gpu-1", None, Some(agrees)).unwrap();
    assert_eq!(
        c.capability_mismatches(),
        0,
        "usable memory a little under installed is not a mismatch"
    );
    let fewer =
        json!({"cpu_cores": 64, "memory_gib": 250.0, "gpu_count": 3, "gpu_model": "NVIDIA H100", "features": []});
    c.register_agent_with("gpu-1", None, Some(fewer)).unwrap();
    // The node the issue found: the inventory says no GPUs, its agent finds one.
    let one = json!({"cpu_cores": 16, "memory_gib": 125.9, "gpu_count": 1, "gpu_model": "NVIDIA H200", "features": []});
    c.register_agent_with("cpu-1", None, Some(one)).unwrap();
    let views = c.nodes();
    let gpu = views.iter().find(|n| n.name == "gpu-1").unwrap();
    assert_eq!(
        gpu.capability_mismatch,
        [
            "gpu_count: inventory 4, agent 3",
            "gpu_type: inventory H200, agent NVIDIA H100",
            "memory_gb: inventory 512, agent 268.4"
        ]
    );
    let cpu = views.iter().find(|n| n.name == "cpu-1").unwrap();
    assert_eq!(
        cpu.capability_mismatch,
        [
            "gpu_count: inventory 0, agent 1",
            "gpu_type: inventory none, agent NVIDIA H200"
        ]
    );
    assert_eq!(
        (cpu.gpu_count, cpu.gpu_type.as_deref()),
        (0, None),
        "scheduled as the inventory says"
    );
    assert_eq!(c.capability_mismatches(), 2);
}

/// A node whose agent never comes up fails after its kind's boot timeout (book: "Booting → Failed");
/// one whose agent registers in time is Ready.
#[test]
fn a_node_that_never_finishes_booting_fails_after_its_kinds_boot_timeout() {
    let mut c = control();
    c.real_agents = true;
    c.ctl.node_boot = lattice_engine::BootTimeouts {
        default: Some(lattice_engine::Duration::from_mins(5)),
        by_kind: [("H200".to_string(), lattice_engine::Duration::from_mins(20))].into(),
    };
    let t0 = c.now();
    c.await_agents();
    assert_eq!(c.node_state_of("cpu-1").as_deref(), Some("booting"));
    c.set_clock(t0 + lattice_engine::Duration::from_mins(5) - lattice_engine::Duration(1));
    c.schedule();
    assert_eq!(c.node_state_of("cpu-1").as_deref(), Some("booting"), "not yet");
    c.set_clock(t0 + lattice_engine::Duration::from_mins(5));
    c.schedule();
    assert_eq!(c.node_state_of("cpu-1").as_deref(), Some("failed"));
    assert_eq!(
        c.node_state_of("gpu-1").as_deref(),
        Some("booting"),
        "an H200 node boots for 20 min"
    );
    c.register_agent_with("gpu-1", None, None).unwrap();
    c.set_clock(t0 + lattice_engine::Duration::from_mins(30));
    c.schedule();
    assert_eq!(c.node_state_of("gpu-1").as_deref(), Some("ready"));
    assert_eq!(c.ctl.stats.boot_timeouts, 1);
}
