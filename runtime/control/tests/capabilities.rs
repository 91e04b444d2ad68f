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

/// The H200 node, with an inventory that leaves its GPUs, cores and memory unset: what its
/// agent discovers fills them once recorded, so a job asking for an H200 runs there; a node that
/// is held takes them once it is free; capabilities the inventory sets are never overridden.
#[test]
fn discovery_fills_what_the_inventory_leaves_unset() {
    use lattice_control::SubmitRequest;
    use lattice_control::world::Action;
    let inv = lattice_traces::parse_inventory(
        "inventory.yaml",
        "nodes:\n  - name: open-1\n  - name: open-2\n  - name: set-1\n    gpu_count: 0\n    cpu_cores: 8\n    memory_gb: 64\n",
    )
    .unwrap();
    let mut c = Control::new(&inv, Default::default(), &Default::default(), None).unwrap();
    let mut t = 1_000_000u64;
    c.set_clock(lattice_engine::Time(t));
    let h200 =
        json!({"cpu_cores": 16, "memory_gib": 125.9, "gpu_count": 1, "gpu_model": "NVIDIA H200", "features": []});
    for n in ["open-1", "open-2", "set-1"] {
        c.register_agent_with(n, None, Some(h200.clone())).unwrap();
    }
    assert_eq!(c.discovery_fill("set-1"), None, "the inventory set everything");
    let fill = c.discovery_fill("open-1").expect("something to fill");
    assert_eq!(
        (fill.gpu_count, fill.gpu_type.as_deref(), fill.cpu_cores, fill.memory_gb),
        (Some(1), Some("H200"), Some(16), Some(128))
    );
    // Nothing changes before the quorum records it.
    let gpus = |c: &Control, n: &str| c.nodes().into_iter().find(|v| v.name == n).unwrap().gpu_count;
    assert_eq!(gpus(&c, "open-1"), 0);
    // open-2 is held by a one-node job when its record arrives.
    let job = |gpu: bool| -> SubmitRequest {
        let mut r = json!({"tenant": "t", "entrypoint": "true", "resources": {"nodes": 1},
                           "lifecycle": {"walltime": "1h"}});
        if gpu {
            r["resources"]["constraints"] = json!({"gpu_type": "H200"});
        }
        serde_json::from_value(r).unwrap()
    };
    let run = |c: &mut Control, t: &mut u64| -> Vec<(lattice_engine::AllocId, Vec<String>)> {
        *t += 1_000;
        c.set_clock(lattice_engine::Time(*t));
        c.schedule();
        let mut started = Vec::new();
        for a in c.take_actions() {
            if let Action::Propose(p) = a {
                c.committed(p.alloc);
                started.push((p.alloc, p.nodes.clone()));
            }
        }
        started
    };
    let cpu_job = c.submit(job(false)).unwrap();
    let started = run(&mut c, &mut t);
    assert_eq!(started.len(), 1);
    let held = started[0].1[0].clone();
    let free = if held == "open-1" { "open-2" } else { "open-1" };
    let held_fill = c.discovery_fill(&held).unwrap();
    assert!(!c.apply_discovered(&held, held_fill).unwrap(), "held: not yet");
    assert_eq!(gpus(&c, &held), 0);
    assert!(c.apply_discovered(free, c.discovery_fill(free).unwrap()).unwrap());
    assert_eq!(c.discovery_fill(free), None, "recorded");
    let v = c.nodes().into_iter().find(|v| v.name == free).unwrap();
    assert_eq!((v.gpu_count, v.gpu_type.as_deref()), (1, Some("H200")));
    assert!(v.capability_mismatch.is_empty(), "{:?}", v.capability_mismatch);
    // An H200 job runs on the filled node.
    let gpu_job = c.submit(job(true)).unwrap();
    let started = run(&mut c, &mut t);
    assert_eq!(
        started.iter().map(|s| s.1.clone()).collect::<Vec<_>>(),
        [vec![free.to_string()]]
    );
    assert_eq!(c.view_named(&gpu_job).unwrap().state, "running");
    // The held node takes its record once its job is over.
    c.cancel(&cpu_job);
    run(&mut c, &mut t);
    assert_eq!(gpus(&c, &held), 1);
    // The inventory's own values stay: set-1 reports GPUs, is still scheduled without them, and
    // shows the mismatch.
    let v = c.nodes().into_iter().find(|v| v.name == "set-1").unwrap();
    assert_eq!(v.gpu_count, 0);
    assert!(!v.capability_mismatch.is_empty());
}

/// The broker's measured inputs: each GPU's memory as the agent reports it at registration, and
/// the store's probed bandwidth (changed only when it moves by more than a tenth); the trace
/// capture writes both, so a replay's broker decides alike.
#[test]
fn measured_gpu_memory_and_bandwidth_reach_the_broker() {
    let mut c = control();
    let dir = std::env::temp_dir().join(format!("lattice-broker-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let capture = dir.join("capture.jsonl");
    c.capture_to(&capture).unwrap();
    let caps = json!({"cpu_cores": 64, "memory_gib": 503.2, "gpu_count": 4, "gpu_model": "NVIDIA H200",
                      "gpu_memory_gib": 139.8, "features": []});
    c.register_agent_with("gpu-1", None, Some(caps)).unwrap();
    assert!(c.probed_bandwidth(20.0));
    assert_eq!(c.ctl.engine.checkpoint_bandwidth(), 20.0);
    assert!(!c.probed_bandwidth(21.0), "within a tenth");
    assert!(!c.probed_bandwidth(f64::NAN));
    assert_eq!(c.ctl.engine.checkpoint_bandwidth(), 20.0);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&capture)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let gpu = lines
        .iter()
        .find(|l| l["type"] == "gpu_memory")
        .expect("gpu_memory captured");
    assert_eq!(gpu["node"], "gpu-1");
    assert!((gpu["gb"].as_f64().unwrap() - 150.1).abs() < 0.1, "{gpu}");
    let bw: Vec<_> = lines.iter().filter(|l| l["type"] == "checkpoint_bandwidth").collect();
    assert_eq!(bw.len(), 1);
    assert_eq!(bw[0]["gbps"], 20.0);
    // The capture replays: the trace parser takes both lines.
    let w = lattice_traces::parse_jsonl("capture.jsonl", &std::fs::read_to_string(&capture).unwrap());
    assert!(w.problems.is_empty(), "{:?}", w.problems);
    std::fs::remove_dir_all(&dir).unwrap();
}
