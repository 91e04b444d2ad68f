//! `checkpoint.port` (`lattice submit --checkpoint=grpc --checkpoint-port=9999`): refused naming the
//! field unless the mechanism is `grpc`, and carried to the node's agent with the launch (which
//! calls the application's callback on that loopback port).

use lattice_control::{Control, SubmitRequest};
use serde_json::json;

fn control() -> Control {
    let inv = lattice_traces::Inventory {
        nodes: vec![lattice_engine::NodeSpec::plain("n1")],
        ..Default::default()
    };
    let mut c = Control::new(&inv, Default::default(), &Default::default(), None).unwrap();
    c.real_agents = true;
    c
}

fn request(checkpoint: serde_json::Value) -> SubmitRequest {
    serde_json::from_value(
        json!({"tenant": "physics", "entrypoint": "serve", "resources": {"nodes": 1},
                                  "lifecycle": {"walltime": "10m"}, "checkpoint": checkpoint}),
    )
    .unwrap()
}

#[test]
fn a_declared_callback_port_reaches_the_agent_with_the_launch() {
    let mut c = control();
    for (bad, why) in [
        (
            json!({"strategy": "auto", "mechanism": "signal", "port": 9999}),
            "`grpc`",
        ),
        (json!({"strategy": "auto", "port": 9999}), "`grpc`"),
        (
            json!({"strategy": "auto", "mechanism": "grpc", "port": 0}),
            "1 to 65535",
        ),
    ] {
        let e = c.submit(request(bad.clone())).unwrap_err();
        assert_eq!(e.field, "checkpoint.port", "{bad}: {}", e.message);
        assert!(e.message.contains(why), "{bad}: {}", e.message);
    }
    assert!(c.list().is_empty(), "nothing queued");
    let id = c
        .submit(request(json!({"strategy": "auto", "mechanism": "grpc", "port": 9999})))
        .unwrap();
    c.register_agent_with("n1", None, None).unwrap();
    c.schedule();
    // The quorum commits the start the pass proposed.
    for a in c.take_actions() {
        if let lattice_control::world::Action::Propose(p) = a {
            c.committed(p.alloc);
        }
    }
    let w = c.work("n1", &[]).unwrap();
    let l = w.launch.iter().find(|l| l.id == id);
    let l = l.unwrap_or_else(|| panic!("launched on n1: {w:?} {:?}", c.list()));
    assert_eq!((l.checkpoint.as_str(), l.checkpoint_port), ("grpc", Some(9999)));
}
